"""Per-user folders in shared places, made and checked the way OpenSSH and tmux check theirs.

A folder such as `/tmp/owsandbox-1000` can be made first by another local user: if we used it, they
could read our sockets' names, swap files, or stop our sandboxes from starting. So a folder is only
used when it is a real folder (not a link), owned by us, and closed to everyone else; otherwise the
next candidate is tried and a warning says why.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from ..protocol.paths import inside


class UnsafeFolder(OSError):
    """A private folder exists but cannot be trusted (owner, mode or kind); the message says which."""


def private_folder(path: str | os.PathLike[str]) -> Path:
    """`path` as a folder only this user can enter, made 0700 if missing; raises UnsafeFolder."""
    folder = Path(path)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolder(f"{folder} is not a folder of its own (a link or a file is there)")
    if info.st_uid != os.getuid():
        raise UnsafeFolder(f"{folder} belongs to user id {info.st_uid}, not to you ({os.getuid()})")
    if info.st_mode & 0o077:
        raise UnsafeFolder(f"{folder} is open to other users (mode {stat.S_IMODE(info.st_mode):o}, not 700)")
    return folder


def first_private_folder(candidates: list[Path]) -> Path:
    """The first candidate that is safe; a warning on stderr names each one passed over and why."""
    problems = []
    for candidate in candidates:
        try:
            candidate.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            return private_folder(candidate)
        except OSError as exc:
            problems.append(str(exc))
            print(f"owsandbox: warning: not using {candidate}: {exc}", file=sys.stderr)
    raise UnsafeFolder("no private folder for the sandboxes' state: " + "; ".join(problems))


# -- this user's runtime folder: where the daemons' state and sockets live -------------------

UNIX_PATH_MAX = 107  # the longest path a Unix socket can have on Linux (108 bytes with the NUL)
SOCKET_ROOM = 48  # what a sandbox adds to the runtime folder for its sockets: /KEY/run/runner.sock


def runtime_candidates() -> list[Path]:
    """Where this user's private runtime folder may be, in the order tried."""
    name = f"owsandbox-{os.getuid()}"
    candidates = [Path(os.environ["XDG_RUNTIME_DIR"]) / name] if os.environ.get("XDG_RUNTIME_DIR") else []
    candidates += [Path(tempfile.gettempdir()) / name, Path("/tmp") / name,
                   Path.home() / ".cache" / "owsandbox" / "run", Path("/var/tmp") / name]
    return list(dict.fromkeys(candidates))


def runtime_root(avoid: str | None = None) -> Path:
    """A private folder for the daemons of this user, checked before use (see privatedir). One whose
    path leaves no room for the sockets in it (a long TMPDIR) is passed over, with a warning; so is one
    inside `avoid`, a sandbox's workspace (a notebook opened in /tmp itself): the box could write there."""
    fitting = []
    candidates = runtime_candidates()
    for candidate in candidates:
        if avoid and inside(str(candidate), avoid):
            continue
        if len(str(candidate)) + SOCKET_ROOM <= UNIX_PATH_MAX:
            fitting.append(candidate)
        else:
            print(f"owsandbox: warning: not using {candidate}: too long a path for the sandbox's sockets "
                  f"(at most {UNIX_PATH_MAX - SOCKET_ROOM} characters)", file=sys.stderr)
    if not fitting:
        raise UnsafeFolder("no private folder for the sandboxes' state outside the workspace " + (avoid or "")
                           + ": " + ", ".join(map(str, candidates)) + " are all in it")
    return first_private_folder(fitting)
