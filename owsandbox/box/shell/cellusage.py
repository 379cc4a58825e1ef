"""What one command used: its peak memory and its CPU seconds, for the cell's `execute_reply` metadata.

A cell runs in a persistent bash, so the kernel's usual per-command counters (a child's `wait4`
rusage, a cgroup made for it) are not there: bash reaps the command's processes, and the box's cgroup
(where there is one, and the host may read it) holds every shell and the daemon too. What the box can
read cheaply and truthfully is the shell's own process tree, from /proc:

* **CPU seconds**: the tree's CPU time (user and system, each process's own and its reaped children's)
  at the end minus at the start. A process's time moves into its parent's children's time when it is
  reaped, so the sum counts every process the command ran and waited for, to the clock tick; a process
  that left the tree (reparented to the box's init, `setsid … &`) takes its time with it.
* **Peak memory**: the most resident memory the tree held at once, as sampled while the command runs
  (after 10 ms, then at doubling intervals up to every 100 ms). A process that started during the
  command is counted at its own high-water mark (`VmHWM`: its peak, which the kernel keeps), so a
  spike between two samples is still seen while the process lives; the shell and processes older than
  the command are counted at their resident size (`VmRSS`, what they hold now), so an earlier cell's
  peak is not this one's. A process that starts and ends between two samples is missed. Resident
  sizes count shared pages once per process.

The shell's reader thread takes the samples (it wakes for them), so no thread is made per command.
Costs: the tree is walked through `/proc/PID/task/TID/children` (only the tree's own files, not every
process of the box), where the kernel has it; else every process's stat is read. Standard library only.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from .. import procstat

_TICK_FIELDS = (procstat.FIELDS.index("utime"), procstat.FIELDS.index("stime"),
                procstat.FIELDS.index("cutime"), procstat.FIELDS.index("cstime"))
_START = procstat.FIELDS.index("starttime")
FIRST_SAMPLE_SECONDS = 0.01
MAX_SAMPLE_SECONDS = 0.1


class _Proc(NamedTuple):  # not a dataclass: `dataclasses` imports inspect, half a MiB of an idle daemon
    started: str  # start time in ticks since boot: with the pid, names one process for good
    ticks: int


def _children(pid: int) -> list[int] | None:
    """The children of `pid` from its threads' `children` files; None where the kernel has none."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                found.extend(int(part) for part in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{task}"):
                continue  # the thread ended meanwhile
            return None  # a kernel without CONFIG_PROC_CHILDREN
        except (OSError, ValueError):
            continue
    return found


def tree(root: int) -> list[int]:
    """`root` and every process below it."""
    found, todo = [root], [root]
    while todo:
        below = _children(todo.pop())
        if below is None:
            return [root, *procstat.descendants(root)]
        found.extend(below)
        todo.extend(below)
    return found


def _proc(pid: int) -> _Proc | None:
    stat = procstat.fields(pid)
    if stat is None or len(stat) <= _START:
        return None
    try:
        return _Proc(stat[_START], sum(int(stat[index]) for index in _TICK_FIELDS))
    except ValueError:
        return None


def _resident(pid: int, key: bytes) -> int:
    """`VmRSS` or `VmHWM` of the process's status, in bytes; 0 for a process gone (or a kernel thread)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class CellMeter:
    """Measures one command on the shell whose bash is `root`: made just before the command is written to
    bash, sampled by the shell's reader thread when `due` (it wakes for it), finished just after the end
    markers came back. No thread of its own: a short command pays for two readings of the tree only."""

    def __init__(self, root: int, now: float) -> None:
        self.root = root
        found = self._read()
        self._older = {pid: proc.started for pid, proc in found.items()}
        self._start_ticks = sum(proc.ticks for proc in found.values())
        self._peak = 0
        self.samples = 0
        self._wait = FIRST_SAMPLE_SECONDS
        self._due = now + self._wait

    def _read(self) -> dict[int, _Proc]:
        found = {}
        for pid in tree(self.root):
            proc = _proc(pid)
            if proc is not None:
                found[pid] = proc
        return found

    def _sample(self) -> int | None:
        """Reads the tree once: its memory into the peak; returns its CPU ticks (None: the shell is gone)."""
        found = self._read()
        if self.root not in found:
            return None
        memory = sum(_resident(pid, b"VmRSS:" if self._older.get(pid) == proc.started else b"VmHWM:")
                     for pid, proc in found.items())
        self._peak = max(self._peak, memory)
        self.samples += 1
        return sum(proc.ticks for proc in found.values())

    def due(self) -> float:
        """When the next sample is due (`time.monotonic()`)."""
        return self._due

    def sample_if_due(self, now: float) -> None:
        if now < self._due:
            return
        self._sample()
        self._wait = min(self._wait * 2, MAX_SAMPLE_SECONDS)
        self._due = now + self._wait

    def finish(self) -> dict[str, Any]:
        """The command's figures (`RunResult.usage`): `peak_memory_bytes`, `cpu_seconds` (None when the shell
        ended with the command), `samples` (how many readings the peak is the highest of)."""
        ticks = self._sample()  # None: the shell ended with the command, and its time went with it
        cpu = None if ticks is None else round(max(ticks - self._start_ticks, 0) / procstat.CLOCK_TICKS, 3)
        return {"peak_memory_bytes": self._peak, "cpu_seconds": cpu, "samples": self.samples}
