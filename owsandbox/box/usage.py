"""What the box uses now: the memory, CPU time and processes of the daemon and everything below it.

For the notebook's Kernel Usage panel (`usage_request`) and `%usage`: a sandboxed kernel's own process
is not where the work happens, the box is. Read from /proc as the box sees it, the same way for every
provider (a bubblewrap box, a container, a remote box): memory as each process's proportional share
(`Pss` of `smaps_rollup`, so pages shared between processes count once), else its resident size; CPU
as each process's time and its reaped children's, so a command that has ended still counts. A
process that left the daemon's tree (reparented to the box's init) is not counted. The figures are
the box's word: the host shows them, never decides from them. Standard library only.
"""

from __future__ import annotations

import os

from ..protocol import messages as M
from ..protocol.methods import BOX_USAGE
from .params import handles
from .procstat import CLOCK_TICKS, descendants, fields

_CPU_FIELDS = (11, 12, 13, 14)  # utime, stime, cutime, cstime: after `pid (comm)`, from `state` (proc(5))


def _memory_bytes(pid: int) -> int:
    for path, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            with open(path, "rb") as f:
                for line in f:
                    if line.startswith(key.encode()):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return 0


def _cpu_ticks(pid: int) -> int:
    found = fields(pid)
    if found is None or len(found) <= max(_CPU_FIELDS):
        return 0
    try:
        return sum(int(found[index]) for index in _CPU_FIELDS)
    except ValueError:
        return 0


def box_usage(root: int | None = None) -> M.Usage:
    """`box.usage`'s result: memory_bytes, cpu_seconds (since each process started), processes, cpus."""
    top = os.getpid() if root is None else root
    tree = [top, *descendants(top)]
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return M.Usage(memory_bytes=sum(_memory_bytes(pid) for pid in tree),
                   cpu_seconds=round(sum(_cpu_ticks(pid) for pid in tree) / CLOCK_TICKS, 3),
                   processes=len(tree), cpus=cpus)


@handles(BOX_USAGE)
def handle(_params: M.UsageParams, _base: str) -> M.Usage:
    return box_usage()


HANDLERS = {BOX_USAGE: handle}
