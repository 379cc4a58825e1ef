"""Kernel start and idle memory: the owsandbox kernel beside the python3 kernel (ipykernel), in one run.

Each kernel is started --starts times by `jupyter_client.KernelManager` in a fresh temporary folder,
the two kernels taking turns (so both see the same machine load), and always shut down in a
`finally`; processes left behind are looked for and killed (compare.py's marker). Per start:

* **start → kernel_info**: from before `start_kernel()` to the first `kernel_info_reply`;
* **start → first cell**: to the end (reply and idle) of a first trivial cell (`true`; `pass` for python3);
* **idle PSS** once that cell has ended and --settle seconds have passed (a box's daemon finishes its
  own start meanwhile): the proportional set size (`/proc/PID/smaps_rollup`) of the kernel process
  alone, and of its whole tree: every process below it, and every process that carries the run's
  marker in its environment (a box's processes that are not its children). For python3 the tree is
  the kernel alone.

Medians of the starts are printed as a Markdown table, with the owsandbox kernel's figures beside the
python3 kernel's (the difference in start time, the ratio of PSS).

Both kernels run as installed: with their modules' bytecode. pip compiles a package when it installs it
(ipykernel and IPython have theirs); an editable install of owsandbox run where PYTHONDONTWRITEBYTECODE
is set (a developer's shell, CI) never gets it, and its kernel would compile each of its modules at every
start and keep the compiler's garbage, about 2 MiB of its PSS. So the owsandbox package's bytecode (and
--against's) is written first, as `pip install` does (`compileall`, into its `__pycache__` folders),
unless --as-is says to measure the tree as it is.

With --against DIR (a folder holding another `owsandbox` package, say `git archive` of an earlier
commit), that tree's kernel is measured too, as a third kernel taking its turn with the others (the same
kernelspec, with DIR first on PYTHONPATH): a before/after of a change under the same machine load.

With --importtime, the owsandbox kernel's imports are listed instead (`python -X importtime`, the
kernel's module imported as Jupyter starts it), the slowest first, cumulative and self milliseconds:
what to look at for a start that takes too long.

Run: `python benchmarks/kernel_start.py [--starts 5] [--provider bwrap] [--settle 2] [--against DIR] [--importtime]
[--as-is]`.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (  # noqa: E402 - the kernels as compare.py installs and drives them
    MARKER_ENV,
    Kernel,
    Session,
    jupyter_paths,
    kill_leftovers,
    leftover_processes,
    prepare_owsandbox,
    prepare_python3,
)


def progress(text: str) -> None:
    print(f"[kernel_start] {text}", file=sys.stderr, flush=True)


# -- memory ----------------------------------------------------------------------------------------


def pss_kb(pid: int) -> int:
    """The proportional set size of one process, in KiB (0 for one that is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
    except OSError:
        return 0


def children_of(pid: int) -> list[int]:
    """Every process below `pid`, however deep."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    found: list[int] = []
    wanted = [pid]
    while wanted:
        below = [child for child, parent in parents.items() if parent == wanted[-1]]
        wanted.pop()
        found += below
        wanted += below
    return found


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:100]
    except OSError:
        return "?"


def tree_pss_kb(pid: int, marker: str, root: Path) -> tuple[int, int, list[tuple[int, str]]]:
    """(PSS of `pid` alone, PSS of `pid`, everything below it and everything of this run, each process
    of that tree with its PSS), in KiB."""
    tree = sorted({pid, *children_of(pid), *leftover_processes(marker, root)})
    each = [(pss_kb(one), command_of(one)) for one in tree]
    return pss_kb(pid), sum(kb for kb, _ in each), each


def compile_like_an_install(package: Path) -> None:
    """Write the bytecode of the package's modules where Python looks for it, as `pip install` does."""
    progress(f"compiling {package} as an install does")
    if not compileall.compile_dir(str(package), quiet=1):
        raise SystemExit(f"could not compile {package}")


# -- one start -------------------------------------------------------------------------------------


def one_start(kernel: Kernel, trivial: str, workdir: Path, env: dict[str, str], marker: str, root: Path,
              settle: float) -> dict[str, float]:
    session = Session(kernel, workdir, env)
    try:
        info = session.wait_for_kernel_info()
        cell = session.run(trivial, timeout=120)
        first = cell.finished_at - session.started
        time.sleep(settle)  # idle: whatever the kernel and its box do after a start is over
        pid = session.km.provisioner.process.pid
        alone, tree, each = tree_pss_kb(pid, marker, root)
    finally:
        session.close()
    for kb, command in each:
        progress(f"  {kb / 1024:6.1f} MiB  {command}")
    return {"info": info, "first": first, "alone": alone / 1024, "tree": tree / 1024}


def measure(args: argparse.Namespace, root: Path, marker: str) -> dict[str, list[dict[str, float]]]:
    env = {key: value for key, value in os.environ.items() if key not in ("OWSANDBOX_PROVIDER", "PYTHONUNBUFFERED")}
    env[MARKER_ENV] = marker
    ours = prepare_owsandbox(root, args.provider)
    kernels = {"owsandbox": (ours, "true", env), "python3": (Kernel("python3", "python3", "python3"), "pass", env)}
    if args.against:
        against = {**env, "PYTHONPATH": os.pathsep.join([str(Path(args.against).resolve()),
                                                          *filter(None, [env.get("PYTHONPATH")])])}
        kernels["against"] = (ours, "true", against)
    if not args.as_is:
        import owsandbox

        compile_like_an_install(Path(owsandbox.__file__).resolve().parent)
        if args.against:
            compile_like_an_install(Path(args.against).resolve() / "owsandbox")
    python3 = prepare_python3()
    if python3.why_not:
        raise SystemExit(f"python3: {python3.why_not}")
    if ours.why_not:
        raise SystemExit(f"owsandbox: {ours.why_not}")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in kernels}
    for start in range(1, args.starts + 1):
        for name, (kernel, trivial, kernel_env) in kernels.items():
            workdir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
            try:
                figures = one_start(kernel, trivial, workdir, kernel_env, marker, root, args.settle)
            finally:
                kill_leftovers(marker, root)
            runs[name].append(figures)
            progress(f"{name} start {start}: kernel_info {figures['info']:.3f} s, first cell {figures['first']:.3f} s, "
                     f"PSS {figures['alone']:.1f} MiB alone, {figures['tree']:.1f} MiB with its tree")
    return runs


