"""Looking at processes from outside, for tests that check what runs, what is left, and what they did."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path

from owsandbox.host.providers.local import descendants, pid_alive

from .waiting import WaitTimeout, wait_until

__all__ = ["PinnedProcesses", "children", "command_line", "connected_to", "descendants", "end_processes_of", "name",
           "parent_of", "pid_alive", "processes_of_ids", "wait_for_file", "wait_gone"]


def _stat_ppid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def parent_of(pid: int) -> int | None:
    """The parent's pid of a process, or None once it is gone."""
    return _stat_ppid(str(pid))


def connected_to(pid: int, port: int) -> bool:
    """Whether process `pid` holds an established TCP connection to `port` (read from /proc): a client
    that does not say when it has subscribed (jupyter console's IOPub) is seen to have done so."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()  # sl local remote state ... inode (field 9)
            if (int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01"  # ESTABLISHED
                    and fields[9] in inodes):
                return True
    return False


def children(pid: int) -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and _stat_ppid(name) == pid]


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def wait_gone(pids: list[int], timeout: float = 10) -> list[int]:
    """The pids still alive after waiting up to `timeout` for them to end (SIGKILL is asynchronous)."""
    with suppress(WaitTimeout):  # the caller asserts on what is left, naming it
        wait_until(lambda: not any(pid_alive(p) for p in pids), timeout, f"{pids} to end")
    return [p for p in pids if pid_alive(p)]


def _user_ids(pid: str) -> tuple[list[int], bool] | None:
    """(real, effective, saved and file system user ids, whether it is a zombie) of a process; None once gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return [int(uid) for uid in fields["Uid"].split()], fields["State"].strip().startswith("Z")
    except (OSError, KeyError, ValueError):
        return None


def _runs_as(pid: int, ids: Sequence[range]) -> bool:
    """Whether process `pid` is alive (a zombie has ended: its parent has yet to reap it) with any of
    its user ids in `ids`."""
    seen = _user_ids(str(pid))
    return seen is not None and not seen[1] and any(uid in ids_ for uid in seen[0] for ids_ in ids)


def processes_of_ids(ids: Sequence[range]) -> dict[int, str]:
    """Every live process any of whose user ids is in `ids`, with its command line (or its name, for one
    that has none)."""
    return {int(entry): command_line(int(entry)) or f"[{name(int(entry))}]" for entry in os.listdir("/proc")
            if entry.isdigit() and _runs_as(int(entry), ids)}


def end_processes_of(ids: Sequence[range], rounds: int = 5, settle: float = 10) -> dict[int, str]:
    """SIGKILL every process of the user ids `ids` (a test's own system user and their subordinate ids),
    each pinned by a pidfd and its ids read again once pinned, so that a pid reused meanwhile is never
    hit; again while any is left (one may start another as it goes: podman its pause process), a few
    rounds. The ones ended, with their command lines: the caller checks with `processes_of_ids`."""
    ended: dict[int, str] = {}
    for _ in range(rounds):
        found = processes_of_ids(ids)
        if not found:
            break
        pinned = PinnedProcesses()
        try:
            for pid in found:
                pinned.add(pid, lambda pid: _runs_as(pid, ids))
            pinned.kill()
            pinned.still_running_after(settle)
            ended.update(pinned.seen)
        finally:
            pinned.close()
    return ended


def wait_for_file(path: Path, timeout: float = 10) -> None:
    """Wait until a command in the box has made `path` (how a test hears that it got that far)."""
    wait_until(path.exists, timeout, f"{path} to appear", interval=0.01)


class PinnedProcesses:
    """Processes pinned by pidfds, so that a pid reused later is never taken for (or killed as) one of them."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # pid → pidfd
        self.seen: dict[int, str] = {}  # pid → command line when first seen

    def add_tree(self, root: int) -> dict[int, str]:
        """Pin `root` and every process below it now; every process pinned so far, with its command line."""
        for pid in [root, *descendants(root)]:
            if pid not in self._fds:
                try:
                    self._fds[pid] = os.pidfd_open(pid)
                except ProcessLookupError:
                    continue
                self.seen[pid] = command_line(pid)
        return dict(self.seen)

    def add(self, pid: int, belongs: Callable[[int], bool]) -> bool:
        """Pin `pid` when it runs and is still, once pinned, the process meant (`belongs(pid)`, read from
        /proc after the pidfd is open: a pid reused before that is the new process's, and is let go)."""
        if pid in self._fds:
            return True
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        if not belongs(pid):
            os.close(fd)
            return False
        self._fds[pid] = fd
        self.seen[pid] = command_line(pid)
        return True

    def still_running_after(self, seconds: float) -> set[int]:
        """Wait up to `seconds` for every process to end (a pidfd turns readable); the ones still running."""
        running = {fd: pid for pid, fd in self._fds.items()}
        deadline = time.monotonic() + seconds
        while running:
            ended, _, _ = select.select(list(running), [], [], max(0.0, deadline - time.monotonic()))
            for fd in ended:
                del running[fd]
            if time.monotonic() >= deadline:
                break
        return set(running.values())

    def ended_within(self, pid: int, seconds: float) -> bool:
        """Wait up to `seconds` for the pinned `pid` alone to end; whether it did."""
        ended, _, _ = select.select([self._fds[pid]], [], [], seconds)
        return bool(ended)

    def signal(self, pid: int, signum: int) -> None:
        """Send `signum` to the pinned `pid` (through its pidfd: never to a later process with its number)."""
        signal.pidfd_send_signal(self._fds[pid], signum)

    def kill(self, pids: set[int] | None = None) -> None:
        """SIGKILL `pids` (by default every pinned process still running)."""
        for pid in self.still_running_after(0) if pids is None else pids:
            try:
                signal.pidfd_send_signal(self._fds[pid], signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def terminate(process: subprocess.Popen, grace: float = 30) -> None:
    """End a process the test started: SIGTERM, then SIGKILL if it is still there after `grace` s;
    reaped either way (nothing when it had already ended)."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_watched(process: subprocess.Popen[bytes] | None, processes: PinnedProcesses,
                 remember: Callable[[], object], settle: float = 15, grace: float = 30) -> dict[int, str]:
    """Stop a server whose processes are watched: `remember()` what runs now, terminate it (kill it
    after `grace` s), `remember()` again (what appeared meanwhile), then the watched processes still
    running `settle` s later, killed and returned by pid."""
    left: dict[int, str] = {}
    try:
        if process is not None:
            remember()
            terminate(process, grace)
            remember()
            running = processes.still_running_after(settle)
            left = {pid: processes.seen[pid] for pid in running}
            processes.kill(running)
    finally:
        processes.close()
    return left
