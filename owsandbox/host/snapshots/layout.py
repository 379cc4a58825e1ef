"""The store's own files: its folders, the manifests, the index of what was hashed, the contents.

Opened from the store's root with the same flags as the workspace (a link in it is refused loudly:
`StoreTampered`). Contents are kept once, by sha256 (`objects/ab/cdef…`); each snapshot is a folder
of a manifest and a hard link per file to its content (`snapshots/NAME/`); a small file is written
whole and renamed into place.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from .errors import StoreTampered
from .walk import CHUNK, DIR_FLAGS, NEW_FLAGS, READ_FLAGS, copy_fd, remove_tree_at

MANIFEST_VERSION = 1


def open_store_dir(parent: int, name: str, create: bool = False) -> int:
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


def open_store_file(parent: int, name: str) -> int:
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
    fd = open_store_file(parent, name)
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


def write_private(folder: Path | int, name: str, data: bytes) -> None:
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


class OpenedStore:
    """The store's folders, opened for one locked operation."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.objects = open_store_dir(root, "objects", create=True)
        self.snapshots = open_store_dir(root, "snapshots", create=True)
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
            remove_tree_at(self.snapshots, name)
        if stale or any(n.startswith(".in-") for n in os.listdir(self.objects)):
            self.collect()

    def manifest(self, name: str) -> dict[str, Any]:
        folder = open_store_dir(self.snapshots, name)
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
        write_private(self.root, "index.json", json.dumps(found).encode("utf-8", "surrogateescape"))

    def bucket(self, sha: str, create: bool = False) -> int:
        if sha[:2] not in self._buckets:
            self._buckets[sha[:2]] = open_store_dir(self.objects, sha[:2], create=create)
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
                size = copy_fd(source, target, digest)
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
            source = open_store_file(bucket, sha[2:])
            try:
                target = os.open(name, NEW_FLAGS, 0o400, dir_fd=folder)
                try:
                    copy_fd(source, target)
                finally:
                    os.close(target)
            finally:
                os.close(source)

    def object_bytes(self) -> int:
        total = 0
        for bucket in os.listdir(self.objects):
            if bucket.startswith("."):
                continue
            fd = open_store_dir(self.objects, bucket)
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
            fd = open_store_dir(self.objects, bucket)
            try:
                for name in os.listdir(fd):
                    if os.stat(name, dir_fd=fd, follow_symlinks=False).st_nlink <= 1:
                        os.unlink(name, dir_fd=fd)
            finally:
                os.close(fd)