def table(runs: dict[str, list[dict[str, float]]], starts: int, provider: str, against: str | None) -> str:
    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    ours, theirs = "owsandbox", "python3"
    rows = [
        ("start → kernel_info_reply", "info", "s", "{:.3f}"),
        ("start → first trivial cell finished", "first", "s", "{:.3f}"),
        ("idle PSS, the kernel process", "alone", "MiB", "{:.1f}"),
        ("idle PSS, the kernel's whole tree (with its box)", "tree", "MiB", "{:.1f}"),
    ]
    where = provider or "as a user gets it"
    lines = [f"| median of {starts} starts | owsandbox ({where}) | python3 | owsandbox vs python3 |",
             "|---|---|---|---|"]
    if against:
        lines[0] += f" owsandbox of {against} | it vs python3 |"
        lines[1] += "---|---|"
    for label, key, unit, shape in rows:
        row = f"| {label} |"
        for name in (ours, "against") if against else (ours,):
            mine, yours = median(name, key), median(theirs, key)
            versus = f"{mine - yours:+.3f} s" if unit == "s" else f"{mine / yours:.2f}×"
            row += f" {shape.format(mine)} {unit} |" + (f" {shape.format(yours)} {unit} |" if name == ours else "")
            row += f" {versus} |"
        lines.append(row)
    return "\n".join(lines)


# -- imports ---------------------------------------------------------------------------------------


def importtime(top: int) -> str:
    """The owsandbox kernel's imports at start, the slowest (cumulative) first."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import owsandbox.kernel.__main__"],
                          capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    rows: list[tuple[int, int, str]] = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|")
        rows.append((int(cumulative), int(own), name.rstrip()))
    total = sum(own for _, own, _ in rows)
    ours = sum(own for _, own, name in rows if name.strip().startswith("owsandbox"))
    lines = [f"{len(rows)} modules, {total / 1000:.0f} ms in all, {ours / 1000:.0f} ms of it in owsandbox's "
             f"{sum(name.strip().startswith('owsandbox') for _, _, name in rows)} modules",
             "cumulative ms   self ms  module"]
    slowest = sorted(rows, reverse=True)[:top]
    lines += [f"{cumulative / 1000:13.1f} {own / 1000:9.1f}  {name}" for cumulative, own, name in slowest]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=5, help="starts of each kernel (medians)")
    parser.add_argument("--provider", default="", help="the owsandbox kernel's provider (default: as a user gets it)")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds idle before memory is read")
    parser.add_argument("--against", help="a folder with another owsandbox package, measured too")
    parser.add_argument("--importtime", action="store_true", help="list the kernel's imports instead")
    parser.add_argument("--as-is", action="store_true",
                        help="do not compile the owsandbox package first (measure it as it is)")
    parser.add_argument("--top", type=int, default=40, help="imports listed with --importtime")
    args = parser.parse_args(argv)
    if args.importtime:
        print(importtime(args.top))
        return 0
    marker = uuid.uuid4().hex
    root = Path(tempfile.mkdtemp(prefix="owsandbox-kernel-start-"))
    try:
        with jupyter_paths(root):
            runs = measure(args, root, marker)
        print(table(runs, args.starts, args.provider, args.against))
        print(f"\nowsandbox {'as it is' if args.as_is else 'with its bytecode written first, as an install has it'}")
    finally:
        kill_leftovers(marker, root)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
