"""Naming the limit a cell ran into, so `OutOfMemory` reads as such instead of "exit status 137".

Two sources, best first. Where the sandbox's limits are a cgroup, the host reads the cgroup's own
counters before and after the cell (OOM kills, refused forks): exact, and out of the box's reach.
Where they are rlimits (or a container's cgroup the host cannot read), nothing counts the events, so
a failing cell's stderr is read for the words the C library, bash and Python use when an allocation,
a fork or a write is refused; where the provider says its OOM kills are uncounted SIGKILLs (such a
container), a status of 137 is put down to the memory limit. Either way it only names the error of a
cell; it never decides what runs.
"""

from __future__ import annotations

from typing import Any

from ...host.isolation.resources import LimitReport

_OUT_OF_MEMORY = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory", "Out of memory")
_NO_PROCESSES = ("fork: retry", "fork: Resource temporarily unavailable", "Resource temporarily unavailable")
_NO_SPACE = ("No space left on device",)


def stderr_tail(result: dict[str, Any], size: int = 8192) -> str:
    """The end of what the command wrote to stderr, from its record."""
    output = result.get("output") or ""
    segments = result.get("segments")
    if not segments:
        return output[-size:]
    parts, position = [], 0
    for stream, length in segments:
        if stream == "stderr":
            parts.append(output[position:position + length])
        position += length
    return "".join(parts)[-size:]


def named_limit(result: dict[str, Any], before: dict[str, int], after: dict[str, int],
                report: LimitReport | None) -> tuple[str, str] | None:
    """(error name, message) when the cell hit a limit of the sandbox, else None."""
    if report is None:
        return None
    limits = report.words
    memory, processes = limits.get("memory", "?"), limits.get("processes", "?")
    tmp, shm = limits.get("/tmp", "?"), limits.get("/dev/shm", "?")
    if after.get("oom_kills", 0) > before.get("oom_kills", 0):
        return "OutOfMemory", f"the command was killed: memory limit {memory}"
    if after.get("refused_forks", 0) > before.get("refused_forks", 0):
        return "TooManyProcesses", f"a new process was refused: the sandbox may run at most {processes} processes"
    tail = stderr_tail(result)
    # bash retries a refused fork and may then succeed: the cell still hit the limit, and says so.
    if not after and any(word in tail for word in _NO_PROCESSES):
        return "TooManyProcesses", f"a new process was refused: the sandbox may run at most {processes} processes"
    if result.get("exit_code") in (0, None) and not result.get("error"):
        return None
    if not after and any(word in tail for word in _OUT_OF_MEMORY):
        return "OutOfMemory", f"the command ran out of memory: memory limit {memory}"
    if not after and result.get("exit_code") == 137 and not report.oom_counted:
        # SIGKILL, and nothing counts OOM kills here (a container whose cgroup the host cannot read):
        # the memory limit is the likely killer, and the message says it is a guess.
        return "OutOfMemory", f"the command was killed (status 137), most likely by the memory limit of {memory}"
    if any(word in tail for word in _NO_SPACE):
        return "NoSpaceLeft", (f"a folder of the sandbox is full (/tmp, /var/tmp and /run hold at most {tmp}, "
                               f"/dev/shm {shm}; the workspace is limited by its disk)")
    return None
