"""A cell's terminal through a real kernel: how soon a prompt becomes an input request, how soon an
unattended read gets end-of-input, and in what order stdout and stderr lines reach the notebook.

* prompts: execute_request (allow_stdin) → input_request, for `read -p`, `read </dev/tty`, Python's
  getpass and ssh-keygen (its first passphrase prompt), answered at once; median and p90 of --runs;
* unattended getpass: execute_request (no stdin) → the "stdin is not available" note and → the reply,
  next to `python3 -c pass` alone (the interpreter's own start);
* order: 200 steps writing a line to stdout then one to stderr, with 5 ms, 1 ms or nothing between
  the lines, stderr kept apart and merged (`%stderr merge`): how many steps show their two lines
  together and in order, how many lines show out of place (the fewest lines that would have to move
  to restore the written order), how many runs of --order-runs are wholly in order, and how many
  lines are cut in two by the other stream;
* whole lines: `ls` failing (it writes its message in pieces) then an `echo`, 200 times per cell,
  --torn-runs cells: lines cut in two.

Run: `python benchmarks/terminal_bench.py [--provider local|bwrap|''] [--runs 20] [--order-runs 5]`.
Prints one line a figure. The kernel imports owsandbox as this interpreter does (set PYTHONPATH to
measure another tree).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

GETPASS = "python3 -c 'import getpass; print(len(getpass.getpass(\"Secret: \")))'"
PROMPTS = {
    "read -p": ("read -p 'Name? ' n; echo \"$n\"", 1),
    "read </dev/tty": ("read n </dev/tty; echo \"$n\"", 1),
    "getpass": (GETPASS, 1),
    "ssh-keygen": ("rm -f bench-key bench-key.pub; ssh-keygen -q -t ed25519 -f bench-key", 2),
}
GAPS = {"5 ms": "sleep 0.005", "1 ms": "sleep 0.001", "back to back": ":"}


class Kernel:
    def __init__(self, root: Path, provider: str) -> None:
        spec = root / "share" / "jupyter" / "kernels" / "owsandbox-terminal-bench"
        spec.mkdir(parents=True)
        env = {"OWSANDBOX_PROVIDER": provider} if provider else {}
        spec.joinpath("kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "owsandbox.kernel", "-f", "{connection_file}"],
            "display_name": "bench", "language": "bash", "interrupt_mode": "message", "env": env}))
        os.environ["JUPYTER_PATH"] = str(root / "share" / "jupyter")
        work = root / "work"
        work.mkdir()
        kernel_env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
        self.km = KernelManager(kernel_name="owsandbox-terminal-bench")
        self.km.start_kernel(cwd=str(work), env=kernel_env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.run("true")

    def send(self, code: str, allow_stdin: bool = False) -> tuple[str, float]:
        msg = self.kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": False,
                                                      "user_expressions": {}, "allow_stdin": allow_stdin,
                                                      "stop_on_error": False})
        sent = time.perf_counter()
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"], sent

    def outputs(self, msg_id: str, timeout: float = 120) -> list[tuple[float, dict[str, Any]]]:
        """The cell's iopub messages with their arrival times, until idle; then its reply."""
        found = []
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            found.append((time.perf_counter(), msg))
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                found.append((time.perf_counter(), reply))
                return found

    def run(self, code: str) -> list[tuple[float, dict[str, Any]]]:
        return self.outputs(self.send(code)[0])

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def streams(found: list[tuple[float, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [(m["content"]["name"], m["content"]["text"]) for _, m in found if m["msg_type"] == "stream"]


def percentiles(values: list[float]) -> str:
    values = sorted(values)
    return f"median {statistics.median(values):.1f} ms, p90 {values[int(len(values) * 0.9)]:.1f} ms"


def measure_prompt(kernel: Kernel, code: str, prompts: int, runs: int) -> str:
    times = []
    for _ in range(runs):
        msg_id, sent = kernel.send(code, allow_stdin=True)
        try:
            for index in range(prompts):
                kernel.kc.get_stdin_msg(timeout=10)
                if index == 0:
                    times.append((time.perf_counter() - sent) * 1000)
                kernel.kc.input("bench answer")
        except queue.Empty:
            kernel.km.interrupt_kernel()
            kernel.outputs(msg_id)
            return "no input_request within 10 s"
        kernel.outputs(msg_id)
    return percentiles(times)


def measure_unattended(kernel: Kernel, runs: int) -> str:
    noted, replied, alone, errors = [], [], [], set()
    for _ in range(runs):
        msg_id, sent = kernel.send(GETPASS)
        found = kernel.outputs(msg_id, timeout=60)
        note = next((at for at, m in found if m["msg_type"] == "display_data"
                     and "stdin is not available" in m["content"]["data"].get("text/plain", "")), None)
        if note is not None:
            noted.append((note - sent) * 1000)
        replied.append((found[-1][0] - sent) * 1000)
        errors.add(found[-1][1]["content"].get("ename", "ok"))
        msg_id, sent = kernel.send("python3 -c pass")
        alone.append((kernel.outputs(msg_id)[-1][0] - sent) * 1000)
    note_text = percentiles(noted) if noted else "no note"
    return (f"request → note {note_text}; → reply {percentiles(replied)} (ends as {', '.join(sorted(errors))}); "
            f"`python3 -c pass` alone: {percentiles(alone)}")


def misplaced(lines: list[tuple[str, str]], expected: list[tuple[str, str]]) -> int:
    """The fewest lines that would have to move to restore the written order (lines minus the longest
    subsequence already in order)."""
    rank = {line: index for index, line in enumerate(expected)}
    tails: list[int] = []
    for line in lines:
        position = rank.get(line)
        if position is None:
            continue
        at = bisect.bisect_left(tails, position)
        tails[at:at + 1] = [position]
    return len(expected) - len(tails)


def measure_order(kernel: Kernel, gap: str, merged: bool, runs: int, steps: int = 200) -> str:
    code = f'for i in $(seq {steps}); do echo "out $i"; {gap}; echo "err $i" >&2; {gap}; done'
    if merged:
        code = "%stderr merge\n" + code
    expected = [(stream, f"{word} {i}") for i in range(1, steps + 1) for stream, word in (("stdout", "out"),
                                                                                         ("stderr", "err"))]
    together = moved = whole = cut = 0
    for _ in range(runs):
        shown = streams(kernel.run(code))
        if merged:
            shown = [(("stdout", "stderr")[text.startswith("err")], text) for _, text in shown
                     if not text.startswith("shell 'main'")]
        cut += sum(1 for (name, text), (after, _) in zip(shown, shown[1:], strict=False)
                   if name != after and not text.endswith("\n"))
        lines = [(name, line) for name, text in shown for line in text.splitlines()]
        if merged:
            lines = [(("stdout", "stderr")[line.startswith("err")], line) for _, line in lines]
        together += sum(1 for i in range(len(lines) - 1)
                        if lines[i][0] == "stdout" and lines[i + 1] == ("stderr", "err " + lines[i][1][4:]))
        moved += misplaced(lines, expected)
        whole += lines == expected
    if merged:
        kernel.run("%stderr apart")
    return (f"steps shown together and in order {together} of {steps * runs}; lines out of place "
            f"{moved} of {2 * steps * runs}; runs wholly in order {whole} of {runs}; lines cut {cut}")


def measure_torn(kernel: Kernel, runs: int) -> str:
    cut = total = 0
    for _ in range(runs):
        shown = streams(kernel.run("for i in $(seq 200); do ls /no-such-$i; echo out$i; done"))
        cut += sum(1 for (name, text), (after, _) in zip(shown, shown[1:], strict=False)
                   if name != after and not text.endswith("\n"))
        total += 200
    return f"lines cut in two: {cut} of {total} stderr lines"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--provider", default="local", help="the kernel's provider (default local; '' = default)")
    parser.add_argument("--runs", type=int, default=20, help="prompts measured per kind")
    parser.add_argument("--order-runs", type=int, default=5, help="runs of 200 steps per gap and mode")
    parser.add_argument("--torn-runs", type=int, default=5, help="cells of 200 failing ls")
    parser.add_argument("--parts", default="prompts,unattended,order,torn", help="which figures (comma-separated)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ows-terminal-bench-"))
    kernel = Kernel(root, args.provider)
    try:
        parts = args.parts.split(",")
        print(f"provider: {args.provider or 'default'}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")
        for name, (code, prompts) in PROMPTS.items():
            if "prompts" not in parts or name == "ssh-keygen" and not shutil.which("ssh-keygen"):
                continue
            print(f"prompt {name}: request → input_request {measure_prompt(kernel, code, prompts, args.runs)}")
        if "unattended" in parts:
            print(f"unattended getpass: {measure_unattended(kernel, max(args.runs // 2, 3))}")
        for merged in (False, True) if "order" in parts else ():
            for gap_name, gap in GAPS.items():
                mode = "merged" if merged else "apart"
                print(f"order, lines {gap_name}, stderr {mode}: {measure_order(kernel, gap, merged, args.order_runs)}")
        if "torn" in parts:
            print(f"whole lines, ls failing then echo: {measure_torn(kernel, args.torn_runs)}")
    finally:
        kernel.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
