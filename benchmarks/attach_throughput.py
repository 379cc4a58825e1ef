"""%attach throughput through a real kernel: how long the kernel takes to take in a flood of small records.

A program started with `%attach` writes --records small JSON records (about 83 bytes each) as fast as
it can; the kernel (the `local` provider, from a kernelspec in a temporary folder) decodes each, files
it in the program's conversation and moves its cursor. Measured, for each of --rounds rounds: the
seconds from the `%attach` cell to the view saying the program ended, the records a second, and the
CPU seconds the kernel process and the sandbox daemon spent meanwhile (from /proc: the kernel's time
is the cost of a record; the program itself runs in another process).

Run: `python benchmarks/attach_throughput.py [--records N] [--rounds N]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from attach_jsonrpc import Kernel  # this folder, first on sys.path when a script here runs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults.test_floods import PRODUCER  # noqa: E402 - the flood test's own program


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def until_ended(kernel: Kernel, timeout: float) -> str:
    """The attach view's text once its header says the program ended."""
    deadline = time.monotonic() + timeout
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["msg_type"] in ("display_data", "update_display_data"):
            text = msg["content"]["data"].get("text/plain", "")
            if "[ended" in text.split("\n", 1)[0]:
                return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="owsandbox-bench-"))
    producer = folder / "producer.py"
    producer.write_text(PRODUCER)
    kernel = Kernel(folder)
    try:
        _, outputs = kernel.run("echo $PPID")
        pid: int = kernel.km.provisioner.process.pid  # type: ignore[union-attr]
        daemon = int("".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream").split()[-1])
        rows = []
        for round_ in range(1, args.rounds + 1):
            before = cpu_seconds(pid), cpu_seconds(daemon)
            started = time.monotonic()
            kernel.run(f"%attach --name flood{round_} -- {sys.executable} {producer} {args.records}")
            header = until_ended(kernel, 600).split("\n", 1)[0]
            seconds = time.monotonic() - started
            if f"{args.records:,} records" not in header:
                raise SystemExit(f"round {round_}: the view did not count {args.records:,} records: {header}")
            kernel_cpu, daemon_cpu = cpu_seconds(pid) - before[0], cpu_seconds(daemon) - before[1]
            rows.append((seconds, kernel_cpu, daemon_cpu))
            print(f"round {round_}: {seconds:.1f} s, {args.records / seconds:,.0f} records/s; CPU: kernel "
                  f"{kernel_cpu:.1f} s ({kernel_cpu / args.records * 1e6:.1f} µs a record), daemon {daemon_cpu:.1f} s")
        seconds, kernel_cpu = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
        print(f"median of {len(rows)}: {args.records / seconds:,.0f} records/s, "
              f"the kernel's CPU {kernel_cpu / args.records * 1e6:.1f} µs a record")
    finally:
        kernel.close()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
