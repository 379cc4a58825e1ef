"""The workbench's figures through a real kernel (jupyter_client, the default sandbox): a second cell on a
kernel subshell while the main shell is busy, the Kernel Usage panel's `usage_request`, and a flood.

Run: `python benchmarks/workbench.py [--rounds N] [--kernel NAME]` (the kernelspec must be installed:
`owsandbox install --user`). Prints one line a figure.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from jupyter_client.manager import KernelManager


def _until_idle(client: Any, msg_id: str, timeout: float = 120) -> list[dict[str, Any]]:
    seen = []
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return seen
        seen.append(msg)


def _send(client: Any, code: str, subshell: str | None = None) -> str:
    msg = client.session.msg("execute_request", {"code": code, "silent": False, "store_history": False,
                                                 "user_expressions": {}, "allow_stdin": False,
                                                 "stop_on_error": False})
    if subshell:
        msg["header"]["subshell_id"] = subshell
    client.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def _control(client: Any, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
    msg = client.session.msg(msg_type, content)
    client.control_channel.send(msg)
    while True:
        reply = client.control_channel.get_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--kernel", default="owsandbox")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        manager = KernelManager(kernel_name=args.kernel)
        manager.start_kernel(cwd=folder)
        client = manager.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            _until_idle(client, _send(client, "echo warm"))
            subshell = _control(client, "create_subshell_request", {})["content"]["subshell_id"]
            _until_idle(client, _send(client, "echo warm", subshell))
            busy = _send(client, "sleep 600")
            second = []
            for _ in range(args.rounds):
                started = time.perf_counter()
                _until_idle(client, _send(client, "echo second", subshell))
                second.append((time.perf_counter() - started) * 1000)
            print(f"second cell on a subshell while the main shell is busy: median {statistics.median(second):.1f} ms,"
                  f" max {max(second):.1f} ms ({args.rounds} rounds)")
            usage = []
            for _ in range(args.rounds):
                started = time.perf_counter()
                reply = _control(client, "usage_request", {})
                usage.append((time.perf_counter() - started) * 1000)
            print(f"usage_request round trip: median {statistics.median(usage):.1f} ms, max {max(usage):.1f} ms; "
                  f"the box holds {reply['content']['kernel_memory'] / 2**20:.1f} MiB in "
                  f"{reply['content']['sandbox']['processes']} processes")
            _control(client, "interrupt_request", {})
            _until_idle(client, busy)
            started = time.perf_counter()
            seen = _until_idle(client, _send(client, "seq 1 1000000"))
            elapsed = time.perf_counter() - started
            streamed = sum(len(m["content"]["text"]) for m in seen if m["msg_type"] == "stream")
            tails = [m for m in seen if m["msg_type"] in ("display_data", "update_display_data")
                     and m["content"].get("metadata", {}).get("owsandbox", {}).get("flood")]
            print(f"seq 1 1000000: {elapsed:.2f} s to the end note; {streamed / 1e6:.2f} MB streamed "
                  f"({streamed / elapsed / 1e6:.2f} MB/s), {len(tails)} live-tail frames")
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=False)


if __name__ == "__main__":
    main()
