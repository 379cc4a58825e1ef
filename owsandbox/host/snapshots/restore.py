"""A restore's file work on the workspace: what was added since the save removed, what changed or
was deleted written back (with modes and links), never writing where the scope says the box cannot.

A restore replaces what is at a name with `rename` in its folder, so a link that the box left where a
folder was is removed, never written through. Setuid and setgid bits are never put back (a kernel run
as root would make them root's).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from typing import Any

from ...protocol.paths import inside
from .errors import SnapshotTooLarge, WorkspaceChanged
from .layout import open_store_file
from .reports import RestoreReport
from .walk import (
    DIR_FLAGS,
    NEW_FLAGS,
    READ_FLAGS,
    Entry,
    Listing,
    Scope,
    copy_fd,
    empty_folder,
    join_rel,
    parent_of,
    remove_tree_at,
    scan,
)

MODE_BITS = 0o1777  # what of a mode is put back: no setuid, no setgid


class Restorer:
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
            parent = self._walk(parent_of(entry.rel))
            try:
                name = entry.rel.rsplit("/", 1)[-1]
                if entry.kind == "dir":
                    remove_tree_at(parent, name, self._kept_inside, entry.rel)
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
            parent = self._walk(parent_of(path))
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
            empty_folder(fd, self._kept_inside, rel)
            return
        for child in os.listdir(fd):
            path = join_rel(rel, child)
            if self._kept_inside(path):
                continue
            if stat.S_ISDIR(os.stat(child, dir_fd=fd, follow_symlinks=False).st_mode):
                inner = os.open(child, DIR_FLAGS, dir_fd=fd)
                try:
                    empty_folder(inner, self._kept_inside, path)
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
        parent = self._walk(parent_of(entry.rel))
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
        parent = self._walk(parent_of(entry.rel))
        try:
            temporary = f".owsandbox-restore-{secrets.token_hex(6)}"
            os.symlink(entry.target, temporary, dir_fd=parent)
            self._put(parent, temporary, entry.rel.rsplit("/", 1)[-1])
            self.report.links += 1
        finally:
            self._release(parent)

    def _file(self, entry: Entry, present: Entry | None) -> None:
        name = entry.rel.rsplit("/", 1)[-1]
        parent = self._walk(parent_of(entry.rel))
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
                    source = open_store_file(self.files, str(self.numbers[entry.rel]))
                    try:
                        self.report.bytes += copy_fd(source, target)
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
            remove_tree_at(parent, name)
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
