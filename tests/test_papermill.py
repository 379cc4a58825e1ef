"""papermill runs parameterised notebooks on the kernel: its bash translator writes the parameters
cell, every cell's output lands in the output notebook, and a failing cell fails the run by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from .conftest import KERNEL_NAME

pytestmark = pytest.mark.system


def parameterised_notebook(path: Path, *extra: str) -> None:
    parameters = nbformat.v4.new_code_cell("name=World\ncount=1")
    parameters.metadata["tags"] = ["parameters"]
    cells = [parameters, nbformat.v4.new_code_cell('for i in $(seq "$count"); do echo "hello $name $i"; done'),
             *(nbformat.v4.new_code_cell(code) for code in extra), nbformat.v4.new_code_cell('echo "bye $name"')]
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "Sandbox", "language": "bash"}
    nbformat.write(notebook, str(path))


def papermill(folder: Path, source: str, *params: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "papermill", "-k", KERNEL_NAME, source, "out.ipynb", *params],
                          cwd=folder, capture_output=True, text=True, timeout=120)


def outputs(cell: nbformat.NotebookNode) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


def test_parameters_are_injected_as_bash_and_every_cell_keeps_its_output(tmp_path):
    parameterised_notebook(tmp_path / "in.ipynb")
    done = papermill(tmp_path, "in.ipynb", "-p", "name", "Ada O'Brien", "-p", "count", "3")
    assert done.returncode == 0, done.stderr
    cells = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4).cells
    injected = cells[1]
    assert "injected-parameters" in injected.metadata["tags"] and injected.source.startswith("# Parameters\n")
    assert outputs(cells[2]) == "".join(f"hello Ada O'Brien {i}\n" for i in (1, 2, 3))  # a quote survives
    assert outputs(cells[3]) == "bye Ada O'Brien\n"


def test_a_failing_cell_fails_the_run_and_names_the_cell(tmp_path):
    parameterised_notebook(tmp_path / "in.ipynb", "ls /no/such/place")
    done = papermill(tmp_path, "in.ipynb", "-p", "count", "2")
    assert done.returncode != 0
    assert 'Exception encountered at "In [4]"' in done.stderr and "ExitStatus" in done.stderr
    cells = {cell.source: cell for cell in nbformat.read(str(tmp_path / "out.ipynb"), as_version=4).cells}
    loop = next(cell for source, cell in cells.items() if source.startswith("for i in"))
    assert outputs(loop) == "hello World 1\nhello World 2\n"  # what ran before it is kept
    assert any(output.output_type == "error" for output in cells["ls /no/such/place"].outputs)
    assert not cells['echo "bye $name"'].outputs  # nothing after it ran
