"""`owsandbox tour`: run a notebook on the owsandbox kernel, headless, and print what it showed.

The notebook runs in a copy of its folder (what it reads beside it is there; what it writes is not
left in the original), and nothing is kept once the tour ends. It is the quick start's proof that
everything works on this machine: the kernel starts, the sandbox starts, and every cell's output is
checked by nbclient (a failing cell stops the run unless it is tagged `raises-exception`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from .protocol.words import counted
from .settings import OUTPUT_RATE

TOUR = Path(__file__).resolve().parent.parent / "notebooks" / "tour.ipynb"
COPY_FILES = 5_000  # a notebook's folder larger than this is not copied whole: the tour says so
COPY_BYTES = 200 * 1024 * 1024
NOT_COPIED = frozenset({".git", "node_modules", "__pycache__", ".ipynb_checkpoints"})


class FolderTooLarge(Exception):
    """The notebook's folder holds more than a tour copies."""


def copy_folder(source: Path, target: Path) -> None:
    """`source` into `target` (which exists), links as links, without version control, caches and
    environments (a folder holding `pyvenv.cfg`); FolderTooLarge past COPY_FILES files or COPY_BYTES."""
    files = size = 0
    for root, folders, names in os.walk(source):
        here = Path(root)
        folders[:] = [f for f in folders if f not in NOT_COPIED and not (here / f / "pyvenv.cfg").exists()]
        into = target / here.relative_to(source)
        into.mkdir(exist_ok=True)
        for name in [*names, *(f for f in folders if (here / f).is_symlink())]:
            files += 1
            path = here / name
            size += path.lstat().st_size
            if files > COPY_FILES or size > COPY_BYTES:
                raise FolderTooLarge(f"{source} holds more than {COPY_FILES:,} files or {COPY_BYTES // 2**20} MB")
            if path.is_symlink():
                os.symlink(os.readlink(path), into / name)
            elif path.is_file():
                shutil.copy2(path, into / name)
        folders[:] = [f for f in folders if not (here / f).is_symlink()]


def _render(output: dict[str, Any]) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        text = output.get("text", "")
        return text if output.get("name") != "stderr" else "".join(f"! {line}\n" for line in text.splitlines())
    if kind == "error":
        return f"✗ {output.get('ename')}: {output.get('evalue')}\n"
    data = output.get("data", {})
    for mime in ("text/plain", "text/markdown"):
        if mime in data:
            text = data[mime]
            return text if text.endswith("\n") else text + "\n"
    if "application/json" in data:
        return json.dumps(data["application/json"]) + "\n"
    return f"[{', '.join(sorted(data))}]\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="owsandbox tour", description="Run a notebook on the owsandbox kernel, headless, in a copy of its "
        "folder (so what it reads beside it is there, and what it writes is not left behind), and print what "
        "each cell showed.")
    parser.add_argument("notebook", nargs="?", default=str(TOUR), help="the notebook to run (default: the tour)")
    parser.add_argument("--kernel", default="owsandbox", help="kernelspec name (default: owsandbox)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds a cell may take")
    args = parser.parse_args(argv)
    try:
        import nbformat
        from jupyter_client.manager import KernelManager
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError
    except ImportError:
        print("owsandbox tour needs nbclient and nbformat: pip install nbclient nbformat", file=sys.stderr)
        return 2
    if not os.path.exists(args.notebook):
        print(f"owsandbox tour: no notebook at {args.notebook}; give the path of one", file=sys.stderr)
        return 2
    notebook = nbformat.read(args.notebook, as_version=4)
    with tempfile.TemporaryDirectory(prefix="owsandbox-tour-") as workdir, \
            tempfile.TemporaryDirectory(prefix="owsandbox-tour-kernel-") as sockets:
        try:
            copy_folder(Path(args.notebook).resolve().parent, Path(workdir))
        except FolderTooLarge as exc:
            print(f"owsandbox tour: {exc}: move the notebook into a folder of its own", file=sys.stderr)
            return 2
        # Headless: no Jupyter server between to pace the output for (kernel/cell/pacing.py), so every line is kept.
        os.environ.setdefault(OUTPUT_RATE, "0")
        # Over IPC (Unix sockets in a private folder of their own, not the workspace the sandbox writes):
        # no TCP port is opened on this machine.
        manager = KernelManager(kernel_name=args.kernel, transport="ipc", ip=os.path.join(sockets, "kernel"))
        client = NotebookClient(notebook, km=manager, kernel_name=args.kernel, timeout=args.timeout,
                                resources={"metadata": {"path": workdir}})
        failed: CellExecutionError | None = None
        try:
            client.execute()
        except CellExecutionError as exc:
            failed = exc
        finally:  # nbclient leaves a kernel it was handed running
            if manager.has_kernel:
                manager.shutdown_kernel()
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    for number, cell in enumerate(code_cells):
        sys.stdout.write("".join(f"│ {line}\n" for line in cell.source.splitlines()))
        for output in cell.get("outputs", []):
            sys.stdout.write(_render(output))
        sys.stdout.write("\n")
        if failed is not None and _failed_here(cell):
            left = len(code_cells) - number - 1
            print(f"the notebook stopped at this cell; {left} cell{'s' if left != 1 else ''} after it did not run",
                  file=sys.stderr)
            return 1
    if failed is not None:
        print(f"the notebook stopped at a failing cell: {failed}", file=sys.stderr)
        return 1
    print(f"ran {counted(len(code_cells), 'cell')} of {os.path.basename(args.notebook)}: all as expected")
    return 0


def _failed_here(cell: Any) -> bool:
    """Whether the run stopped at `cell`: an error it was not tagged to raise."""
    expected = "raises-exception" in cell.get("metadata", {}).get("tags", [])
    return not expected and any(output.get("output_type") == "error" for output in cell.get("outputs", []))
