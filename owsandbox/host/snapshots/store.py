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
from pathlib import Path
from typing import Any

from ... import settings
from ...protocol.paths import inside
from ..isolation.resources import human_size
from ..privatedir import UnsafeFolder, private_folder
from .errors import SnapshotError, SnapshotTooLarge, StoreTampered, WorkspaceChanged
from .hostpaths import locate
from .layout import MANIFEST_VERSION, OpenedStore, open_store_dir, write_private
from .reports import RestoreReport, SaveReport, SnapshotInfo, summarize
from .restore import Restorer
from .walk import DIR_FLAGS, READ_FLAGS, Entry, Listing, Scope, known, parent_of, remove_tree_at, scan

__all__ = ["BASELINE", "RestoreReport", "SaveReport", "Scope", "SnapshotError", "SnapshotInfo", "SnapshotStore",
           "SnapshotTooLarge", "StoreTampered", "WorkspaceChanged", "check_name", "refuse_visible", "snapshot_limit",
           "store_root", "summarize"]

LIMIT_ENV = settings.SNAPSHOT_LIMIT
STORE_ENV = settings.SNAPSHOT_DIR
DEFAULT_LIMIT = 4 << 30
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
BASELINE = "@baseline"  # the kernelspec's baseline folder, taken into the store under this name
RACY_SECONDS = 2.0  # a file changed this recently may share its ctime with a later change: hashed again
EMPTY_SHA = hashlib.sha256(b"").hexdigest()
# Folders every box sees read-only (bubblewrap binds them; images have them): a store there would be
# readable from inside.
BOX_VISIBLE = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


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
        write_private(folder, "workspace.txt", (workspace + "\n").encode("utf-8", "surrogateescape"))
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
    def _opened(self, exclusive: bool = True) -> Iterator[OpenedStore]:
        root = os.open(self.folder, DIR_FLAGS)
        try:
            info = os.fstat(root)
            if info.st_uid != os.getuid() or info.st_mode & 0o077:
                raise StoreTampered(f"the snapshot store {self.folder} is not this user's private folder")
            fcntl.flock(root, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            opened = OpenedStore(root)
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

    def _info(self, store: OpenedStore, name: str) -> SnapshotInfo:
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
            remove_tree_at(store.snapshots, name)
            store.collect()
            return before - store.object_bytes()

    @staticmethod
    def _unknown(store: OpenedStore, name: str) -> str:
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
                staged = open_store_dir(store.snapshots, staging, create=True)
                try:
                    files = open_store_dir(staged, "files", create=True)
                    try:
                        rows, fresh_index = self._fill(store, root_fd, listing, index, files, report, used)
                    finally:
                        os.close(files)
                    manifest = {"version": MANIFEST_VERSION, "name": name, "created": time.time(), "source": root,
                                "entries": rows, "skipped": listing.skipped, "excluded": listing.excluded,
                                "specials": sorted(listing.specials)}
                    write_private(staged, "manifest.json", json.dumps(manifest).encode("utf-8", "surrogateescape"))
                except BaseException:
                    os.close(staged)
                    remove_tree_at(store.snapshots, staging)
                    store.collect()
                    raise
                os.close(staged)
                if name in store.names():
                    report.replaced = True
                    old = f".old-{secrets.token_hex(6)}"
                    os.rename(name, old, src_dir_fd=store.snapshots, dst_dir_fd=store.snapshots)
                    os.rename(staging, name, src_dir_fd=store.snapshots, dst_dir_fd=store.snapshots)
                    remove_tree_at(store.snapshots, old)
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

    def _fill(self, store: OpenedStore, root_fd: int, listing: Listing, index: dict[str, list[Any]], files: int,
              report: SaveReport, used: int) -> tuple[list[list[Any]], dict[str, list[Any]]]:
        """Each file's content into the store (or found there), each entry a manifest row; a file's link in
        the snapshot's `files/` is named by its row's number."""
        rows: list[list[Any]] = []
        fresh: dict[str, list[Any]] = {}
        folders: dict[str, int] = {"": os.dup(root_fd)}
        try:
            for entry in listing.entries:
                if entry.kind == "file":
                    parent = self._folder(folders, parent_of(entry.rel))
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
        parent = SnapshotStore._folder(folders, parent_of(rel))
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

    def _save_file(self, store: OpenedStore, parent: int, entry: Entry, index: dict[str, list[Any]], files: int,
                   number: int, report: SaveReport, used: int) -> bool:
        """One file into the snapshot: its content found by its stat in the index, else read (again, when
        it changed while it was read); False when it could not be saved (the report says why)."""
        cached = index.get(entry.rel)
        if known(cached, entry) and store.has_object(cached[4]):
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
                snapshot = open_store_dir(store.snapshots, name)
                try:
                    files = open_store_dir(snapshot, "files")
                    try:
                        index = store.index(root)
                        fresh = Restorer(root_fd, scope, report, files, index, numbers, saved_specials).run(wanted)
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
            if entry.rel in seen or parent_of(entry.rel) not in folders:
                raise StoreTampered(f"the manifest is not in the order a save writes (at {entry.rel!r})")
            seen.add(entry.rel)
            if entry.kind == "dir":
                folders.add(entry.rel)
