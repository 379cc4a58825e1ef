"""The shapes read alike on the Pythons a box may have (the box runs on whatever python3 its image has)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CODE = ("from owsandbox.protocol import messages as M, shapes\n"
        "print(sorted(k for k, (_, r) in shapes.fields(M.RunParams).items() if r))\n"
        "try:\n    shapes.parse(M.OutputFrame, {'id': 1, 'shell': 'm', 'stream': 'x', 'text': '', 'offset': 0})\n"
        "except shapes.ShapeError as e:\n    print(e)\n")


def interpreter(version: str) -> str | None:
    """A `pythonX.Y` that runs: on PATH, or one of pyenv's (whose shims run only the selected one)."""
    found = [shutil.which(f"python{version}") or ""]
    found += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    for python in filter(None, found):
        if subprocess.run([python, "-c", ""], capture_output=True).returncode == 0:
            return python
    return None


@pytest.mark.parametrize("version", ["3.8", "3.9", "3.10", "3.12"])
def test_the_box_s_pythons_read_the_shapes_alike(version: str) -> None:
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} here")
    done = subprocess.run([python, "-c", CODE], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    wanted = ["['command']", "field 'stream' must be 'stdout', 'stderr', 'note' or 'display', not 'x'"]
    assert done.stdout.splitlines() == wanted, done.stderr
