"""A kernel starts in the notebook's folder, which the box writes: starting or restarting it must not
import what a cell left there. (`python -m` would: it puts the current folder first on sys.path.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..kernel_session import KernelSession


@pytest.fixture
def kernel(default_kernel: KernelSession) -> KernelSession:
    return default_kernel


def test_modules_a_cell_plants_in_the_notebooks_folder_are_not_imported_at_restart(kernel: KernelSession,
                                                                                    tmp_path: Path):
    marker = tmp_path / "RAN-ON-THE-HOST"
    # Each file, if imported by the kernel's Python on this machine, writes the marker (the workspace is
    # the same folder on both sides) and then gets out of the way.
    plant = (f"open({str(marker)!r}, 'a').write(__name__ + '\\\\n')\n"
             "import sys, importlib.util\n"
             "del sys.modules[__name__]\n")
    for module in ("ipykernel", "jupyter_client", "zmq", "traitlets", "runpy", "json", "owsandbox"):
        path = f"{module}/__init__.py" if module == "owsandbox" else f"{module}.py"
        written = kernel.run(f"mkdir -p owsandbox && printf '%s' \"{plant}\" > {path} && echo planted")
        assert written.text().strip() == "planted", written.outputs
    kernel.km.restart_kernel(now=False)
    kernel.kc.wait_for_ready(timeout=60)
    kernel.drain()
    after = kernel.run("echo still here")
    assert after.status == "ok" and after.text() == "still here\n", after.outputs
    assert not marker.exists(), f"the restarted kernel imported: {marker.read_text()}"
