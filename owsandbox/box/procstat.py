"""Processes as /proc shows them, read one way: `/proc/PID/stat` and the questions asked of it.

The box asks these questions in several places (is a pid alive, who is in a session or a process
group, what is below a process, when did it start) and the host's providers ask them of the
sandbox's processes; all of them read the file here. Its second field, the command name, is in
parentheses and may hold anything, spaces and ")" too, so the fields are counted from its *last*
")". A process that is gone, or a machine without /proc, gives None (or an empty list), never an
error. Standard library only: this module is copied into the sandbox (the host imports it too).
"""

from __future__ import annotations

import os

# The fields of /proc/PID/stat after "pid (comm)", in order (proc(5)): `field(pid, "ppid")`.
FIELDS = ("state", "ppid", "pgrp", "session", "tty_nr", "tpgid", "flags", "minflt", "cminflt", "majflt",
          "cmajflt", "utime", "stime", "cutime", "cstime", "priority", "nice", "num_threads", "itrealvalue",
          "starttime")
_INDEX = {name: index for index, name in enumerate(FIELDS)}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc times are in these
DEAD_STATES = ("Z", "X")  # a zombie (exited, not yet reaped) or dead: it runs nothing any more


def fields(pid: int | str, task: int | str | None = None) -> list[str] | None:
    """The fields after the command name (`state` first), of the process or of one of its threads
    (`task`); None when there is no such process or no /proc to read."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    _, paren, rest = data.rpartition(b")")
    found = rest.decode("ascii", "replace").split()
    return found if paren and found else None


def field(pid: int | str, name: str, task: int | str | None = None) -> str | None:
    """One field by its name in proc(5) (FIELDS), as text; None when it cannot be read."""
    found = fields(pid, task)
    index = _INDEX[name]
    return found[index] if found is not None and len(found) > index else None


def _number(pid: int | str, name: str) -> int | None:
    value = field(pid, name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def cpu_seconds(pid: int | str) -> float | None:
    """The CPU time the process itself has used (user and system, not its children's); None when it is
    not there."""
    found = fields(pid)
    try:
        ticks = int(found[_INDEX["utime"]]) + int(found[_INDEX["stime"]]) if found is not None else None
    except (IndexError, ValueError):
        return None
    return ticks / CLOCK_TICKS if ticks is not None else None


def state(pid: int | str, task: int | str | None = None) -> str | None:
    """R, S, D, Z, ... (proc(5)); None for a process that is not there."""
    return field(pid, "state", task)


def running(state_letter: str | None) -> bool:
    """Whether a process in this state still runs: there, and neither a zombie nor dead."""
    return state_letter is not None and state_letter not in DEAD_STATES


def ppid(pid: int | str) -> int | None:
    return _number(pid, "ppid")


def start_time(pid: int | str) -> str | None:
    """The process's start time in clock ticks since boot: with the pid, it names one process for good
    (a pid can be reused, the pair cannot)."""
    return field(pid, "starttime")


def pids() -> list[int]:
    """Every process id in /proc; [] when there is no /proc to read."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]


def pid_alive(pid: int | None) -> bool:
    """Whether `pid` is a live process: any of its threads is not a zombie.

    The leader of a process that is being killed shows as a zombie while its other threads are still
    exiting and holding its files (a listening socket still answers), so every thread is looked at.
    """
    if not pid:
        return False
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc to read: the pid alone
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
    return any(running(state(pid, thread)) for thread in threads)


def members(key: str, value: int) -> list[int]:
    """The running processes whose field `key` ("session", "pgrp", "ppid") is `value`."""
    found = []
    for pid in pids():
        stat = fields(pid)
        if stat is not None and len(stat) > _INDEX[key] and running(stat[0]) and stat[_INDEX[key]] == str(value):
            found.append(pid)
    return found


def session_members(sid: int) -> list[int]:
    """Live process ids in session `sid`, the session leader included."""
    return members("session", sid)


def namespace_pids(pid: int) -> list[int]:
    """The process's pid in each PID namespace it is in, the host's first (`NSpid` in its status); [] when
    it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return [int(part) for part in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def descendants(root: int) -> list[int]:
    """Every process below `root` (zombies too: they are still someone's children)."""
    children: dict[int, list[int]] = {}
    for pid in pids():
        parent = ppid(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def last_pid() -> int | None:
    """The pid the kernel handed out last in this PID namespace (`ns_last_pid`); None when it cannot be
    read. Processes started after a moment have pids after it (until the numbers wrap around)."""
    try:
        with open("/proc/sys/kernel/ns_last_pid") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None
