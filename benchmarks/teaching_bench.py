"""%snapshot save and restore of a 200 MB workspace of 10,000 files, and what %record costs a cell.

Snapshots go through a real kernel on bubblewrap, as a user's cells do (a restore stops the box and
starts a new one, and starts the shell again): the first save (every file read and stored), a save
with nothing changed (no file read), a save after one file changed, a restore after a cell changed
ten files and added and removed a few, and a restore of a workspace whose files were all deleted
(200 MB written back). Each is the time from the request to the reply, the median of `--rounds`.

Recording: `--cells` cells of `true` and of `seq 1 200` on the local provider (the least noise), with
`%record` off and on; the figure is the difference of the medians, request to reply.

Run: `python benchmarks/teaching_bench.py [--rounds N] [--cells N]` from the repository root.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tests.conftest as test_setup  # noqa: E402
from owsandbox.host.providers import bwrap_problem  # noqa: E402
from tests.kernel_session import KernelSession  # noqa: E402

FILES = 10_000
LARGE = 10  # files of 10 MB; the others share the remaining 100 MB
MB = 1 << 20


def make_workspace(root: Path) -> int:
    """10,000 files in 100 folders, 200 MB in all; the bytes written."""
    small = (200 * MB - LARGE * 10 * MB) // (FILES - LARGE)
    total = 0
    for number in range(FILES):
        folder = root / f"part-{number % 100:02}"
        folder.mkdir(exist_ok=True)
        size = 10 * MB if number < LARGE else small
        (folder / f"file-{number:05}.bin").write_bytes(os.urandom(size))
        total += size
    return total


def timed(kernel: KernelSession, code: str) -> float:
    started = time.perf_counter()
    run = kernel.run(code, timeout=600)
    assert run.status == "ok", run.outputs
    return time.perf_counter() - started


def snapshots(rounds: int) -> None:
    problem = bwrap_problem()
    if problem:
        print(f"snapshots: skipped ({problem})")
        return
    base = Path(tempfile.mkdtemp(prefix="owsbx-bench-"))
    try:
        workspace = base / "ws"
        workspace.mkdir()
        size = make_workspace(workspace)
        time.sleep(2.5)  # past the window in which a save hashes a just-changed file again
        env = {"OWSANDBOX_PROVIDER": "bwrap", "OWSANDBOX_SNAPSHOT_DIR": str(base / "store")}
        kernel = KernelSession(workspace, kernel_name=test_setup.DEFAULT_KERNEL_NAME, env=env)
        try:
            timed(kernel, "true")
            figures: dict[str, list[float]] = {name: [] for name in (
                "save, first (all read)", "save, nothing changed", "save, one file changed",
                "restore, 10 files changed, 3 added, 2 removed", "restore, every file deleted (200 MB back)")}
            for number in range(rounds):
                shutil.rmtree(base / "store", ignore_errors=True)
                time.sleep(2.5)  # files the last round wrote are past the window in which a save reads them again
                figures["save, first (all read)"].append(timed(kernel, "%snapshot save base"))
                figures["save, nothing changed"].append(timed(kernel, "%snapshot save again"))
                timed(kernel, f"echo {number} >> part-50/file-00050.bin")
                figures["save, one file changed"].append(timed(kernel, "%snapshot save one"))
                timed(kernel, "for n in 1 2 3 4 5 6 7 8 9; do echo x >> part-6$n/file-0006$n.bin; done; "
                              "echo y >> part-00/file-00000.bin; touch new-1 new-2 new-3; "
                              "rm part-99/file-09999.bin part-98/file-09998.bin")
                figures["restore, 10 files changed, 3 added, 2 removed"].append(
                    timed(kernel, "%snapshot restore base"))
                timed(kernel, "cd / && find " + str(workspace) + " -type f -delete && cd " + str(workspace))
                figures["restore, every file deleted (200 MB back)"].append(timed(kernel, "%snapshot restore base"))
                timed(kernel, "%snapshot drop again")
                timed(kernel, "%snapshot drop one")
            print(f"snapshots of a workspace of {FILES:,} files, {size / MB:.0f} MB, through a bubblewrap kernel "
                  f"(median of {rounds}):")
            for name, times in figures.items():
                print(f"  {name}: {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f})")
        finally:
            kernel.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def recording(cells: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="owsbx-bench-rec-"))
    try:
        workspace = base / "ws"
        workspace.mkdir()
        kernel = KernelSession(workspace, kernel_name=test_setup.KERNEL_NAME, env={"XDG_DATA_HOME": str(base)})
        try:
            results: dict[tuple[str, bool], float] = {}
            for code in ("true", "seq 1 200"):
                for on in (False, True):
                    timed(kernel, "%record on" if on else "%record off")
                    for _ in range(10):  # warm up
                        timed(kernel, code)
                    times = [timed(kernel, code) for _ in range(cells)]
                    results[(code, on)] = statistics.median(times)
            timed(kernel, "%record off")
            casts = list(base.rglob("*.cast"))
            size = sum(path.stat().st_size for path in casts)
            print(f"recording, {cells} cells each on the local provider (median request to reply):")
            for code in ("true", "seq 1 200"):
                off, on = results[(code, False)] * 1000, results[(code, True)] * 1000
                print(f"  `{code}`: off {off:.2f} ms, on {on:.2f} ms: {on - off:+.2f} ms per cell")
            print(f"  the {len(casts)} recordings: {size / 1024:.0f} KiB for {2 * (cells + 11)} cells")
        finally:
            kernel.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cells", type=int, default=200)
    args = parser.parse_args()
    config = type("Config", (), {})()
    test_setup.pytest_configure(config)  # the tests' kernelspecs, through JUPYTER_PATH
    try:
        recording(args.cells)
        snapshots(args.rounds)
    finally:
        shutil.rmtree(config._owsandbox_kernelspec_root, ignore_errors=True)


if __name__ == "__main__":
    main()
