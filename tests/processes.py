"""Looking at processes from outside, for tests that check what runs and what is left."""

from __future__ import annotations

import os
import time

from owsandbox.runner.providers.local import descendants, pid_alive

__all__ = ["children", "command_line", "descendants", "name", "pid_alive", "wait_gone"]


def _stat_ppid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


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
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [p for p in pids if pid_alive(p)]
