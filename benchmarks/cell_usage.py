"""What measuring a cell's peak memory and CPU seconds costs (box/shell/cellusage.py).

Two figures, on the box's own `Shell` (a real bash, no sandbox around it, so the box's cost alone shows):

* **meter**: `CellMeter(bash pid)` made and finished, as `Shell.run` and `_finish` do for every command,
  with the shell's tree holding `--jobs` background processes (a cell's jobs are read too): the time
  the two readings take, which is what a short cell pays (no sample is due before it ends).
* **round trip**: `--cells` trivial commands (`true`) run one after another on a shell, each from
  `run` to its result, with the meter (as shipped) and with it replaced by nothing; the median and the
  95th percentile of each.
* **sampling**: the CPU the samples take while a long command runs (`sleep`), as the box
  process's own CPU time over the command's, with and without the meter.

Run: `python benchmarks/cell_usage.py [--cells N] [--jobs N]`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import threading
import time
from typing import Any

from owsandbox.box.shell import bash as bash_module
from owsandbox.box.shell.bash import Shell
from owsandbox.box.shell.cellusage import CellMeter


class _NoMeter:
    """Stands in for the meter to time the shell without it."""

    def __init__(self, _root: int, now: float) -> None:
        self._due = now + 3600

    def due(self) -> float:
        return self._due

    def sample_if_due(self, now: float) -> None:
        pass

    def finish(self) -> dict[str, Any]:
        return {}


def _run(shell: Shell, command: str) -> dict[str, Any]:
    done = threading.Event()
    results: list[dict[str, Any]] = []
    shell.run(command, lambda result: (results.append(result), done.set()))
    if not done.wait(30):
        raise RuntimeError(f"{command!r} did not end")
    return results[0]


def _round_trips(shell: Shell, cells: int) -> list[float]:
    times = []
    for _ in range(cells):
        started = time.perf_counter()
        _run(shell, "true")
        times.append((time.perf_counter() - started) * 1000)
    return times


def _p95(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.95) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=400)
    parser.add_argument("--jobs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        shell = Shell("bench", folder)
        jobs = []
        try:
            for _ in range(args.jobs):
                _run(shell, "sleep 600 &")
            jobs = [int(pid) for pid in open(f"/proc/{shell.pid}/task/{shell.pid}/children").read().split()]
            meter_ms = []
            for _ in range(args.cells):
                started = time.perf_counter()
                CellMeter(shell.pid, time.monotonic()).finish()
                meter_ms.append((time.perf_counter() - started) * 1000)
            print(f"meter (make + finish, tree of {len(jobs) + 1}): median {statistics.median(meter_ms):.3f} ms, "
                  f"p95 {_p95(meter_ms):.3f} ms")
            _round_trips(shell, 20)  # warm
            rounds = {}
            for label in ("with the meter", "without", "with the meter again"):
                bash_module.CellMeter = _NoMeter if label == "without" else CellMeter  # type: ignore[misc]
                rounds[label] = _round_trips(shell, args.cells)
            for label, times in rounds.items():
                print(f"`true` round trip {label}: median {statistics.median(times):.3f} ms, p95 {_p95(times):.3f} ms")
            for label, meter in (("with the meter", CellMeter), ("without", _NoMeter)):
                bash_module.CellMeter = meter  # type: ignore[misc]
                cpu = time.process_time()
                started = time.perf_counter()
                result = _run(shell, "sleep 3")
                spent = time.process_time() - cpu
                wall = time.perf_counter() - started
                print(f"`sleep 3` {label}: this process's CPU {spent * 1000:.1f} ms over {wall:.2f} s "
                      f"({spent / wall * 100:.2f} % of a CPU); usage {result.get('usage')}")
        finally:
            bash_module.CellMeter = CellMeter  # type: ignore[misc]
            for pid in jobs:
                subprocess.run(["kill", str(pid)], check=False)
            shell.close()


if __name__ == "__main__":
    main()
