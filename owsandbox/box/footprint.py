"""The daemon's address space, kept small and predictable.

Where a sandbox's memory is bounded by rlimits, the bound is RLIMIT_AS: address space, for every
process in the box, the daemon included. glibc reserves 64 MiB of address space for each malloc
arena it makes for a contending thread, and 8 MiB for each thread's stack; a daemon with a dozen
threads had reserved over half a GiB it never touched, so under `memory=256M` it could not start
the thread that runs the first cell. Two arenas and 1 MiB stacks cost the daemon nothing it uses.

`ctypes` is imported when called (see hardening.py for why); without it only the stacks shrink.
"""

from __future__ import annotations

import importlib
import threading

THREAD_STACK = 1 << 20  # deep enough for the C recursion of json and re at Python's recursion limit
MALLOC_ARENAS = 2
M_ARENA_MAX = -8  # mallopt's parameter (glibc's malloc.h)


def keep_address_space_small() -> None:
    """Before the daemon starts its threads: they get small stacks and share two malloc arenas."""
    threading.stack_size(THREAD_STACK)
    try:
        ctypes = importlib.import_module("ctypes")
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, MALLOC_ARENAS)
    except (ImportError, OSError, AttributeError):
        pass  # not glibc, or no ctypes: arenas as the C library makes them
