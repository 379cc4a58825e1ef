"""Resource limits of a sandbox: what they are, how they are enforced, and whether one was hit.

A cell must not be able to take the machine's memory or processes. Limits are on by default and
enforced from outside the box: by a cgroup made for the sandbox where this user may make one
(cgroup v2 delegated to the user, or v1/v2 as root), else by rlimits set on the sandbox's first
process (inherited by everything in it, and not raisable from inside). The sizes of the box's
`/tmp`, `/var/tmp`, `/run` and `/dev/shm` are set on their tmpfs mounts.

The host reads the cgroup's own counters (OOM kills, refused forks) to name a limit a cell hit;
those files are outside every mount of the box, so nothing inside can forge them.
"""

from __future__ import annotations

import os
import resource
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The limits' names are the settings': OWSANDBOX_LIMITS is checked where it is read, whichever provider uses it.
from ...settings import LIMIT_NAMES, size_bytes, unknown_limit

CGROUP_ROOT = Path("/sys/fs/cgroup")


def parse_size(text: str, what: str) -> int:
    """`2G`, `512M`, `1048576` as bytes; a clear error naming `what` otherwise."""
    size = size_bytes(text)
    if size is None:
        raise ValueError(f"limit {what}={text!r} is not a size (examples: 512M, 2G, 1073741824)")
    return size


def human_size(size: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            value = size / factor
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} B"


def _total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class LimitReport:
    """The limits a cell runs under, for naming the one it hit (`kernel/cell/limit_names.py`): each
    limit in words, as `%sandbox` shows them, and whether an out-of-memory kill is counted where the
    host reads it (a cgroup's counters) or shows only as the command's SIGKILL (a container whose
    cgroup the host cannot read, an OpenSandbox server's)."""

    words: dict[str, str]
    oom_counted: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"words": dict(self.words), "oom_counted": self.oom_counted}

    @classmethod
    def from_json(cls, value: dict[str, Any] | None) -> LimitReport | None:
        return None if value is None else cls(dict(value["words"]), bool(value["oom_counted"]))


