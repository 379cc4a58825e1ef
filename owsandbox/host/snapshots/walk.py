"""A workspace's tree, walked and taken apart without following anything the box planted.

Every folder is opened from its parent's descriptor with `O_NOFOLLOW | O_DIRECTORY`; a link is listed
as a link (its target as text); FIFOs, sockets and devices are skipped with a note. A listing is held
in memory, so it is bounded (`MAX_ENTRIES`, `MAX_DEPTH`); a folder's entries are read as they come.
What a snapshot covers is a `Scope`; each thing found is an `Entry`.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from ...protocol.paths import inside
from .errors import SnapshotTooLarge, StoreTampered

CHUNK = 1 << 20
MAX_DEPTH = 256  # folders deeper than this are skipped with a note
MAX_ENTRIES = 500_000  # entries of one tree: a listing is held in memory, and a box can make files without end
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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
        return parent_of(rel) in self.fixed

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


def parent_of(rel: str) -> str:
    return rel.rsplit("/", 1)[0] if "/" in rel else ""


def join_rel(parent: str, name: str) -> str:
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


def known(cached: Any, entry: Entry) -> bool:
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
        path = join_rel(rel, name)
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


# -- removing and copying, never through a link ---------------------------------------------------

def remove_tree_at(parent: int, name: str, keep: Any = None, rel: str = "") -> bool:
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
        whole = empty_folder(fd, keep, rel)
    finally:
        os.close(fd)
    if whole:
        os.rmdir(name, dir_fd=parent)
    return whole


def empty_folder(fd: int, keep: Any = None, rel: str = "") -> bool:
    """Remove what is in the folder `fd`, but what `keep(rel)` keeps, reading its entries as they come
    (a folder of millions of names is never listed whole); True when nothing is left."""
    whole = True
    with os.scandir(fd) as entries:
        for child in entries:
            path = join_rel(rel, child.name)
            if keep is not None and keep(path):
                whole = False
            elif child.is_dir(follow_symlinks=False):
                whole = remove_tree_at(fd, child.name, keep, path) and whole
            else:
                os.unlink(child.name, dir_fd=fd)
    return whole


def copy_fd(source: int, target: int, digest: Any = None) -> int:
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
