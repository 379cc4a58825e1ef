"""Paths this machine writes to on its own (a recording, the snapshot store), found without letting a
box steer them.

`os.path.realpath` follows every link on the way, also the ones a box made in its workspace: a path
that passes through the workspace could be sent anywhere. `locate` follows links only outside the
workspace, where the box cannot make them, and stops where the path enters it, so the caller walks
the rest folder by folder without following any (or refuses).
"""

from __future__ import annotations

import errno
import os

from ...protocol.paths import inside

MAX_LINKS = 40  # links followed on the way to a recording, as the system's own limit


def locate(path: str, workspace: str | None) -> tuple[str, list[str] | None]:
    """Where `path` (absolute) leads: (the real path, None) when it stays outside the workspace, or (the
    workspace, the names below it) as soon as it enters it. Links are followed only outside the
    workspace, where the box cannot make them; inside, the names are walked without following any."""
    current, pending, hops = "/", [part for part in path.split("/") if part], 0
    while pending:
        if workspace and inside(current, workspace):
            break
        part = pending.pop(0)
        if part in (".", ".."):
            current = os.path.dirname(current) if part == ".." else current
            continue
        step = os.path.join(current, part)
        if os.path.islink(step):
            hops += 1
            if hops > MAX_LINKS:
                raise OSError(errno.ELOOP, "too many links on the way")
            target = os.readlink(step)
            current = "/" if target.startswith("/") else current
            pending = [p for p in target.split("/") if p] + pending
            continue
        current = step
    if workspace and inside(current, workspace):
        below = os.path.relpath(current, workspace).split("/") if current != workspace else []
        return workspace, [part for part in below if part != "."] + pending
    return current, None
