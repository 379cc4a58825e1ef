"""The cost of the git check at each cell's end (gitquarantine.py): on an empty workspace and on one of
N folders (default 10,000) with R repositories (default 20), when nothing changed (every cell after the
first) and when one cell made a repository with a config to sanitise. And a cell's round trip through
bubblewrap, with the check and without it.

Run: `python benchmarks/git_quarantine.py [--folders N] [--repositories R] [--rounds K]` from the
repository root.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from owsandbox.host.isolation.gitquarantine import GitQuarantine, Protection  # noqa: E402
from owsandbox.host.isolation.guard import guard_workspace  # noqa: E402
from owsandbox.host.providers import BwrapProvider, bwrap_problem  # noqa: E402
from owsandbox.host.workspace import RunnerWorkspace  # noqa: E402


def make_tree(root: Path, folders: int, repositories: int) -> None:
    """`folders` folders, 20 to a parent, three levels deep, a file in each; `repositories` of them git
    repositories with a commit."""
    every = max(1, folders // max(1, repositories))
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
                if made % every == 0 and made // every <= repositories:
                    subprocess.run(["git", "init", "-q", str(path)], check=True)
                    subprocess.run(["git", "-C", str(path), "-c", "user.name=a", "-c", "user.email=a@b", "commit",
                                    "-q", "--allow-empty", "-m", "x"], check=True)


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms"


def checks(folder: Path, rounds: int) -> str:
    time.sleep(0.2)  # the tree is older than the box's start
    quarantine = GitQuarantine(str(folder), Protection.at_start(guard_workspace(str(folder), "/nonexistent")))
    unchanged, report = [], None
    for _ in range(rounds):
        report = quarantine.check()
        unchanged.append(report.seconds)
    acting = []
    for n in range(rounds):
        repo = folder / f"made-{n}"
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run(["git", "-C", str(repo), "config", "core.fsmonitor", "true"], check=True)
        started = time.perf_counter()
        moved = quarantine.check()
        acting.append(time.perf_counter() - started)
        assert moved.repositories, "the check did not act"
    assert report is not None
    return (f"check, nothing changed {median_ms(unchanged)} ({report.folders} folders read, {report.git_dirs} git "
            f"folders); check that moves a new repository's config {median_ms(acting)}")


def round_trips(folder: Path, rounds: int) -> str:
    workspace = RunnerWorkspace(BwrapProvider(str(folder)), str(folder))
    try:
        plain, checked = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            assert workspace.executor.run("true")["exit_code"] == 0
            plain.append(time.perf_counter() - started)
            started = time.perf_counter()
            assert workspace.executor.run("true")["exit_code"] == 0
            workspace.provider.after_cell()
            checked.append(time.perf_counter() - started)
        return f"bubblewrap cell round trip {median_ms(plain)}, with the check {median_ms(checked)}"
    finally:
        workspace.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--folders", type=int, default=10_000)
    parser.add_argument("--repositories", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="owsbx-gitq-"))
    try:
        empty, big = base / "empty", base / "big"
        empty.mkdir()
        big.mkdir()
        make_tree(big, args.folders, args.repositories)
        for name, folder in (("empty", empty), (f"{args.folders} folders, {args.repositories} repositories", big)):
            line = f"{name}: {checks(folder, args.rounds)}"
            if bwrap_problem() is None:
                line += f"; {round_trips(folder, args.rounds)}"
            print(line, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
