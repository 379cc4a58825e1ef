"""The daemon out of reach of the code it runs.

The daemon holds what the box must not have: the host's two listening sockets and its log pipe.
Cell code runs as the same user, and the same user may open `/proc/<pid>/fd/*`, ptrace, or take a
descriptor with `pidfd_getfd`, of any process that is *dumpable*. Marked non-dumpable, the daemon
is out of reach of every process without CAP_SYS_PTRACE, which nothing in the box has; the shells
it starts are dumpable again once they exec.

`ctypes` is imported when called, never at module level: a box whose Python lacks it still runs
the daemon (and says so in its log), as the bundle's list of required modules is read from imports.
"""

from __future__ import annotations

import importlib
import os

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def make_undumpable() -> str | None:
    """None once the process is non-dumpable, else why it could not be made so."""
    try:
        ctypes = importlib.import_module("ctypes")
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            return f"prctl(PR_SET_DUMPABLE) failed: {os.strerror(ctypes.get_errno())}"
        if libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
            return "prctl(PR_SET_DUMPABLE, 0) did not hold"
    except (ImportError, OSError, AttributeError) as exc:
        return f"no prctl through ctypes: {exc}"
    return None


def keep_to_itself(*fds: int | None) -> None:
    """Descriptors the host gave the daemon, closed on exec: nothing it starts inherits them."""
    for fd in fds:
        if fd is not None:
            os.set_inheritable(fd, False)
