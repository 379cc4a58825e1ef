"""Snapshots of a workspace, saved and put back by the host, in a store that no box ever sees.

A course resets a student's lab, an agent tries something and rolls it back: both want the files of
the workspace as they were. The box cannot be asked to do it (nothing it writes is trusted), so the
host does the file work, on its own side of the workspace, in a store outside every mount of every
box (`store_root`: a `snapshots/` folder in this user's private runtime folder, keyed by workspace,
so it outlives a kernel). The rules:

* **Nothing the box planted is followed.** Every folder is opened from its parent's descriptor with
  `O_NOFOLLOW | O_DIRECTORY`, every file with `O_NOFOLLOW | O_NONBLOCK` and checked with `fstat` to
  be the regular file that was listed; a link is saved as a link (its target as text) and put back
  as a link; a restore replaces what is at a name with `rename` in its folder, so a link that the box
  left where a folder was is removed, never written through; FIFOs, sockets and devices are skipped
  with a note (a FIFO would block a reader, a device is not the box's data).
* **What the box cannot write is not the snapshot's.** The workspace guard's read-only and hidden
  paths (the kernel's own Python environment, `.git/config` and hooks, the home's dot entries, ...)
  are neither saved nor put back, and at the top of a home, where the box cannot add or remove an
  entry, a restore adds and removes nothing either (`Scope`): a restore never writes where the box
  could not have. Setuid and setgid bits are never put back (a kernel run as root would make them
  root's).
* **The store is the host's.** Opened from its root with the same flags (a link in it is refused
  loudly: `StoreTampered`), kept mode 700, locked (`flock`) against two kernels of one workspace.
  Contents are kept once, by sha256 (`objects/ab/cdef…`), and each snapshot is a manifest (paths,
  kinds, modes, link targets, times) plus a hard link per file to its object: unchanged files cost
  a directory entry, and an object whose only link is its own is no snapshot's (`drop` removes it).
  A file whose inode, size, mtime and ctime are those of the last save is not read again (the box
  cannot set a ctime); one changed in the last seconds is hashed again next time, as git does.
* **A limit** (`OWSANDBOX_SNAPSHOT_LIMIT`, default 4 GiB) on what the store of one workspace holds;
  a save past it is undone and says so (`SnapshotTooLarge`).

Contents are copied in 1 MiB pieces (hashed as they go), never read whole. This module knows
nothing of kernels or providers: `stopped.py` stops the box around a restore.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import settings
from ...protocol.paths import inside
from ..isolation.resources import human_size
from ..privatedir import UnsafeFolder, private_folder
from .hostpaths import locate

LIMIT_ENV = settings.SNAPSHOT_LIMIT
STORE_ENV = settings.SNAPSHOT_DIR
DEFAULT_LIMIT = 4 << 30
CHUNK = 1 << 20
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
BASELINE = "@baseline"  # the kernelspec's baseline folder, taken into the store under this name
RACY_SECONDS = 2.0  # a file changed this recently may share its ctime with a later change: hashed again
MAX_DEPTH = 256  # folders deeper than this are skipped with a note
MAX_ENTRIES = 500_000  # entries of one tree: a listing is held in memory, and a box can make files without end
MANIFEST_VERSION = 1
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MODE_BITS = 0o1777  # what of a mode is put back: no setuid, no setgid
EMPTY_SHA = hashlib.sha256(b"").hexdigest()
# Folders every box sees read-only (bubblewrap binds them; images have them): a store there would be
# readable from inside.
BOX_VISIBLE = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class SnapshotError(Exception):
    """A snapshot could not be saved, restored, listed or dropped; the message says why."""


class SnapshotTooLarge(SnapshotError):
    """A save would take the store past its limit; nothing of it was kept."""


class StoreTampered(SnapshotError):
    """Something in the snapshot store is not what the host made (a link, a file of another kind)."""


class WorkspaceChanged(SnapshotError):
    """What a restore met in the workspace is not what it listed a moment before (a link, say)."""


def snapshot_limit(env: settings.Settings | Mapping[str, str] | None = None) -> int:
    """The store's limit from OWSANDBOX_SNAPSHOT_LIMIT (`8G`, `500M`), else DEFAULT_LIMIT. `env`: the
    settings, or the variables to read them from (None: this process's)."""
    try:
        limit = settings.settings_of(env).snapshot_limit
    except settings.SettingsError as exc:
        raise SnapshotError(str(exc)) from None
    return DEFAULT_LIMIT if limit is None else limit


def check_name(name: str) -> str:
    if name != BASELINE and not NAME.fullmatch(name):
        raise SnapshotError(f"a snapshot name is letters, digits, '.', '_' and '-' (at most 64, starting with a "
                            f"letter or digit), not {name!r}")
    return name


def store_root(workspace: str, env: settings.Settings | Mapping[str, str] | None = None) -> Path:
    """This workspace's store: OWSANDBOX_SNAPSHOT_DIR, else `snapshots/` in the private runtime folder,
    then a folder named from the workspace's path. Refused where a box could see it."""
    workspace = os.path.realpath(workspace)
    try:
        configured = settings.settings_of(env).snapshot_dir
    except settings.SettingsError as exc:
        raise SnapshotError(str(exc)) from None
    if configured:
        if not configured.startswith(("/", "~")):
            raise SnapshotError(f"{STORE_ENV}={configured!r} must be an absolute path")
        real, below = locate(os.path.abspath(os.path.expanduser(configured)), workspace)
        if below is not None:
            raise SnapshotError(f"the snapshot store {configured} would be inside the workspace {workspace}, where "
                                f"the box could reach it: set {STORE_ENV} to a folder outside it")
        base = Path(real)
        base.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    else:
        from ..privatedir import runtime_root

        base = runtime_root(avoid=workspace) / "snapshots"
    refuse_visible(str(base), workspace)
    try:
        private_folder(base)
        key = hashlib.sha256(workspace.encode("utf-8", "surrogateescape")).hexdigest()[:20]
        folder = private_folder(base / key)
    except UnsafeFolder as exc:
        raise StoreTampered(f"the snapshot store cannot be used: {exc}") from None
    note = folder / "workspace.txt"
    if not note.is_symlink() and not note.exists():
        _write_private(folder, "workspace.txt", (workspace + "\n").encode("utf-8", "surrogateescape"))
    return folder


def refuse_visible(path: str, workspace: str) -> None:
    """A store inside the workspace, or in a folder boxes see read-only, would be the box's to read."""
    if inside(path, workspace) or inside(workspace, path):
        raise SnapshotError(f"the snapshot store {path} would be inside the workspace {workspace} (or hold it), "
                            "where the box could reach it: set OWSANDBOX_SNAPSHOT_DIR to a folder outside it")
    for folder in (*BOX_VISIBLE, os.path.realpath(sys.base_prefix)):
        if folder != "/" and inside(path, folder):
            raise SnapshotError(f"the snapshot store {path} would be in {folder}, which sandboxes see (read-only): "
                                f"set {STORE_ENV} to a folder of your own")


# -- what a snapshot covers ---------------------------------------------------------------------

@dataclass
class Scope:
    """What of a workspace a snapshot covers: everything but `excluded` (relative paths, with why) and,
    in `fixed` folders (the top of a home), no entry added or removed."""

    excluded: dict[str, str] = field(default_factory=dict)
    fixed: set[str] = field(default_factory=set)

    def why_excluded(self, rel: str) -> str | None:
        probe = rel
        while True:
            if probe in self.excluded:
                return self.excluded[probe]
            if "/" not in probe:
                return None
            probe = probe.rsplit("/", 1)[0]

    def is_fixed(self, rel: str) -> bool:
        """Whether `rel`'s folder keeps its entries as they are."""
        return _parent(rel) in self.fixed

    @classmethod
    def of_guard(cls, guard: Any, workspace: str) -> Scope:
        """From a provider's workspace guard (see isolation/guard.py): read-only and hidden paths are
        left out, and a home's top level is fixed."""
        scope = cls()
        if guard is None:
            return scope
        for path in [*guard.read_only, *guard.hidden]:
            if inside(path, workspace) and path != workspace:
                scope.excluded[os.path.relpath(path, workspace)] = guard.why.get(path, "out of the box's reach")
        for top in guard.tops:
            if inside(top, workspace):
                scope.fixed.add("" if top == workspace else os.path.relpath(top, workspace))
        return scope


def _parent(rel: str) -> str:
    return rel.rsplit("/", 1)[0] if "/" in rel else ""


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


# -- entries ------------------------------------------------------------------------------------

@dataclass
class Entry:
    """One thing in a tree: a folder, a regular file or a link (`target`), by its path from the root."""

    rel: str
    kind: str  # "dir", "file", "link"
    mode: int
    size: int = 0
    sha: str = ""
    target: str = ""
    mtime_ns: int = 0
    ino: int = 0
    ctime_ns: int = 0

    def as_row(self) -> list[Any]:
        return [self.rel, self.kind, self.mode, self.size, self.sha, self.target, self.mtime_ns]

    @classmethod
    def from_row(cls, row: Any) -> Entry:
        if not (isinstance(row, list) and len(row) == 7):
            raise StoreTampered(f"a manifest entry is not what a save writes: {str(row)[:200]}")
        rel, kind, mode, size, sha, target, mtime_ns = row
        if kind not in ("dir", "file", "link") or not all(isinstance(v, int) for v in (mode, size, mtime_ns)) \
                or not all(isinstance(v, str) for v in (rel, sha, target)):
            raise StoreTampered(f"a manifest entry is not what a save writes: {str(row)[:200]}")
        _check_rel(rel)
        if kind == "file" and not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise StoreTampered(f"the manifest's entry for {rel!r} names no content")
        return cls(rel, kind, mode, size, sha, target, mtime_ns)


def _known(cached: Any, entry: Entry) -> bool:
    """Whether the index's line for a path says the file is still the one it hashed."""
    return (isinstance(cached, list) and len(cached) == 5 and cached[:4] == [entry.ino, entry.size, entry.mtime_ns,
                                                                              entry.ctime_ns]
            and isinstance(cached[4], str) and re.fullmatch(r"[0-9a-f]{64}", cached[4]) is not None)


def _check_rel(rel: str) -> None:
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        raise StoreTampered(f"the manifest names a path that is not inside the workspace: {rel!r}")


@dataclass
class Listing:
    """A tree as a scan found it: its entries in order (a folder before what is in it), what was skipped
    (path, why) and what the scope left out."""

    entries: list[Entry] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    excluded: list[tuple[str, str]] = field(default_factory=list)
    specials: set[str] = field(default_factory=set)  # FIFOs, sockets, devices (skipped)
    started: float = field(default_factory=time.time)  # when the scan began (what is "recent" is counted from it)


def _kind(mode: int) -> str | None:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "link"
    return None


def _special_name(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "neither a file, a folder nor a link"


def scan(root_fd: int, scope: Scope) -> Listing:
    """Everything under the folder `root_fd`, never following a link, without what `scope` leaves out."""
    listing = Listing()
    _scan_into(root_fd, "", scope, listing, 0)
    return listing


def _too_many() -> SnapshotTooLarge:
    return SnapshotTooLarge(f"the workspace has more than {MAX_ENTRIES:,} files, folders and links, more than a "
                            "snapshot takes: leave generated files (node_modules, build output) out of it")


def _scan_into(fd: int, rel: str, scope: Scope, listing: Listing, depth: int) -> None:
    names: list[str] = []
    try:
        with os.scandir(fd) as entries:  # read as they come: a folder of millions of names is never held whole
            for found in entries:
                names.append(found.name)
                if len(names) + len(listing.entries) > MAX_ENTRIES:
                    raise _too_many()
    except OSError as exc:
        listing.skipped.append((rel or ".", f"cannot be listed: {exc.strerror}"))
        return
    names.sort()
    for name in names:
        path = _join(rel, name)
        why = scope.why_excluded(path)
        if why is not None:
            listing.excluded.append((path, why))
            continue
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue  # gone meanwhile
        kind = _kind(info.st_mode)
        if kind is None:
            listing.skipped.append((path, f"{_special_name(info.st_mode)}, not saved"))
            listing.specials.add(path)
            continue
        if len(listing.entries) >= MAX_ENTRIES:
            raise _too_many()
        entry = Entry(path, kind, stat.S_IMODE(info.st_mode), info.st_size if kind == "file" else 0,
                      mtime_ns=info.st_mtime_ns, ino=info.st_ino, ctime_ns=info.st_ctime_ns)
        if kind == "link":
            try:
                entry.target = os.readlink(name, dir_fd=fd)
            except OSError:
                continue
        listing.entries.append(entry)
        if kind == "dir":
            if depth >= MAX_DEPTH:
                listing.skipped.append((path, f"deeper than {MAX_DEPTH} folders, its contents not saved"))
                continue
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                listing.skipped.append((path, f"cannot be opened: {exc.strerror}"))
                continue
            try:
                if os.fstat(child).st_ino != info.st_ino:
                    listing.skipped.append((path, "changed while it was listed"))
                    continue
                _scan_into(child, path, scope, listing, depth + 1)
            finally:
                os.close(child)


# -- the store's own files ------------------------------------------------------------------------

def _open_store_dir(parent: int, name: str, create: bool = False) -> int:
    """A folder of the store, from its parent's descriptor; a link or a file there is tampering."""
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StoreTampered(f"{name!r} in the snapshot store is a link or a file, not the folder the host made: "
                                "refused (remove the store's folder to start again)") from None
        raise


def _open_store_file(parent: int, name: str) -> int:
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreTampered(f"{name!r} in the snapshot store is a link, not a file the host made: refused") \
                from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreTampered(f"{name!r} in the snapshot store is not a regular file: refused")
    return fd


def _read_store_json(parent: int, name: str, limit: int = 1 << 30) -> Any:
    fd = _open_store_file(parent, name)
    try:
        chunks, size = [], 0
        while chunk := os.read(fd, CHUNK):
            size += len(chunk)
            if size > limit:
                raise StoreTampered(f"{name!r} in the snapshot store is larger than any the host writes")
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        raise StoreTampered(f"{name!r} in the snapshot store is not the JSON the host wrote") from None


def _write_private(folder: Path | int, name: str, data: bytes) -> None:
    """A small file of the store, written whole and renamed into place."""
    parent = os.open(folder, DIR_FLAGS) if not isinstance(folder, int) else folder
    try:
        temporary = f".tmp-{secrets.token_hex(6)}"
        fd = os.open(temporary, NEW_FLAGS, 0o600, dir_fd=parent)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    finally:
        if not isinstance(folder, int):
            os.close(parent)


def _remove_tree_at(parent: int, name: str, keep: Any = None, rel: str = "") -> bool:
    """Remove `name` (a folder, from its parent's descriptor) and what is in it, never following a link;
    `keep(rel)` true leaves that entry (and so its folders). True when the folder itself went."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            os.unlink(name, dir_fd=parent)
            return True
        if exc.errno == errno.ENOENT:
            return True
        raise
    try:
        whole = _empty(fd, keep, rel)
    finally:
        os.close(fd)
    if whole:
        os.rmdir(name, dir_fd=parent)
    return whole


def _empty(fd: int, keep: Any = None, rel: str = "") -> bool:
    """Remove what is in the folder `fd`, but what `keep(rel)` keeps, reading its entries as they come
    (a folder of millions of names is never listed whole); True when nothing is left."""
    whole = True
    with os.scandir(fd) as entries:
        for child in entries:
            path = _join(rel, child.name)
            if keep is not None and keep(path):
                whole = False
            elif child.is_dir(follow_symlinks=False):
                whole = _remove_tree_at(fd, child.name, keep, path) and whole
            else:
                os.unlink(child.name, dir_fd=fd)
    return whole


def _copy(source: int, target: int, digest: Any = None) -> int:
    """Copy `source` to `target` from where each is, in CHUNK pieces; the bytes copied."""
    copied = 0
    while True:
        chunk = os.read(source, CHUNK)
        if not chunk:
            return copied
        if digest is not None:
            digest.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view):]
        copied += len(chunk)


# -- reports --------------------------------------------------------------------------------------

@dataclass
class SnapshotInfo:
    name: str
    created: float
    files: int
    folders: int
    links: int
    bytes: int
    source: str


@dataclass
class SaveReport:
    name: str
    files: int = 0
    folders: int = 0
    links: int = 0
    bytes: int = 0  # of the files saved
    read_bytes: int = 0  # what had to be read (the rest was unchanged since the last save)
    new_bytes: int = 0  # what the store holds more now
    store_bytes: int = 0
    limit: int = 0
    replaced: bool = False
    skipped: list[tuple[str, str]] = field(default_factory=list)
    excluded: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class RestoreReport:
    name: str
    written: int = 0  # files written back (changed or deleted since the save)
    unchanged: int = 0
    removed: int = 0  # entries added since the save, removed
    folders: int = 0  # folders made again
    links: int = 0  # links put back
    modes: int = 0  # modes put back on entries otherwise unchanged
    bytes: int = 0
    kept: list[tuple[str, str]] = field(default_factory=list)  # left as they are, and why
    excluded: list[tuple[str, str]] = field(default_factory=list)
    setuid_dropped: list[str] = field(default_factory=list)
    seconds: float = 0.0


def summarize(paths: list[tuple[str, str]], most: int = 5) -> str:
    """`a (why), b (why) and 3 more`."""
    shown = ", ".join(f"{path} ({why})" for path, why in paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


# -- the store ------------------------------------------------------------------------------------

class SnapshotStore:
    """The snapshots of one workspace (see the module's docstring). Every method takes the store's lock."""

    def __init__(self, folder: Path, limit: int | None = None) -> None:
        self.folder = folder
        self.limit = snapshot_limit() if limit is None else limit

    @classmethod
    def for_workspace(cls, workspace: str, limit: int | None = None,
                      env: settings.Settings | Mapping[str, str] | None = None) -> SnapshotStore:
        return cls(store_root(workspace, env), snapshot_limit(env) if limit is None else limit)

    @contextmanager
    def _opened(self, exclusive: bool = True) -> Iterator[_Opened]:
        root = os.open(self.folder, DIR_FLAGS)
        try:
            info = os.fstat(root)
            if info.st_uid != os.getuid() or info.st_mode & 0o077:
                raise StoreTampered(f"the snapshot store {self.folder} is not this user's private folder")
            fcntl.flock(root, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            opened = _Opened(root)
            if exclusive:
                opened.tidy()
            try:
                yield opened
            finally:
                opened.close()
        finally:
            os.close(root)  # releases the lock

    # -- list, drop -------------------------------------------------------------------------

    def list(self) -> list[SnapshotInfo]:
        with self._opened(exclusive=False) as store:
            return [self._info(store, name) for name in store.names()]

    def _info(self, store: _Opened, name: str) -> SnapshotInfo:
        manifest = store.manifest(name)
        entries = [Entry.from_row(row) for row in manifest.get("entries", [])]
        return SnapshotInfo(name, float(manifest.get("created", 0)), sum(e.kind == "file" for e in entries),
                            sum(e.kind == "dir" for e in entries), sum(e.kind == "link" for e in entries),
                            sum(e.size for e in entries if e.kind == "file"), str(manifest.get("source", "")))

    def usage(self) -> int:
        """The bytes the store's contents hold (each content once)."""
        with self._opened(exclusive=False) as store:
            return store.object_bytes()

    def exists(self, name: str) -> bool:
        with self._opened(exclusive=False) as store:
            return check_name(name) in store.names()

    def require(self, name: str) -> None:
        """SnapshotError naming the snapshots there are, when `name` is not one."""
        with self._opened(exclusive=False) as store:
            if check_name(name) not in store.names():
                raise SnapshotError(self._unknown(store, name))

    def drop(self, name: str) -> int:
        """Forget a snapshot; the bytes freed (contents no other snapshot has)."""
        check_name(name)
        with self._opened() as store:
            if name not in store.names():
                raise SnapshotError(self._unknown(store, name))
            before = store.object_bytes()
            _remove_tree_at(store.snapshots, name)
            store.collect()
            return before - store.object_bytes()

    @staticmethod
    def _unknown(store: _Opened, name: str) -> str:
        names = ", ".join(n for n in store.names()) or "none yet"
        return f"no snapshot named {name!r} (saved: {names})"

    # -- save -------------------------------------------------------------------------------

    def save(self, name: str, root: str, scope: Scope | None = None) -> SaveReport:
        """Save the tree at `root` (a folder of this machine) as snapshot `name`, replacing one of that name."""
        started = time.monotonic()
        check_name(name)
        scope = scope or Scope()
        report = SaveReport(name, limit=self.limit)
        root_fd = os.open(root, DIR_FLAGS)
        try:
            with self._opened() as store:
                listing = scan(root_fd, scope)
                report.skipped, report.excluded = listing.skipped, listing.excluded
                index = store.index(root)
                used = store.object_bytes()
                staging = f".new-{secrets.token_hex(6)}"
                staged = _open_store_dir(store.snapshots, staging, create=True)
                try:
                    files = _open_store_dir(staged, "files", create=True)
                    try:
                        rows, fresh_index = self._fill(store, root_fd, listing, index, files, report, used)
                    finally:
                        os.close(files)
                    manifest = {"version": MANIFEST_VERSION, "name": name, "created": time.time(), "source": root,
                                "entries": rows, "skipped": listing.skipped, "excluded": listing.excluded,
                                "specials": sorted(listing.specials)}
                    _write_private(staged, "manifest.json", json.dumps(manifest).encode("utf-8", "surrogateescape"))
                except BaseException:
                    os.close(staged)
                    _remove_tree_at(store.snapshots, staging)
                    store.collect()
                    raise
                os.close(staged)
                if name in store.names():
                    report.replaced = True
                    old = f".old-{secrets.token_hex(6)}"
                    os.rename(name, old, src_dir_fd=store.snapshots, dst_dir_fd=store.snapshots)
                    os.rename(staging, name, src_dir_fd=store.snapshots, dst_dir_fd=store.snapshots)
                    _remove_tree_at(store.snapshots, old)
                    store.collect()
                else:
                    os.rename(staging, name, src_dir_fd=store.snapshots, dst_dir_fd=store.snapshots)
                store.write_index(root, fresh_index)
                report.store_bytes = store.object_bytes()
                report.new_bytes = max(report.store_bytes - used, 0)
        finally:
            os.close(root_fd)
        report.seconds = time.monotonic() - started
        return report

    def _fill(self, store: _Opened, root_fd: int, listing: Listing, index: dict[str, list[Any]], files: int,
              report: SaveReport, used: int) -> tuple[list[list[Any]], dict[str, list[Any]]]:
        """Each file's content into the store (or found there), each entry a manifest row; a file's link in
        the snapshot's `files/` is named by its row's number."""
        rows: list[list[Any]] = []
        fresh: dict[str, list[Any]] = {}
        folders: dict[str, int] = {"": os.dup(root_fd)}
        try:
            for entry in listing.entries:
                if entry.kind == "file":
                    parent = self._folder(folders, _parent(entry.rel))
                    if parent is None:
                        report.skipped.append((entry.rel, "its folder changed while it was saved"))
                        continue
                    if not self._save_file(store, parent, entry, index, files, len(rows), report, used):
                        continue
                    report.files += 1
                    report.bytes += entry.size
                    if listing.started - entry.ctime_ns / 1e9 > RACY_SECONDS:
                        fresh[entry.rel] = [entry.ino, entry.size, entry.mtime_ns, entry.ctime_ns, entry.sha]
                elif entry.kind == "dir":
                    report.folders += 1
                else:
                    report.links += 1
                rows.append(entry.as_row())
        finally:
            for fd in folders.values():
                os.close(fd)
        return rows, fresh

    @staticmethod
    def _folder(folders: dict[str, int], rel: str) -> int | None:
        """The descriptor of a folder of the tree being saved, opened from its parent's."""
        if rel in folders:
            return folders[rel]
        parent = SnapshotStore._folder(folders, _parent(rel))
        if parent is None:
            return None
        try:
            fd = os.open(rel.rsplit("/", 1)[-1], DIR_FLAGS, dir_fd=parent)
        except OSError:
            return None
        if len(folders) > 64:  # keep only a few open: a save walks the tree in order
            for key in [k for k in folders if k and not inside(rel, k)]:
                os.close(folders.pop(key))
        folders[rel] = fd
        return fd

    def _save_file(self, store: _Opened, parent: int, entry: Entry, index: dict[str, list[Any]], files: int,
                   number: int, report: SaveReport, used: int) -> bool:
        """One file into the snapshot: its content found by its stat in the index, else read (again, when
        it changed while it was read); False when it could not be saved (the report says why)."""
        cached = index.get(entry.rel)
        if _known(cached, entry) and store.has_object(cached[4]):
            entry.sha = cached[4]
        elif entry.size == 0:
            entry.sha = EMPTY_SHA
        else:
            name = entry.rel.rsplit("/", 1)[-1]
            for attempt in range(3):
                try:
                    source = os.open(name, READ_FLAGS, dir_fd=parent)
                except OSError as exc:
                    report.skipped.append((entry.rel, f"cannot be read: {exc.strerror}"))
                    return False
                try:
                    before = os.fstat(source)
                    if not stat.S_ISREG(before.st_mode) or before.st_ino != entry.ino:
                        report.skipped.append((entry.rel, "changed kind while it was saved"))
                        return False
                    sha, size = store.take_in(source)
                    after = os.fstat(source)
                finally:
                    os.close(source)
                report.read_bytes += size
                if (before.st_size, before.st_mtime_ns, before.st_ctime_ns) == \
                        (after.st_size, after.st_mtime_ns, after.st_ctime_ns):
                    break
                if attempt == 2:
                    report.skipped.append((entry.rel, "kept changing while it was saved: its last reading is kept"))
            entry.sha, entry.size, entry.mtime_ns, entry.ctime_ns = sha, size, after.st_mtime_ns, after.st_ctime_ns
            if used + store.added_bytes > self.limit:
                raise SnapshotTooLarge(
                    f"saving {report.name!r} would take this workspace's snapshot store past its limit of "
                    f"{human_size(self.limit)} ({human_size(used)} held before, {human_size(store.added_bytes)} "
                    f"of new contents so far, at {entry.rel}): nothing of it was kept. Drop a snapshot "
                    f"(%snapshot drop NAME), leave large files out of the workspace, or raise {LIMIT_ENV}")
        if entry.sha != EMPTY_SHA:
            store.link(entry.sha, files, str(number))
        return True

    # -- restore ----------------------------------------------------------------------------

    def restore(self, name: str, root: str, scope: Scope | None = None) -> RestoreReport:
        """Make the tree at `root` what snapshot `name` saved: what was added since removed, what changed or
        was deleted written back (with modes and links), never writing where `scope` says the box cannot.
        Nothing else may write in `root` meanwhile: the caller stops the box (stopped.py)."""
        started = time.monotonic()
        check_name(name)
        scope = scope or Scope()
        report = RestoreReport(name)
        root_fd = os.open(root, DIR_FLAGS)
        try:
            with self._opened() as store:
                if name not in store.names():
                    raise SnapshotError(self._unknown(store, name))
                manifest = store.manifest(name)
                wanted = [Entry.from_row(row) for row in manifest.get("entries", [])]
                numbers = {entry.rel: number for number, entry in enumerate(wanted)}
                saved_specials = {str(path) for path in manifest.get("specials", [])}
                self._check_order(wanted)
                snapshot = _open_store_dir(store.snapshots, name)
                try:
                    files = _open_store_dir(snapshot, "files")
                    try:
                        index = store.index(root)
                        fresh = _Restorer(root_fd, scope, report, files, index, numbers, saved_specials).run(wanted)
                    finally:
                        os.close(files)
                finally:
                    os.close(snapshot)
                store.write_index(root, fresh)
        finally:
            os.close(root_fd)
        report.seconds = time.monotonic() - started
        return report

    @staticmethod
    def _check_order(entries: list[Entry]) -> None:
        """Each entry's folder comes before it, as a folder; no path twice."""
        folders = {""}
        seen: set[str] = set()
        for entry in entries:
            if entry.rel in seen or _parent(entry.rel) not in folders:
                raise StoreTampered(f"the manifest is not in the order a save writes (at {entry.rel!r})")
            seen.add(entry.rel)
            if entry.kind == "dir":
                folders.add(entry.rel)


class _Opened:
    """The store's folders, opened for one locked operation."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.objects = _open_store_dir(root, "objects", create=True)
        self.snapshots = _open_store_dir(root, "snapshots", create=True)
        self._buckets: dict[str, int] = {}
        self.added_bytes = 0  # contents new to the store in this operation

    def close(self) -> None:
        for fd in self._buckets.values():
            os.close(fd)
        self._buckets.clear()
        os.close(self.objects)
        os.close(self.snapshots)

    def names(self) -> list[str]:
        return sorted(n for n in os.listdir(self.snapshots) if not n.startswith("."))

    def tidy(self) -> None:
        """What an operation that was killed left (a half-made snapshot, a content being copied in):
        called with the lock held, so nothing is under way."""
        stale = [n for n in os.listdir(self.snapshots) if n.startswith((".new-", ".old-"))]
        for name in stale:
            _remove_tree_at(self.snapshots, name)
        if stale or any(n.startswith(".in-") for n in os.listdir(self.objects)):
            self.collect()

    def manifest(self, name: str) -> dict[str, Any]:
        folder = _open_store_dir(self.snapshots, name)
        try:
            manifest = _read_store_json(folder, "manifest.json")
        finally:
            os.close(folder)
        if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION:
            raise StoreTampered(f"the manifest of {name!r} is not one this version writes")
        return manifest

    def index(self, root: str) -> dict[str, list[Any]]:
        try:
            found = _read_store_json(self.root, "index.json")
        except FileNotFoundError:
            return {}
        mine = found.get(root, {}) if isinstance(found, dict) else {}
        return mine if isinstance(mine, dict) else {}

    def write_index(self, root: str, entries: dict[str, list[Any]]) -> None:
        try:
            found = _read_store_json(self.root, "index.json")
        except FileNotFoundError:
            found = {}
        found = found if isinstance(found, dict) else {}
        found[root] = entries
        _write_private(self.root, "index.json", json.dumps(found).encode("utf-8", "surrogateescape"))

    def bucket(self, sha: str, create: bool = False) -> int:
        if sha[:2] not in self._buckets:
            self._buckets[sha[:2]] = _open_store_dir(self.objects, sha[:2], create=create)
        return self._buckets[sha[:2]]

    def has_object(self, sha: str) -> bool:
        try:
            info = os.stat(sha[2:], dir_fd=self.bucket(sha, create=True), follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(info.st_mode):
            raise StoreTampered(f"the content {sha[:12]}… in the snapshot store is not a regular file: refused")
        return True

    def take_in(self, source: int) -> tuple[str, int]:
        """Copy an open file into the store, hashing it as it goes; its sha256 and size."""
        temporary = f".in-{secrets.token_hex(6)}"
        target = os.open(temporary, NEW_FLAGS, 0o400, dir_fd=self.objects)
        digest = hashlib.sha256()
        try:
            try:
                size = _copy(source, target, digest)
            finally:
                os.close(target)
            sha = digest.hexdigest()
            if self.has_object(sha):
                os.unlink(temporary, dir_fd=self.objects)
            else:
                os.rename(temporary, sha[2:], src_dir_fd=self.objects, dst_dir_fd=self.bucket(sha, create=True))
                self.added_bytes += size
        except BaseException:
            try:
                os.unlink(temporary, dir_fd=self.objects)
            except FileNotFoundError:
                pass
            raise
        return sha, size

    def link(self, sha: str, folder: int, name: str) -> None:
        """A hard link `folder/name` to the content `sha` (a copy past the file system's link limit)."""
        bucket = self.bucket(sha)
        try:
            os.link(sha[2:], name, src_dir_fd=bucket, dst_dir_fd=folder, follow_symlinks=False)
        except OSError as exc:
            if exc.errno != errno.EMLINK:
                raise
            source = _open_store_file(bucket, sha[2:])
            try:
                target = os.open(name, NEW_FLAGS, 0o400, dir_fd=folder)
                try:
                    _copy(source, target)
                finally:
                    os.close(target)
            finally:
                os.close(source)

    def object_bytes(self) -> int:
        total = 0
        for bucket in os.listdir(self.objects):
            if bucket.startswith("."):
                continue
            fd = _open_store_dir(self.objects, bucket)
            try:
                for name in os.listdir(fd):
                    total += os.stat(name, dir_fd=fd, follow_symlinks=False).st_size
            finally:
                os.close(fd)
        return total

    def collect(self) -> None:
        """Remove the contents no snapshot links to (their only link is their own), and stray temporaries."""
        for bucket in os.listdir(self.objects):
            if bucket.startswith(".in-"):
                os.unlink(bucket, dir_fd=self.objects)
                continue
            fd = _open_store_dir(self.objects, bucket)
            try:
                for name in os.listdir(fd):
                    if os.stat(name, dir_fd=fd, follow_symlinks=False).st_nlink <= 1:
                        os.unlink(name, dir_fd=fd)
            finally:
                os.close(fd)


class _Restorer:
    """One restore's file work on the workspace (see SnapshotStore.restore)."""

    def __init__(self, root: int, scope: Scope, report: RestoreReport, files: int, index: dict[str, list[Any]],
                 numbers: dict[str, int], saved_specials: set[str]) -> None:
        self.root = root
        self.scope = scope
        self.report = report
        self.files = files
        self.index = index
        self.numbers = numbers
        self.saved_specials = saved_specials
        self.fresh: dict[str, list[Any]] = {}

    def run(self, wanted: list[Entry]) -> dict[str, list[Any]]:
        try:
            current = scan(self.root, self.scope)
        except SnapshotTooLarge:
            # More entries than a listing holds (a box made files without end): all of them go, as they are
            # read, and the snapshot comes back whole into what is left.
            self._clear()
            current = scan(self.root, self.scope)
        self.report.excluded = current.excluded
        by_path = {entry.rel: entry for entry in wanted}
        opened = self._open_up(current, by_path)
        self._remove_added(current, by_path)
        now = {entry.rel: entry for entry in current.entries}
        left_out: list[str] = []  # folders not made again: nothing inside them is either
        for entry in wanted:
            if self.scope.why_excluded(entry.rel) is not None or any(inside(entry.rel, f) for f in left_out[-1:]):
                continue
            present = now.get(entry.rel)
            if present is not None and present.kind != entry.kind:
                present = None if not self.scope.is_fixed(entry.rel) else present  # removed above, unless fixed
            if self.scope.is_fixed(entry.rel) and (present is None or present.kind != entry.kind):
                self.report.kept.append((entry.rel, "not put back: nothing can be made at the top of the home"))
                if entry.kind == "dir":
                    left_out.append(entry.rel)
                continue
            if entry.kind == "dir":
                self._folder(entry, present)
            elif entry.kind == "link":
                self._link(entry, present)
            else:
                self._file(entry, present)
        for entry in reversed(wanted):  # modes and times of folders last: writing in them changed their mtime
            if entry.kind == "dir" and self.scope.why_excluded(entry.rel) is None \
                    and not any(inside(entry.rel, f) for f in left_out):
                self._folder_mode(entry)
                opened.pop(entry.rel, None)
        for rel, mode in opened.items():  # folders the restore kept but did not have: their own mode again
            try:
                fd = self._walk(rel)
            except (OSError, WorkspaceChanged):
                continue
            try:
                os.fchmod(fd, mode)
            finally:
                self._release(fd)
        return self.fresh

    def _open_up(self, current: Listing, wanted: dict[str, Entry]) -> dict[str, int]:
        """Folders the owner may not write or enter are opened up for the restore (their modes are put back
        after it): a kernel that is not root could not change what is in them. Their old modes, by path."""
        opened: dict[str, int] = {}
        for entry in current.entries:
            if entry.kind != "dir" or entry.mode & 0o700 == 0o700:
                continue
            fd = self._walk(entry.rel)
            try:
                os.fchmod(fd, entry.mode | 0o700)
            finally:
                self._release(fd)
            opened[entry.rel] = entry.mode
        return opened

    # -- what goes --------------------------------------------------------------------------

    def _remove_added(self, current: Listing, wanted: dict[str, Entry]) -> None:
        gone: list[str] = []  # folders removed (what was to stay in them, stayed)
        for entry in current.entries:
            if any(inside(entry.rel, folder) for folder in gone[-1:]):
                continue
            keep = wanted.get(entry.rel)
            if keep is not None and keep.kind == entry.kind:
                continue
            if self.scope.is_fixed(entry.rel):
                self.report.kept.append((entry.rel, "left: nothing at the top of the home is removed"))
                if entry.kind == "dir":
                    gone.append(entry.rel)
                continue
            parent = self._walk(_parent(entry.rel))
            try:
                name = entry.rel.rsplit("/", 1)[-1]
                if entry.kind == "dir":
                    _remove_tree_at(parent, name, self._kept_inside, entry.rel)
                    gone.append(entry.rel)
                else:
                    os.unlink(name, dir_fd=parent)
                self.report.removed += 1
            finally:
                self._release(parent)
        for path in sorted(current.specials, reverse=True):
            if path in self.saved_specials or self.scope.is_fixed(path):
                self.report.kept.append((path, "a FIFO, socket or device: left as it is"))
                continue
            if any(inside(path, folder) for folder in gone):
                continue
            parent = self._walk(_parent(path))
            try:
                os.unlink(path.rsplit("/", 1)[-1], dir_fd=parent)
                self.report.removed += 1
            except FileNotFoundError:
                pass
            finally:
                self._release(parent)

    def _clear(self, fd: int | None = None, rel: str = "") -> None:
        """Everything the box could have made removed: the scope's paths and saved FIFOs stay, and so
        does each entry of a fixed folder (what is inside it goes)."""
        fd = self.root if fd is None else fd
        if rel not in self.scope.fixed:
            _empty(fd, self._kept_inside, rel)
            return
        for child in os.listdir(fd):
            path = _join(rel, child)
            if self._kept_inside(path):
                continue
            if stat.S_ISDIR(os.stat(child, dir_fd=fd, follow_symlinks=False).st_mode):
                inner = os.open(child, DIR_FLAGS, dir_fd=fd)
                try:
                    _empty(inner, self._kept_inside, path)
                finally:
                    os.close(inner)

    def _kept_inside(self, rel: str) -> bool:
        return self.scope.why_excluded(rel) is not None or rel in self.saved_specials

    # -- what comes back --------------------------------------------------------------------

    def _walk(self, rel: str) -> int:
        """The folder `rel` of the workspace, opened component by component, never through a link."""
        fd = os.dup(self.root)
        for part in rel.split("/") if rel else []:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise WorkspaceChanged(f"{rel} in the workspace is not a folder any more (a link or a file "
                                           "appeared there during the restore): nothing was written through it") \
                        from None
                raise
            os.close(fd)
            fd = child
        return fd

    @staticmethod
    def _release(fd: int) -> None:
        os.close(fd)

    def _folder(self, entry: Entry, present: Entry | None) -> None:
        if present is not None:
            return
        parent = self._walk(_parent(entry.rel))
        try:
            os.mkdir(entry.rel.rsplit("/", 1)[-1], 0o700, dir_fd=parent)
            self.report.folders += 1
        finally:
            self._release(parent)

    def _folder_mode(self, entry: Entry) -> None:
        fd = self._walk(entry.rel)
        try:
            mode = self._mode(entry)
            if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                os.fchmod(fd, mode)
            os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
        finally:
            self._release(fd)

    def _mode(self, entry: Entry) -> int:
        """The mode to put back: without setuid and setgid (a kernel run as root would make them root's)."""
        if entry.mode & ~MODE_BITS & 0o7777:
            self.report.setuid_dropped.append(entry.rel)
        return entry.mode & MODE_BITS

    def _link(self, entry: Entry, present: Entry | None) -> None:
        if present is not None and present.target == entry.target:
            return
        parent = self._walk(_parent(entry.rel))
        try:
            temporary = f".owsandbox-restore-{secrets.token_hex(6)}"
            os.symlink(entry.target, temporary, dir_fd=parent)
            self._put(parent, temporary, entry.rel.rsplit("/", 1)[-1])
            self.report.links += 1
        finally:
            self._release(parent)

    def _file(self, entry: Entry, present: Entry | None) -> None:
        name = entry.rel.rsplit("/", 1)[-1]
        parent = self._walk(_parent(entry.rel))
        try:
            mode = self._mode(entry)
            if present is not None and self._unchanged(present, entry):
                self.report.unchanged += 1
                if present.mode != mode or present.mtime_ns != entry.mtime_ns:
                    fd = os.open(name, READ_FLAGS, dir_fd=parent)
                    try:
                        if stat.S_ISREG(os.fstat(fd).st_mode):
                            os.fchmod(fd, mode)
                            os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
                            self.report.modes += 1
                    finally:
                        os.close(fd)
                self._remember(parent, name, entry)
                return
            temporary = f".owsandbox-restore-{secrets.token_hex(6)}"
            target = os.open(temporary, NEW_FLAGS, 0o600, dir_fd=parent)
            try:
                if entry.size:
                    source = _open_store_file(self.files, str(self.numbers[entry.rel]))
                    try:
                        self.report.bytes += _copy(source, target)
                    finally:
                        os.close(source)
                os.fchmod(target, mode)
                os.utime(target, ns=(entry.mtime_ns, entry.mtime_ns))
            except BaseException:
                os.close(target)
                os.unlink(temporary, dir_fd=parent)
                raise
            os.close(target)
            self._put(parent, temporary, name)
            self.report.written += 1
            self._remember(parent, name, entry)
        finally:
            self._release(parent)

    def _unchanged(self, present: Entry, entry: Entry) -> bool:
        """Whether the file now there is the saved content, as the last save or restore knew it by its stat."""
        if entry.size == 0:
            return present.size == 0
        known = self.index.get(present.rel)
        return bool(known) and known == [present.ino, present.size, present.mtime_ns, present.ctime_ns, entry.sha]

    def _put(self, parent: int, temporary: str, name: str) -> None:
        """`temporary` in place of `name`: whatever is there (a file, a link) is replaced, not followed."""
        try:
            os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
        except IsADirectoryError:
            _remove_tree_at(parent, name)
            os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)

    def _remember(self, parent: int, name: str, entry: Entry) -> None:
        """The file's stat as it is now, for the next save or restore. A file just written is remembered
        too, unlike in a save: nothing else writes while a restore runs (the caller stops the box), and a
        write after it, which starting a new box comes long before, gets a later ctime."""
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return
        self.fresh[entry.rel] = [info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, entry.sha]
