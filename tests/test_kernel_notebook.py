"""Whole notebooks executed on the kernel by nbclient, the engine behind `jupyter execute` and nbconvert.

A notebook run is how most work reaches the kernel unattended, and nbclient has its own rules: it
runs cells in order in the folder given as `resources["metadata"]["path"]` (the kernel's workspace),
gathers each cell's outputs into the notebook, and stops at the first cell whose reply is an error
unless errors are allowed. These tests build notebooks with nbformat, run them on the real kernel
(kernelspec `owsandbox-test`, local sandbox) and read the outputs nbclient stored: that a cell's
`cd` and `export` carry into later cells, that `%%write` and `%read` work in the shell's folder, that
`owdisplay` of a PNG becomes display_data with the file's bytes, that a failing command stops a run
with `ExitStatus` or, with errors allowed, gives exactly one error output and the run goes on, and
that a cell over its `%timeout` ends with `TimedOut` without ending the run.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import zlib
from datetime import datetime
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbformat import NotebookNode

from .conftest import KERNEL_NAME

NOTES = "first line\nsecond line\n"


def one_pixel_png() -> bytes:
    """A valid 1x1 RGB PNG, built by hand."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # width, height, 8 bits, truecolour, no interlace
    pixels = zlib.compress(b"\x00" + bytes([255, 128, 0]))  # one scanline: filter 0, an orange pixel
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def notebook(*sources: str) -> NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "Sandbox (test)", "language": "bash"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    return nb


def execute(nb: NotebookNode, folder: Path, allow_errors: bool = False) -> NotebookNode:
    client = NotebookClient(nb, kernel_name=KERNEL_NAME, timeout=60, allow_errors=allow_errors,
                            resources={"metadata": {"path": str(folder)}})
    return client.execute()


def text(cell: NotebookNode, name: str = "stdout") -> str:
    return "".join(out["text"] for out in cell.outputs if out["output_type"] == "stream" and out["name"] == name)


def of_type(cell: NotebookNode, output_type: str) -> list[NotebookNode]:
    return [out for out in cell.outputs if out["output_type"] == output_type]


def seconds_running(cell: NotebookNode) -> float:
    timing = cell.metadata["execution"]
    started, ended = (datetime.fromisoformat(timing[key].replace("Z", "+00:00"))
                      for key in ("iopub.execute_input", "shell.execute_reply"))
    return (ended - started).total_seconds()


CD_AND_EXPORT = "mkdir -p sub && cd sub && export GREETING=hello-from-cell-one"
USE_BOTH = 'echo "$GREETING in $PWD"'
WRITE_NOTES = "%%write notes.txt\n" + NOTES.rstrip("\n")
READ_NOTES = "%read notes.txt"
SHOW_PIXEL = "owdisplay ../pixel.png"
FAIL = "false"
AFTER_THE_FAILURE = 'echo "after the failure: $GREETING in $(basename "$PWD")"'
CELLS = (CD_AND_EXPORT, USE_BOTH, WRITE_NOTES, READ_NOTES, SHOW_PIXEL, FAIL, AFTER_THE_FAILURE)
TIMEOUT_CELLS = ("%timeout 1", "export BEFORE=set-before; sleep 5", "echo next cell runs: $BEFORE")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    tmp_path.joinpath("pixel.png").write_bytes(one_pixel_png())
    return tmp_path.resolve()


def test_a_notebook_keeps_folder_and_variables_writes_reads_and_shows_an_image(workspace: Path) -> None:
    nb = execute(notebook(*CELLS), workspace, allow_errors=True)
    cd_and_export, use_both, write_notes, read_notes, show_pixel, fail, after = nb.cells

    assert (workspace / "sub").is_dir()
    assert of_type(cd_and_export, "error") == [] and text(cd_and_export) == ""
    assert text(use_both) == f"hello-from-cell-one in {workspace / 'sub'}\n"

    assert (workspace / "sub" / "notes.txt").read_text() == NOTES  # written in the shell's folder
    assert text(write_notes) == (f"wrote {len(NOTES)} bytes to {workspace / 'sub' / 'notes.txt'}\n"
                                 f"sha256 {hashlib.sha256(NOTES.encode()).hexdigest()}\n")
    assert text(read_notes) == NOTES and text(read_notes, "stderr") == ""

    [shown] = show_pixel.outputs
    assert shown["output_type"] == "display_data"
    assert base64.b64decode(shown["data"]["image/png"]) == one_pixel_png()
    assert shown["data"]["text/plain"].startswith("<image/png image: /")
    assert shown["data"]["text/plain"].endswith("/pixel.png>")

    assert [out["output_type"] for out in fail.outputs] == ["error"]
    assert fail.outputs[0]["ename"] == "ExitStatus"
    assert fail.outputs[0]["evalue"] == "the command exited with status 1"
    assert text(after) == "after the failure: hello-from-cell-one in sub\n"
    assert [cell.execution_count for cell in nb.cells] == [1, 2, 3, 4, 5, 6, 7]


def test_a_failing_command_stops_the_notebook_run_with_exit_status(workspace: Path) -> None:
    nb = notebook(*CELLS)
    with pytest.raises(CellExecutionError) as raised:
        execute(nb, workspace)
    assert raised.value.ename == "ExitStatus"
    assert raised.value.evalue == "the command exited with status 1"
    assert text(nb.cells[1]) == f"hello-from-cell-one in {workspace / 'sub'}\n"  # the cells before it ran
    assert nb.cells[-1].outputs == [] and nb.cells[-1].execution_count is None  # the cell after it did not


def test_a_cell_past_its_time_limit_ends_timed_out_and_the_next_cell_runs(workspace: Path) -> None:
    set_limit, slow, after = execute(notebook(*TIMEOUT_CELLS), workspace, allow_errors=True).cells
    assert text(set_limit) == "cell time limit: 1 s\n"
    assert [out["output_type"] for out in slow.outputs] == ["error"], slow.outputs  # no stray ^C newline either
    assert slow.outputs[0]["ename"] == "TimedOut" and slow.outputs[0]["evalue"] == "timed out after 1 s"
    assert seconds_running(slow) < 4.5  # stopped near the limit, not after the whole `sleep 5`
    assert of_type(after, "error") == []
    assert text(after) == "next cell runs: set-before\n"  # the shell and its variables survived

