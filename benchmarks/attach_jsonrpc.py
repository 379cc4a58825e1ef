"""%attach with a JSON-RPC program: how fast an answer shows, and what a long conversation costs.

Through a real kernel (the `local` provider, from a kernelspec in a temporary folder) and a small
MCP-like server in stdlib Python:

* `%send` of a trivial `tools/list` until its answer's display reaches the client (ms, median and
  95th percentile of --rounds);
* the timeline with --records records (notifications and answered calls, as a busy server writes
  them): the kernel's resident memory before and after, and what one update of the view costs
  (`attach_view.bundle` over that conversation, in this process, the same code the kernel runs);
* `%records --save` of that conversation: the cell's time, and the entries it wrote (the lanes are
  bounded, conversation.py's KEEP_*), plus `saved_text` in process of what the lanes keep and of a
  conversation whose lanes keep all --records.

Run: `python benchmarks/attach_jsonrpc.py [--rounds N] [--records N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from jupyter_client import KernelManager

from owsandbox.kernel.attach.conversation import Conversation
from owsandbox.kernel.attach.replay import saved_text
from owsandbox.kernel.attach.timeline import timeline
from owsandbox.kernelspec import kernel_argv

SERVER = r'''
import json, sys
def emit(r):
    sys.stdout.write(json.dumps(r) + "\n")
for line in sys.stdin:
    msg = json.loads(line)
    rid, method = msg.get("id"), msg.get("method")
    if method == "tools/list":
        emit({"jsonrpc": "2.0", "id": rid, "result": {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}})
    elif method == "flood":  # n records: notifications, and answers to calls the server makes up
        n = msg["params"]["n"]
        for i in range(n):
            emit({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "info", "data": f"log line {i} " + "x" * 60}})
        emit({"jsonrpc": "2.0", "id": rid, "result": {"sent": n}})
    elif rid is not None:
        emit({"jsonrpc": "2.0", "id": rid, "result": {}})
    sys.stdout.flush()
'''


class Kernel:
    def __init__(self, folder: Path) -> None:
        spec = folder / "kernels" / "owsandbox-bench"
        spec.mkdir(parents=True)
        spec.joinpath("kernel.json").write_text(json.dumps({
            "argv": kernel_argv(sys.executable), "display_name": "bench", "language": "bash",
            "interrupt_mode": "message", "env": {"OWSANDBOX_PROVIDER": "local"}}))
        os.environ["JUPYTER_PATH"] = str(folder)
        self.km = KernelManager(kernel_name="owsandbox-bench")
        self.km.start_kernel(cwd=str(folder))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, until: Any = None, timeout: float = 120) -> tuple[float, list[dict[str, Any]]]:
        """Seconds from sending `code` until `until(msg)` (default: the cell is idle), and its outputs."""
        started = time.perf_counter()
        msg_id = self.kc.execute(code)
        outputs: list[dict[str, Any]] = []
        seen = None
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                if until is not None and seen is None and until(msg):
                    seen = time.perf_counter() - started
                continue
            if until is not None and seen is None and until(msg):
                seen = time.perf_counter() - started
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            outputs.append(msg)
        elapsed = time.perf_counter() - started
        errors = [m for m in outputs if m["msg_type"] == "error"]
        if errors:
            raise SystemExit(f"{code[:60]}: {errors[0]['content']['ename']}: {errors[0]['content']['evalue']}")
        return (seen if seen is not None else elapsed), outputs

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.km.provisioner.process.pid}/status").read_text()  # type: ignore[union-attr]
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def answer_shown(msg: dict[str, Any]) -> bool:
    return msg["msg_type"] == "display_data" and "application/json" in msg["content"]["data"]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def in_process(records: int, keep_all: bool = False) -> tuple[float, float, float, int]:
    """Feeding `records` records to a Conversation (µs each), one view update over it (ms, median of
    20), and saved_text of it (ms), with the entries saved. `keep_all`: its lanes hold every record
    (the kernel's keep KEEP_* of each), for what a save of all of them would cost."""
    talk = Conversation()
    if keep_all:
        for lane in ("records", "calls", "notifications"):
            setattr(talk, lane, deque(getattr(talk, lane), maxlen=None))
    started = time.perf_counter()
    for i in range(records):
        if i % 10 == 0:
            talk.sent({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "echo"}}, time.time())
            talk.received({"jsonrpc": "2.0", "id": i, "result": {"content": []}}, time.time(), i)
        else:
            talk.received({"jsonrpc": "2.0", "method": "notifications/message",
                           "params": {"level": "info", "data": f"log line {i} " + "x" * 60}}, time.time(), i)
    feed = (time.perf_counter() - started) / records * 1e6
    frames = []
    for _ in range(20):
        started = time.perf_counter()
        "\n".join(timeline(talk, 1, time.time()))
        frames.append((time.perf_counter() - started) * 1000)
    started = time.perf_counter()
    _, count = saved_text(talk, {"program": "bench", "number": 1, "command": "", "cwd": "", "session": ""})
    save = (time.perf_counter() - started) * 1000
    return feed, statistics.median(frames), save, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--records", type=int, default=10_000)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="attach-jsonrpc-bench-"))
    kernel = Kernel(folder)
    try:
        (folder / "server.py").write_text(SERVER)
        kernel.run(f"%attach --name bench -- {sys.executable} {folder / 'server.py'}")
        times = []
        for i in range(args.rounds + 3):
            seconds, _ = kernel.run(f'%send {{"jsonrpc": "2.0", "id": {100 + i}, "method": "tools/list"}}',
                                    until=answer_shown)
            times.append(seconds * 1000)
        times = times[3:]  # the first rounds warm up
        print(f"%send tools/list -> answer shown: median {statistics.median(times):.1f} ms, "
              f"p95 {percentile(times, 0.95):.1f} ms ({args.rounds} rounds)")
        before = kernel.rss_kib()
        flood, _ = kernel.run(f'%send --timeout 120 {{"jsonrpc": "2.0", "id": 1, "method": "flood", '
                              f'"params": {{"n": {args.records}}}}}')
        after = kernel.rss_kib()
        print(f"{args.records:,} records into the timeline: the cell took {flood * 1000:.0f} ms; kernel RSS "
              f"{before / 1024:.1f} MiB before, {after / 1024:.1f} MiB after (+{(after - before) / 1024:.1f} MiB)")
        save, outputs = kernel.run("%records --save flood.jsonl")
        said = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream").strip()
        size = (folder / "flood.jsonl").stat().st_size
        print(f"%records --save after the flood: {save * 1000:.0f} ms, {size / 1024:.0f} KiB ({said[:60]}…)")
        kernel.run("%attach --kill")
    finally:
        kernel.close()
        shutil.rmtree(folder, ignore_errors=True)
    feed, frame, saved, count = in_process(args.records)
    print(f"in process, {args.records:,} records: {feed:.1f} µs each to feed, one view update {frame:.2f} ms "
          f"(median of 20), saved_text {saved:.1f} ms for the {count:,} entries kept")
    feed, frame, saved, count = in_process(args.records, keep_all=True)
    print(f"in process, every record kept: {feed:.1f} µs each to feed, one view update {frame:.2f} ms, "
          f"saved_text {saved:.1f} ms for {count:,} entries")


if __name__ == "__main__":
    main()
