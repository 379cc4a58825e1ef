"""Every module imports on its own, first: a cycle between two modules shows only when the one that
is not usually imported first is (a test module, a plug-in, `python -m`), so each is tried as the
first owsandbox import of a clean interpreter state."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = r"""
import importlib, pkgutil, sys, traceback
import owsandbox
names = [m.name for m in pkgutil.walk_packages(owsandbox.__path__, "owsandbox.") if not m.name.endswith("__main__")]
failed = []
for name in names:
    for loaded in [key for key in sys.modules if key == "owsandbox" or key.startswith("owsandbox.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
print(len(names))
print("\n".join(failed))
"""


def test_each_module_imports_first_without_a_cycle() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count, *failed = done.stdout.splitlines()
    assert int(count) >= 120
    assert not [line for line in failed if line], failed
