"""The workspace guard's cost at sandbox start: the scan alone, and bubblewrap start to first result,
in an empty workspace and in one of N folders (default 10,000) with a few environments and
repositories in it.

Run: `python benchmarks/workspace_scan.py [--folders N] [--rounds R]` from the repository root.
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


def make_tree(root: Path, folders: int) -> None:
    """`folders` folders, 20 to a parent, three levels deep, with environments and repositories."""
    made = 0
    for a in range(10_000):
        for b in range(20):
            for c in range(50):
                if made >= folders:
                    return
                path = root / f"p{a}" / f"q{b}" / f"r{c}"
                path.mkdir(parents=True)
                (path / "data.txt").write_text("x")
                made += 1
                if made % 1000 == 0:
                    (path / ".venv").mkdir()
                    (path / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
                    subprocess.run(["git", "init", "-q", str(path / "repo")], check=True)


def first_result(folder: str) -> float:
    started = time.perf_counter()
    workspace = RunnerWorkspace(BwrapProvider(folder), folder)
    try:
        assert workspace.executor.run("true")["exit_code"] == 0
        return time.perf_counter() - started
    finally:
        workspace.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--folders", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="owsbx-scan-"))
    try:
        empty, big = base / "empty", base / "big"
        empty.mkdir()
        big.mkdir()
        make_tree(big, args.folders)
        for name, folder in (("empty", empty), (f"{args.folders} folders", big)):
            scans = []
            for _ in range(args.rounds):
                started = time.perf_counter()
                guard = guard_workspace(str(folder), os.path.expanduser("~"))
                scans.append(time.perf_counter() - started)
            line = (f"{name}: scan {statistics.median(scans) * 1000:.0f} ms median ({guard.scanned_folders} folders "
                    f"read, {len(guard.read_only)} read-only, {len(guard.unscanned)} not scanned)")
            if bwrap_problem() is None:
                starts = [first_result(str(folder)) for _ in range(args.rounds)]
                line += f"; bubblewrap start to first result {statistics.median(starts) * 1000:.0f} ms median"
            print(line)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
