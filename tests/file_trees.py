"""A folder tree as data, to compare before and after: what a snapshot's restore must give back, and
what "nothing outside was touched" means."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

MB = 1 << 20


def tree(root: Path) -> dict[str, tuple]:
    """Every entry under `root`, links not followed: kind, mode and content (sha256) or link target."""
    found: dict[str, tuple] = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISREG(info.st_mode):
                digest = hashlib.sha256()
                with open(path, "rb") as handle:
                    while chunk := handle.read(MB):
                        digest.update(chunk)
                found[rel] = ("file", stat.S_IMODE(info.st_mode), digest.hexdigest())
            elif stat.S_ISLNK(info.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", stat.S_IMODE(info.st_mode))
            else:
                found[rel] = ("special", stat.S_IFMT(info.st_mode))
    return found


def with_times(root: Path) -> dict[str, tuple]:
    """`tree` and each entry's mtime and ctime: what "not touched" means."""
    return {rel: (*entry, os.lstat(root / rel).st_mtime_ns, os.lstat(root / rel).st_ctime_ns)
            for rel, entry in tree(root).items()}
