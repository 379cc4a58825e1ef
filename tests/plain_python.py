"""Jupyter for plain users: the system Python with a world-readable copy of this environment's packages.

A JupyterHub spawns each student's server as that student, and a grader may run as a user of its own.
Those users may not read the project's folder nor run its virtual env's interpreter (a pyenv build under
/root, say). So the tests give them the system `python3` (same minor version, hence the same ABI for
compiled modules) and a PYTHONPATH holding a copy of the project's package and of the venv's
site-packages, made with hard links where the file system allows (seconds, no extra space).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class PlainPython:
    """What a plain user runs: `python`, with `env` (PYTHONPATH, PATH) on top of their own."""

    python: str
    root: Path  # world-readable; holds site/ (packages) and share/jupyter (kernelspecs)

    @property
    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.root / "site"), "JUPYTER_PATH": str(self.root / "share" / "jupyter"),
                "PATH": f"{self.root / 'bin'}:/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}


def as_user(user: str, argv: list[str], env: Mapping[str, str] | None = None, clear_env: bool = False) -> list[str]:
    """`argv` run as `user` (we are root) through runuser, with `env` set in its environment (and only
    that with `clear_env`): runuser itself keeps most of ours."""
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    settings = [f"{key}={value}" for key, value in (env or {}).items()]
    return [runuser, "-u", user, "--", *(["env", *(["-i"] if clear_env else []), *settings] if env or clear_env
                                         else []), *argv]


def _system_python() -> str:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (SYSTEM_PYTHON, shutil.which(f"python{version}") or ""):
        if candidate and os.access(candidate, os.X_OK):
            found = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                                   capture_output=True, text=True).stdout.strip()
            if found == str(sys.version_info[:2]):
                return candidate
    message = f"no system python{version} for plain users (the venv's site-packages need the same minor version)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _link_tree(source: Path, target: Path) -> None:
    """Hard-link every file of `source` under `target` (copy across file systems); folders are 0755.

    The bytecode caches come too: a linked source keeps its mtime, so its cached bytecode (same minor
    version, same magic number) stays valid, and a plain user's Python, which cannot write caches here,
    does not compile every module it imports (a Jupyter server starts in a third of the time)."""
    for root, _folders, files in os.walk(source):
        relative = Path(root).relative_to(source)
        destination = target / relative
        destination.mkdir(parents=True, exist_ok=True)
        os.chmod(destination, 0o755)
        for name in files:
            origin = Path(root) / name
            if origin.is_symlink():
                continue
            try:
                os.link(origin, destination / name)
            except OSError:
                shutil.copy2(origin, destination / name)
            if not os.stat(destination / name).st_mode & 0o004:  # private: a copy of its own, made readable
                os.unlink(destination / name)
                shutil.copy2(origin, destination / name)
                os.chmod(destination / name, 0o644)


def make_plain_python() -> PlainPython:
    """Build the environment (callers own cleanup: `shutil.rmtree(result.root)`)."""
    python = _system_python()
    root = Path(tempfile.mkdtemp(prefix="owsbx-plainpy-"))
    os.chmod(root, 0o755)
    site = root / "site"
    _link_tree(Path(sysconfig.get_paths()["purelib"]), site)
    shutil.rmtree(site / "owsandbox", ignore_errors=True)
    _link_tree(PROJECT / "owsandbox", site / "owsandbox")
    (root / "bin").mkdir(mode=0o755)
    os.chmod(root / "bin", 0o755)
    (root / "share" / "jupyter").mkdir(parents=True)
    for folder in (root / "share", root / "share" / "jupyter"):
        os.chmod(folder, 0o755)
    subprocess.run([python, "-m", "owsandbox.cli", "install", "--prefix", str(root)], check=True,
                   env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True)
    for current, folders, files in os.walk(root / "share"):
        for name in folders:
            os.chmod(os.path.join(current, name), 0o755)
        for name in files:
            os.chmod(os.path.join(current, name), 0o644)
    return PlainPython(python, root)