@dataclass
class Limits:
    """The limits of one sandbox. `None` for cpu means every CPU."""

    memory: int = field(default_factory=lambda: min(_total_memory() // 2, 4 << 30))
    pids: int = 1024
    tmp: int = 1 << 30
    shm: int = 64 << 20
    cpu: float | None = None

    @classmethod
    def parse(cls, settings: list[str] | str | None) -> Limits:
        """From `memory=2G,pids=512` (or a list of `name=value`), over the defaults."""
        limits = cls()
        if isinstance(settings, str):
            settings = [part for part in settings.split(",") if part.strip()]
        for setting in settings or []:
            name, sep, value = setting.partition("=")
            name = name.strip().lower()
            if not sep:
                raise ValueError(f"limit {setting!r} is not NAME=VALUE with NAME one of {', '.join(LIMIT_NAMES)}")
            problem = unknown_limit(name)
            if problem:
                raise ValueError(f"limit {setting!r}: {problem}")
            if name == "pids":
                if not value.strip().isdigit() or int(value) < 16:
                    raise ValueError(f"limit pids={value!r} must be a whole number of at least 16")
                limits.pids = int(value)
            elif name == "cpu":
                try:
                    limits.cpu = float(value)
                except ValueError:
                    raise ValueError(f"limit cpu={value!r} is not a number of CPUs (example: 2 or 0.5)") from None
                if limits.cpu <= 0:
                    raise ValueError(f"limit cpu={value!r} must be more than 0")
            else:
                size = parse_size(value, name)
                if size < 1 << 20:
                    raise ValueError(f"limit {name}={value!r} is under 1 MiB")
                setattr(limits, name, size)
        return limits

    def describe(self) -> dict[str, str]:
        return {"memory": human_size(self.memory), "processes": str(self.pids), "/tmp": human_size(self.tmp),
                "/dev/shm": human_size(self.shm), "cpu": "all" if self.cpu is None else f"{self.cpu:g}"}


class Enforcement:
    """How limits reach the processes: `preexec` runs in the sandbox's first process before exec."""

    kind = "rlimits"

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def preexec(self) -> None:
        """In the child, before bwrap runs: soft and hard limits alike, so the box cannot raise them."""
        memory = self.limits.memory
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_NPROC, (self.limits.pids, self.limits.pids))
        if self.limits.cpu is not None:
            cpus = sorted(os.sched_getaffinity(0))[: max(1, int(self.limits.cpu + 0.999))]
            os.sched_setaffinity(0, cpus)

    def counters(self) -> dict[str, int]:
        """Events counted by the kernel so far: `oom_kills` and `refused_forks`; {} when not counted."""
        return {}

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def remove(self) -> None:
        """Take away what was made for the sandbox (once nothing runs in it)."""

    def describe(self) -> str:
        cpu = ", CPUs by affinity" if self.limits.cpu is not None else ""
        return f"rlimits (memory as address space, processes per user{cpu}); limit events are not counted"


class CgroupEnforcement(Enforcement):
    """One cgroup per sandbox in each controller it needs (v1), or one v2 cgroup."""

    kind = "cgroup"

    def __init__(self, limits: Limits, folders: dict[str, Path], version: int) -> None:
        super().__init__(limits)
        self.folders = folders
        self.version = version

    @classmethod
    def make(cls, limits: Limits, name: str | None = None) -> CgroupEnforcement | None:
        """A new cgroup for a sandbox, or None where this user cannot make one."""
        name = name or f"owsandbox-{uuid.uuid4().hex[:12]}"
        try:
            if (CGROUP_ROOT / "cgroup.controllers").exists():
                return cls._make_v2(limits, name)
            return cls._make_v1(limits, name)
        except OSError:
            return None

    @classmethod
    def _own_path(cls, controller: str) -> str:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controller in controllers.split(","):
                    return path.lstrip("/")
        return ""

    @classmethod
    def _make_v1(cls, limits: Limits, name: str) -> CgroupEnforcement | None:
        wanted = ["memory", "pids"] + (["cpu"] if limits.cpu is not None else [])
        folders: dict[str, Path] = {}
        try:
            for controller in wanted:
                base = CGROUP_ROOT / controller
                if not (base / "cgroup.procs").exists():
                    return None
                folder = base / cls._own_path(controller) / name
                folder.mkdir()
                folders[controller] = folder
            memory = str(limits.memory)
            (folders["memory"] / "memory.limit_in_bytes").write_text(memory)
            swap = folders["memory"] / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(memory)  # memory and swap together: no escape into swap
            (folders["pids"] / "pids.max").write_text(str(limits.pids))
            if limits.cpu is not None:
                period = 100_000
                (folders["cpu"] / "cpu.cfs_period_us").write_text(str(period))
                (folders["cpu"] / "cpu.cfs_quota_us").write_text(str(int(limits.cpu * period)))
        except OSError:
            for folder in folders.values():
                _rmdir(folder)
            return None
        return cls(limits, folders, 1)

    @classmethod
    def _make_v2(cls, limits: Limits, name: str) -> CgroupEnforcement | None:
        parent = CGROUP_ROOT / cls._own_path("")
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        if not {"memory", "pids"} <= set(enabled) or not os.access(parent, os.W_OK):
            return None
        folder = parent / name
        folder.mkdir()
        try:
            (folder / "memory.max").write_text(str(limits.memory))
            if (folder / "memory.swap.max").exists():
                (folder / "memory.swap.max").write_text("0")
            (folder / "pids.max").write_text(str(limits.pids))
            if limits.cpu is not None and "cpu" in enabled:
                (folder / "cpu.max").write_text(f"{int(limits.cpu * 100_000)} 100000")
        except OSError:
            _rmdir(folder)
            return None
        return cls(limits, {"unified": folder}, 2)

    @classmethod
    def adopt(cls, limits: Limits, record: dict[str, Any]) -> Enforcement:
        """The enforcement a daemon was started with, from the host's own record of it."""
        if record.get("kind") != "cgroup":
            return Enforcement(limits)
        return cls(limits, {k: Path(v) for k, v in record.get("folders", {}).items()}, record.get("version", 1))

    def preexec(self) -> None:
        pid = str(os.getpid())
        for folder in self.folders.values():
            with open(folder / "cgroup.procs", "w") as f:
                f.write(pid)

    def counters(self) -> dict[str, int]:
        found = {"oom_kills": 0, "refused_forks": 0}
        if self.version == 1:
            memory_events = _keyed(self.folders.get("memory"), "memory.oom_control")
            pids_events = _keyed(self.folders.get("pids"), "pids.events")
        else:
            memory_events = _keyed(self.folders.get("unified"), "memory.events")
            pids_events = _keyed(self.folders.get("unified"), "pids.events")
        found["oom_kills"] = memory_events.get("oom_kill", 0)
        found["refused_forks"] = pids_events.get("max", 0)
        return found

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": self.version, "folders": {k: str(v) for k, v in self.folders.items()}}

    def remove(self) -> None:
        for folder in self.folders.values():
            _rmdir(folder)

    def describe(self) -> str:
        return f"cgroup v{self.version} ({', '.join(str(f) for f in self.folders.values())})"


def _keyed(folder: Path | None, name: str) -> dict[str, int]:
    if folder is None:
        return {}
    found: dict[str, int] = {}
    try:
        for line in (folder / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                found[key] = int(value)
    except OSError:
        pass
    return found


def _rmdir(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


class LimitTooSmall(ValueError):
    """A limit that leaves the sandbox no room to start; the message names it and the least that works."""


# The least memory a sandbox starts in and runs a shell, a small program and a few more shells, by
# enforcement. Found by trying (bubblewrap, x86_64, Python 3.11): the daemon, bash and `python3 -c`
# ran in 40 MiB of address space under rlimits (not 32) and in 24 MiB charged to a cgroup (not 16);
# each further shell adds about 2 MiB of address space (two threads).
MIN_MEMORY = {"rlimits": 64 << 20, "cgroup": 32 << 20}
# What a process that ran out of memory as it started says (the dynamic loader, Python, glibc's threads).
_STARVED = ("MemoryError", "can't start new thread", "failed to map segment", "Cannot allocate memory",
            "cannot allocate memory")


def check_room(limits: Limits, kind: str) -> None:
    """Refuse, before anything starts, a memory limit under which the sandbox could not run a cell."""
    floor = MIN_MEMORY.get(kind, 0)
    if limits.memory < floor:
        raise LimitTooSmall(f"memory={human_size(limits.memory)} leaves no room for the sandbox's daemon and shell "
                            f"under {kind} (at least {human_size(floor)}); set a larger one with "
                            "OWSANDBOX_LIMITS=memory=... or --limit memory=...")


def starved(log_tail: str, counters: dict[str, int]) -> bool:
    """Whether a sandbox that did not start ran out of memory: an OOM kill counted by its cgroup, or
    the words of a process refused memory in what it wrote."""
    return counters.get("oom_kills", 0) > 0 or any(word in log_tail for word in _STARVED)


def too_small(limits: Limits, kind: str, failure: str) -> LimitTooSmall:
    """The error for a sandbox found starved as it started (`failure`: what it said)."""
    return LimitTooSmall(f"memory={human_size(limits.memory)} was too small for the sandbox's daemon under {kind}: it "
                         f"ran out of memory as it started ({failure.strip()[-500:]}). Set a larger one with "
                         "OWSANDBOX_LIMITS=memory=... or --limit memory=...")


_NO_PROCESS = "Resource temporarily unavailable"  # EAGAIN: what fork and clone say at RLIMIT_NPROC or pids.max


def refused_a_process(log_tail: str) -> bool:
    """Whether a sandbox that did not start was refused a new process (bubblewrap's clone of its
    namespaces, or a fork in the box), as the processes limit refuses one."""
    return _NO_PROCESS in log_tail


def tasks_of(uid: int) -> int:
    """How many processes and threads `uid` runs on this machine now: what RLIMIT_NPROC counts."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
        except (OSError, KeyError, ValueError, IndexError):
            continue  # ended meanwhile
    return count


def out_of_processes(limits: Limits, kind: str, failure: str) -> LimitTooSmall:
    """The error for a sandbox refused a process as it started (`failure`: what it said), with what the
    limit counts: under rlimits every process and thread of this user on the machine, not only the box's."""
    said = failure.strip()[-500:]
    if kind == "rlimits":
        uid = os.getuid()
        return LimitTooSmall(f"pids={limits.pids}, the processes limit, was reached as the sandbox started ({said}): "
                             f"without a cgroup the limit counts every process and thread of user {uid} on this "
                             f"machine, the Jupyter server's and the kernels' included, and that user runs "
                             f"{tasks_of(uid)} now. Set a larger one with OWSANDBOX_LIMITS=pids=... or --limit "
                             "pids=..., or end some of them")
    return LimitTooSmall(f"pids={limits.pids}, the processes limit, left the sandbox no room to start ({said}): set "
                         "a larger one with OWSANDBOX_LIMITS=pids=... or --limit pids=...")


def enforce(limits: Limits) -> Enforcement:
    """A cgroup where one can be made, else rlimits."""
    return CgroupEnforcement.make(limits) or Enforcement(limits)


__all__ = ["LIMIT_NAMES", "MIN_MEMORY", "Enforcement", "CgroupEnforcement", "LimitTooSmall", "Limits", "check_room",
           "enforce", "human_size", "out_of_processes", "parse_size", "refused_a_process", "starved", "tasks_of",
           "too_small"]
