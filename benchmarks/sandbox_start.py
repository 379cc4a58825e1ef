"""Sandbox start to first cell result, per provider: local, bwrap, and exec over ssh on loopback.

Each round creates the sandbox (daemon started, zipapp copied in where needed), connects the
runner client and runs `true`; the figure is the time from the start to that first result.
The ssh rounds use a throwaway sshd on 127.0.0.1 (needs openssh-server).

Run: `python benchmarks/sandbox_start.py [--rounds N]` from the repository root.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from owsandbox.host.providers import BwrapProvider, ExecProvider, LocalProvider, bwrap_problem  # noqa: E402
from owsandbox.host.workspace import RunnerWorkspace  # noqa: E402
from tests.sshd_server import loopback_sshd  # noqa: E402


def first_result(make_provider, folder: str) -> float:
    started = time.perf_counter()
    workspace = RunnerWorkspace(make_provider(), folder)
    try:
        assert workspace.executor.run("true")["exit_code"] == 0
        return time.perf_counter() - started
    finally:
        workspace.close()


def round_trip(make_provider, folder: str, count: int = 200) -> float:
    """The median of `count` round trips of `true` on a started sandbox."""
    workspace = RunnerWorkspace(make_provider(), folder)
    try:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            workspace.executor.run("true")
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        workspace.close()


def report(name: str, times: list[float]) -> None:
    times.sort()
    print(f"{name}: start to first result median {statistics.median(times):.3f} s, max {times[-1]:.3f} s "
          f"({len(times)} rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report("local", [first_result(lambda: LocalProvider(cwd=tmp), tmp) for _ in range(args.rounds)])
        if bwrap_problem() is None:
            report("bwrap", [first_result(lambda: BwrapProvider(cwd=tmp), tmp) for _ in range(args.rounds)])
            report("bwrap, network on (pasta)", [first_result(lambda: BwrapProvider(cwd=tmp, network=True), tmp)
                                                for _ in range(args.rounds)])
            print(f"bwrap: round trip of `true` once started, median of 200: "
                  f"{round_trip(lambda: BwrapProvider(cwd=tmp), tmp) * 1000:.2f} ms")
        else:
            print(f"bwrap: not measured ({bwrap_problem()})")
        with loopback_sshd(Path(tempfile.mkdtemp(dir=tmp))) as prefix:
            make = lambda: ExecProvider(prefix=prefix, box_cwd=tmp)  # noqa: E731
            report("ssh (exec)", [first_result(make, tmp) for _ in range(args.rounds)])


if __name__ == "__main__":
    main()
