"""How the kernel ends when nobody asks it to shut down: its launcher is gone, or it is sent SIGTERM.

Either way the sandbox must end before the kernel does. Left behind, a box's daemon lingers for a
kernel that restarts (30 s by default) and a cloud sandbox keeps running until its timeout, yet nothing
restarts a kernel whose manager is gone, and a kernel sent SIGTERM was told to end.

* The launcher gone. ipykernel watches the process that launched it (JPY_PARENT_PID) and leaves with
  `os._exit` as soon as it is gone, and so also ends a kernel that is still closing its sandbox after a
  `shutdown_request`: `jupyter console` sends that request and exits at once. `OrphanWatch` takes the
  place of ipykernel's watch; it hears of the parent's end from a pidfd where it can (at once), else by
  looking every second, as ipykernel does.
* SIGTERM. jupyter_client sends it when a kernel has not exited 2.5 s after `shutdown_request` (a cloud
  slow to delete a sandbox on a busy machine), and SIGKILL 2.5 s later; Python's default would end the
  kernel in the middle of the delete.

Both end the sandbox first, waiting for a close already under way, for a bounded time, then exit.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

log = logging.getLogger(__name__)

END_SECONDS = 20.0  # a sandbox that cannot be ended in this time (a cloud that does not answer) is left
POLL_SECONDS = 1.0


def end_then_exit(end_sandbox: Callable[[], None], status: int, seconds: float = END_SECONDS) -> NoReturn:
    """Run `end_sandbox` for at most `seconds` (on a thread of its own, so a hung cloud cannot hold the
    exit up), then leave the process with `status`."""
    ending = threading.Thread(target=_logged, args=(end_sandbox,), name="sandbox-end", daemon=True)
    ending.start()
    ending.join(seconds)
    if ending.is_alive():
        log.error("the sandbox did not end within %g s; the kernel leaves without it", seconds)
    os._exit(status)


def _logged(end_sandbox: Callable[[], None]) -> None:
    try:
        end_sandbox()
    except Exception:
        log.exception("the sandbox could not be ended")


def end_on_sigterm(end_sandbox: Callable[[], None]) -> None:
    """Called by the kernel's app on the main thread: SIGTERM ends the sandbox, then the kernel, with the
    status a SIGTERM gives (a second SIGTERM changes nothing)."""
    once = threading.Lock()

    def terminated(signum: int, _frame: FrameType | None) -> None:
        if once.acquire(blocking=False):
            log.warning("SIGTERM: the sandbox ends, then the kernel")
            threading.Thread(target=end_then_exit, args=(end_sandbox, 128 + signum), name="sigterm",
                             daemon=True).start()

    signal.signal(signal.SIGTERM, terminated)


class OrphanWatch(threading.Thread):
    """Started by the kernel's app in place of ipykernel's ParentPollerUnix: once the parent is gone the
    sandbox ends, then the process, with ipykernel's status (1)."""

    def __init__(self, parent_pid: int, end_sandbox: Callable[[], None]) -> None:
        super().__init__(name="orphan-watch", daemon=True)
        self.parent_pid = parent_pid
        self.end_sandbox = end_sandbox

    def run(self) -> None:
        self.wait_until_orphaned()
        log.warning("the process that started this kernel (pid %d) is gone: the sandbox ends, then the kernel",
                    self.parent_pid)
        end_then_exit(self.end_sandbox, 1)

    def wait_until_orphaned(self) -> None:
        """Return once the parent has gone. A kernel not started by `parent_pid` itself (a launcher in
        between) is orphaned, as ipykernel has it, when init adopts it."""
        if os.getppid() != self.parent_pid:
            self._poll(lambda: os.getppid() == 1)
            return
        try:
            pidfd = os.pidfd_open(self.parent_pid)
        except (AttributeError, OSError):  # no pidfds here (an older kernel), or the parent is gone already
            self._poll(lambda: os.getppid() != self.parent_pid)
            return
        try:
            if os.getppid() == self.parent_pid:  # the pidfd is the parent's, not a later process's
                select.select([pidfd], [], [])
        finally:
            os.close(pidfd)

    @staticmethod
    def _poll(orphaned: Callable[[], bool]) -> None:
        while not orphaned():
            time.sleep(POLL_SECONDS)
