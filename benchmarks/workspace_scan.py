"""The workspace guard's cost at sandbox start, with its pins: the scan alone, bubblewrap start to first
result, and a cell's round trip afterwards, in an empty workspace and in one of N folders (default
10,000) holding 20 repositories, each with a Python environment two levels down (`rNN/proj/.venv`),
so that `rNN`, `rNN/proj` and `rNN/.git` are pinned.

Run: `python benchmarks/workspace_scan.py [--folders N] [--repositories R] [--rounds K]` from the
repository root.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from owsandbox.host.isolation.guard import guard_workspace  # noqa: E402
from owsandbox.host.providers import BwrapProvider, bwrap_problem  # noqa: E402
from owsandbox.host.workspace import RunnerWorkspace  # noqa: E402


def make_tree(root: Path, folders: int, repositories: int) -> None:
    """`folders` folders in all: `repositories` repositories with an environment two levels down, and
    the rest as data folders, 20 to a parent, three levels deep."""
    made = 0
    for number in range(repositories):
        repo = root / "repos" / f"r{number:02}"
        environment = repo / "proj" / ".venv"
        (environment / "bin").mkdir(parents=True)
        (environment / "lib").mkdir()
        (environment / "pyvenv.cfg").write_text("home = /usr/bin\n")
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        made += 5  # the repository, proj, .venv, bin, lib (.git's own folders are not scanned)
    for a in range(folders):
        for b in range(20):
            for c in range(50):
                if made >= folders:
                    return
                path = root / f"p{a}" / f"q{b}" / f"r{c}"
                path.mkdir(parents=True)
                (path / "data.txt").write_text("x")
                made += 1


def start_and_round_trips(folder: str, trips: int) -> tuple[float, float]:
    """(seconds from a new provider to the first result, median seconds of a `true` afterwards)."""
    started = time.perf_counter()
    workspace = RunnerWorkspace(BwrapProvider(folder), folder)
    try:
        assert workspace.executor.run("true")["exit_code"] == 0
        first = time.perf_counter() - started
        times = []
        for _ in range(trips):
            began = time.perf_counter()
            workspace.executor.run("true")
            times.append(time.perf_counter() - began)
        return first, statistics.median(times)
    finally:
        workspace.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--folders", type=int, default=10_000)
    parser.add_argument("--repositories", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trips", type=int, default=20, help="cell round trips timed after each start")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="owsbx-scan-"))
    try:
        empty, big = base / "empty", base / "big"
        empty.mkdir()
        big.mkdir()
        make_tree(big, args.folders, args.repositories)
        for name, folder in (("empty", empty), (f"{args.folders:,} folders, {args.repositories} repositories", big)):
            scans = []
            for _ in range(args.rounds):
                started = time.perf_counter()
                guard = guard_workspace(str(folder), os.path.realpath(os.path.expanduser("~")))
                scans.append(time.perf_counter() - started)
            line = (f"{name}: scan {statistics.median(scans) * 1000:.0f} ms median ({guard.scanned_folders:,} folders "
                    f"read, {len(guard.read_only)} read-only, {len(getattr(guard, 'pinned', []))} pinned, "
                    f"{len(guard.unscanned)} not scanned)")
            if bwrap_problem() is None:
                runs = [start_and_round_trips(str(folder), args.trips) for _ in range(args.rounds)]
                line += (f"; bubblewrap start to first result {statistics.median(r[0] for r in runs) * 1000:.0f} ms "
                         f"median; cell round trip {statistics.median(r[1] for r in runs) * 1000:.1f} ms median")
            print(line, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
