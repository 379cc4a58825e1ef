"""Packs the box into one file that any sandbox with Python 3 can run.

The zipapp is named by the hash of its content (`runner-<12 hex>.pyz`), so a provider copies a
version into a box once and a changed runner never meets a stale copy. It is written to a temp file
and renamed, so a reader never sees half a zipapp.

A zipapp made for a given Python (`python=`) also holds each module's bytecode for it (`name.pyc`
beside `name.py`, where zipimport looks first), for providers whose box runs a Python of this machine
(local, bubblewrap). Without it every daemon and relay compiles its modules from source when it
starts, and the compiler's garbage stays in the process for its whole life: about 1.4 MiB of an idle
daemon's private memory (benchmarks/kernel_start.py). That Python compiles them, in a process of its
own (`-I -S`, importing nothing from a path), so the garbage does not stay in the kernel's process
either (about 1 MiB) and the bytecode is that Python's. The bytecode is checked against its source
(hash-based pyc, PEP 552); a Python of another version skips it for the source, as zipimport does
with a bad magic number. It is deterministic, so the name still says the content: marshal flags
shared objects by their reference counts, which before 3.11 vary with the process (marshal format 2,
which has no such flags, is used there).
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import marshal
import os
import subprocess
import sys
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
COMPILE_TIMEOUT = 60.0

log = logging.getLogger(__name__)

#: The compiler's program: (name, source) pairs in on stdin, each one's pyc out on stdout (marshalled
#: lists). Only builtin and frozen modules: nothing is looked for on a path (the kernel's folder is the
#: box's to write). A checked hash-based pyc (flags 0b11, PEP 552), as `importlib.util` would make it.
COMPILER = """
import _imp, marshal, sys
external = sys.modules["_frozen_importlib_external"]
version = marshal.version if sys.version_info >= (3, 11) else 2
out = []
for name, source in marshal.loads(sys.stdin.buffer.read()):
    code = compile(source, name, "exec", dont_inherit=True)
    out.append(external.MAGIC_NUMBER + (3).to_bytes(4, "little")
               + _imp.source_hash(external._RAW_MAGIC_NUMBER, source) + marshal.dumps(code, version))
sys.stdout.buffer.write(marshal.dumps(out))
"""


def default_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "owsandbox"


#: The box's files that are not modules: read by their modules' loader, from the zipapp as from a folder.
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


def bytecode(python: str, modules: list[tuple[str, bytes]]) -> list[bytes]:
    """The pyc of each (name, source) of `modules` for `python`, compiled by it (`COMPILER`); raises
    RuntimeError, with what it said, when it could not."""
    try:
        done = subprocess.run([python, "-I", "-S", "-c", COMPILER], input=marshal.dumps(modules), capture_output=True,
                              timeout=COMPILE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{python} did not compile the box's modules: {exc}") from exc
    try:
        compiled = marshal.loads(done.stdout) if done.returncode == 0 else None
    except (EOFError, ValueError, TypeError):
        compiled = None
    if not (isinstance(compiled, list) and len(compiled) == len(modules)
            and all(isinstance(one, bytes) for one in compiled)):
        said = done.stderr.decode("utf-8", "replace").strip()[-500:] or f"exit status {done.returncode}"
        raise RuntimeError(f"{python} did not compile the box's modules: {said}")
    return compiled


def _entries(python: str | None) -> list[tuple[str, bytes]]:
    files = _sources()
    if python is None:
        return files
    modules = [(name, data) for name, data in files if name.endswith(".py")]
    try:
        compiled = bytecode(python, modules)
    except RuntimeError as exc:  # the box still runs, from its sources, as it did before it had bytecode
        log.warning("the runner goes without bytecode, its modules compiled where they run: %s", exc)
        return files
    return files + [(name + "c", pyc) for (name, _source), pyc in zip(modules, compiled, strict=True)]


@functools.lru_cache(maxsize=1)
def box_stdlib_modules() -> tuple[str, ...]:
    """The standard-library modules the box imports (top-level names, from its sources), for
    providers to check a box's Python for before they run the runner there: a partial Python, such
    as Debian's python3-minimal (no json, shutil, pty, termios, ...), cannot run it."""
    import ast

    names: set[str] = set()
    for path in box_sources():
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return tuple(sorted(name for name in names if name in sys.stdlib_module_names and name != "__future__"))


def zipapp_bytes(python: str | None = None) -> tuple[str, bytes]:
    """The zipapp's file name and content; with `python`, with that Python's bytecode of the modules."""
    sources = _entries(python)
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


def build_runner_zipapp(out_dir: str | os.PathLike[str] | None = None, python: str | None = None) -> Path:
    """The path of the zipapp in `out_dir`, written unless that very file is there already: compared
    whole, not by size, since the host runs it for every relay and a file of the same size could be
    anything (kept in a private folder besides: `LocalProvider.create`). With `python`: for that Python."""
    folder = Path(out_dir) if out_dir is not None else default_dir()
    folder.mkdir(parents=True, exist_ok=True)
    name, data = zipapp_bytes(python)
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
