"""The kernel gives back to the system the memory its start freed.

Starting a box allocates much that is soon freed: the runner's zipapp (its sources read, its bytecode
compiled by a child and read back), the bubblewrap arguments, the seccomp filter, the provider's modules.
glibc keeps freed memory in its arenas for later allocations rather than returning it, and the thread
that started the box has an arena of its own that nothing else uses much: about 2 MiB of the idle
kernel's private memory was memory freed that way (benchmarks/kernel_start.py). `malloc_trim(0)`
returns the free pages of every arena. Once, after the start: a cell's own allocations are small, and
the call walks every arena.
"""

from __future__ import annotations


def give_back_freed_memory() -> bool:
    """Return the free pages of glibc's arenas to the system; False where there is no glibc (or no
    ctypes), where nothing is done."""
    try:
        import ctypes  # the kernel has it already: ipykernel imports it

        trim = ctypes.CDLL(None).malloc_trim
    except (ImportError, OSError, AttributeError):
        return False
    trim(0)
    return True
