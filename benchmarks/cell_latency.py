"""A cell's round trip through the owsandbox kernel: execute_request → execute_reply and idle.

One kernel (compare.py's install and driver; --provider as for compare.py, default `local`) runs each
cell --runs times after --warmup, and the median and 95th percentile are printed per cell:

* `true`: no output, the shortest round trip;
* `echo hi`: one line of output, which arrives as a live frame just before the command's answer (the
  case the kernel's output batching touches);
* `seq 1 200`: a few frames of output.

With --against DIR (a folder holding another `owsandbox` package, say `git archive` of an earlier commit),
that tree's kernel runs the same cells in turn with this one (cell by cell, so both see the same machine
load): a before/after of a change.

Run: `python benchmarks/cell_latency.py [--runs 200] [--provider local] [--against DIR]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import MARKER_ENV, Session, jupyter_paths, kill_leftovers, prepare_owsandbox  # noqa: E402

CELLS = ["true", "echo hi", "seq 1 200"]


def progress(text: str) -> None:
    print(f"[cell_latency] {text}", file=sys.stderr, flush=True)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="runs of each cell measured")
    parser.add_argument("--warmup", type=int, default=5, help="runs of each cell before measuring")
    parser.add_argument("--provider", default="local", help="the kernel's provider")
    parser.add_argument("--against", help="a folder with another owsandbox package, measured in turn")
    args = parser.parse_args(argv)
    marker = uuid.uuid4().hex
    root = Path(tempfile.mkdtemp(prefix="owsandbox-cell-latency-"))
    env = {key: value for key, value in os.environ.items() if key not in ("OWSANDBOX_PROVIDER", "PYTHONUNBUFFERED")}
    env[MARKER_ENV] = marker
    envs = {"this tree": env}
    if args.against:
        envs[f"owsandbox of {args.against}"] = {**env, "PYTHONPATH": str(Path(args.against).resolve())}
    sessions: dict[str, Session] = {}
    times: dict[str, dict[str, list[float]]] = {name: {cell: [] for cell in CELLS} for name in envs}
    try:
        with jupyter_paths(root):
            kernel = prepare_owsandbox(root, args.provider)
            if kernel.why_not:
                raise SystemExit(kernel.why_not)
            for name, kernel_env in envs.items():
                workdir = Path(tempfile.mkdtemp(prefix="cells-", dir=root))
                sessions[name] = Session(kernel, workdir, kernel_env)
                sessions[name].wait_for_kernel_info()
            for cell in CELLS:
                for run in range(args.warmup + args.runs):
                    for name, session in sessions.items():
                        done = session.run(cell)
                        if run >= args.warmup:
                            times[name][cell].append((done.finished_at - done.sent) * 1000)
                progress(f"{cell!r} done")
    finally:
        for session in sessions.values():
            session.close()
        kill_leftovers(marker, root)
        shutil.rmtree(root, ignore_errors=True)
    print(f"| cell: request → reply and idle, {args.runs} runs ({args.provider}) | "
          + " | ".join(f"{name}: median / p95" for name in envs) + " |")
    print("|---|" + "---|" * len(envs))
    for cell in CELLS:
        print(f"| `{cell}` | " + " | ".join(f"{statistics.median(times[name][cell]):.1f} ms / "
                                           f"{percentile(times[name][cell], 0.95):.1f} ms" for name in envs) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
