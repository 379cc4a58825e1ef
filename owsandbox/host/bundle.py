"""Packs the box into one file that any sandbox with Python 3 can run.

The zipapp is named by the hash of its content (`runner-<12 hex>.pyz`), so a provider copies a
version into a box once and a changed runner never meets a stale copy. It is written to a temp file
and renamed, so a reader never sees half a zipapp.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
#: What the zipapp holds, as folders of this package: the box and the protocol it speaks, nothing of the
#: host or the kernel (tests/test_import_contracts.py holds the box to importing only these).
BOX_PACKAGES = ("box", "protocol")
PACKAGE = "owsandbox.box"
#: The zipapp's `owsandbox/__init__.py`: the package's own one may import what the box does not hold.
_ROOT_INIT = b'"""The box and its protocol, packed to run inside a sandbox."""\n'
_MAIN = f"import sys\nfrom {PACKAGE}.cli import main\nsys.exit(main())\n".encode()
_STAMP = (1980, 1, 1, 0, 0, 0)  # fixed times: the same sources always give the same bytes


def default_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "owsandbox"


#: The box's files that are not modules: read with `pkgutil.get_data`, from the zipapp as from a folder.
BOX_DATA = ("*.bash",)


def box_sources(patterns: tuple[str, ...] = ("*.py",)) -> list[Path]:
    """The box's modules and the protocol's (or its files matching `patterns`), in a fixed order."""
    return sorted(path for folder in BOX_PACKAGES for pattern in patterns for path in (_ROOT / folder).rglob(pattern)
                  if "__pycache__" not in path.parts)


def _sources() -> list[tuple[str, bytes]]:
    files = [("__main__.py", _MAIN), ("owsandbox/__init__.py", _ROOT_INIT)]
    for path in box_sources(("*.py", *BOX_DATA)):
        files.append((path.relative_to(_ROOT.parent).as_posix(), path.read_bytes()))
    return files


@functools.lru_cache(maxsize=1)
def box_stdlib_modules() -> tuple[str, ...]:
    """The standard-library modules the box imports (top-level names, from its sources), for
    providers to check a box's Python for before they run the runner there: a partial Python, such
    as Debian's python3-minimal (no json, shutil, pty, termios, ...), cannot run it."""
    import ast
    import sys

    names: set[str] = set()
    for path in box_sources():
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return tuple(sorted(name for name in names if name in sys.stdlib_module_names and name != "__future__"))


def zipapp_bytes() -> tuple[str, bytes]:
    """The zipapp's file name and content."""
    sources = _sources()
    digest = hashlib.sha256()
    for name, data in sources:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in sources:
            info = zipfile.ZipInfo(name, _STAMP)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return f"runner-{digest.hexdigest()[:12]}.pyz", buffer.getvalue()


def build_runner_zipapp(out_dir: str | os.PathLike[str] | None = None) -> Path:
    """The path of the zipapp in `out_dir`, written unless that very file is there already: compared
    whole, not by size, since the host runs it for every relay and a file of the same size could be
    anything (kept in a private folder besides: `LocalProvider.create`)."""
    folder = Path(out_dir) if out_dir is not None else default_dir()
    folder.mkdir(parents=True, exist_ok=True)
    name, data = zipapp_bytes()
    target = folder / name
    try:
        if target.read_bytes() == data:
            return target
    except OSError:
        pass
    fd, temp = tempfile.mkstemp(prefix=".runner-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(temp, 0o644)
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    return target
