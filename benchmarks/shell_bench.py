"""`owsandbox shell` speed: start to first prompt, and how long a key takes to echo.

One kernel as a user gets it (no provider named: bubblewrap where it works) is started with a connection
file named as a Jupyter server names it. Then, through a pty as a person's terminal would be:

* **start → prompt**: `owsandbox shell --existing CONNECTION_FILE` is started `--starts` times, and
  the time from the start of the process to its first prompt is measured (finding the sandbox, a new
  PTY session, the WebSocket, bash with its rc file). Each shell is left with `exit`.
* **keystroke echo**: in one shell, `--keys` single keys are typed one after another, each timed from
  its write to the pty until the box's terminal has echoed it back through the whole path (the client's
  WebSocket, the box's endpoint, the box's terminal and readline, and back).

For comparison, the same echo is measured on a plain `bash -i` in a pty on this machine.

Run: `python benchmarks/shell_bench.py [--starts N] [--keys N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pexpect
from jupyter_client.manager import KernelManager

SHELL = [sys.executable, "-c", "import sys; from owsandbox.cli import main; sys.exit(main())", "shell"]
PROMPT = "OWS-READY> "


def first_prompt(connection_file: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    child = pexpect.spawn(SHELL[0], [*SHELL[1:], "--existing", connection_file, "--quiet"], env=env,
                          encoding="utf-8", timeout=30, dimensions=(24, 200))
    try:
        child.expect(r"[#$] ")
        seconds = time.perf_counter() - started
        child.sendline("exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    return seconds


def echo_times(child: pexpect.spawn, keys: int) -> list[float]:
    """Seconds from writing each key to seeing it echoed."""
    child.sendline("PS1='OWS''-READY> '")
    child.expect(PROMPT)
    child.delaybeforesend = None  # pexpect waits 50 ms before each write unless told not to
    times = []
    for n in range(keys):
        key = "ab"[n % 2]
        started = time.perf_counter()
        child.send(key)
        child.expect_exact(key)
        times.append(time.perf_counter() - started)
        if n % 50 == 49:
            child.sendcontrol("u")  # a fresh line: no redisplay of a long one
            time.sleep(0.05)
            child.read_nonblocking(65536, timeout=0.2)
    return times


def sandbox_echo(connection_file: str, env: dict[str, str], keys: int) -> list[float]:
    child = pexpect.spawn(SHELL[0], [*SHELL[1:], "--existing", connection_file, "--quiet"], env=env,
                          encoding="utf-8", timeout=30, dimensions=(24, 200))
    try:
        child.expect(r"[#$] ")
        return echo_times(child, keys)
    finally:
        child.sendcontrol("u")
        child.sendline("exit")
        child.expect(pexpect.EOF)
        child.close(force=True)


def local_echo(keys: int) -> list[float]:
    child = pexpect.spawn("bash", ["--norc", "--noprofile", "-i"], encoding="utf-8", timeout=30,
                          dimensions=(24, 200), env={**os.environ, "TERM": "xterm-256color"})
    try:
        child.expect(r"[#$] ")
        return echo_times(child, keys)
    finally:
        child.close(force=True)


def describe(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p90 = ms[int(len(ms) * 0.9) - 1] if len(ms) >= 10 else ms[-1]
    return (f"{name}: median {statistics.median(ms):.1f} ms, min {ms[0]:.1f}, p90 {p90:.1f}, max {ms[-1]:.1f} "
            f"({len(ms)} samples)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--keys", type=int, default=100)
    args = parser.parse_args()
    runtime = Path(tempfile.mkdtemp(prefix="ows-bench-rt-"))
    workspace = Path(tempfile.mkdtemp(prefix="ows-bench-ws-"))
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "TERM": "xterm-256color"}
    km = KernelManager(kernel_name="owsandbox")
    km.connection_file = str(runtime / f"kernel-{uuid.uuid4()}.json")
    km.start_kernel(cwd=str(workspace), env=env)
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive("echo ready", timeout=60, output_hook=lambda _msg: None)
        assert reply["content"]["status"] == "ok", reply
        first_prompt(km.connection_file, env)  # warm: the zipapp, the page cache
        starts = [first_prompt(km.connection_file, env) for _ in range(args.starts)]
        print(describe("owsandbox shell start → first prompt", starts))
        print(describe("keystroke echo through owsandbox shell", sandbox_echo(km.connection_file, env, args.keys)))
        print(describe("keystroke echo, plain bash -i in a pty here", local_echo(args.keys)))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
