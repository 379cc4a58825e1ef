"""Whether a path is a folder or inside it: the one test both ends make of the absolute POSIX paths
the protocol carries (a shell's `cwd`, a file's `path`) and of the host's own folders.

By the path's text only: nothing is resolved here (a caller that must not be fooled by a link
resolves first, or walks with `O_NOFOLLOW`). `/a/bc` is not inside `/a/b`.
"""

from __future__ import annotations


def inside(path: str, folder: str) -> bool:
    """`path` is `folder` itself or below it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")
