"""How the kernel ends when nobody asked it to shut down, or asked and then would not wait: its launcher
is gone, or it is sent SIGTERM.

* The launcher gone. ipykernel watches the process that launched it (JPY_PARENT_PID) and leaves with
  `os._exit` as soon as it is gone, even while a `shutdown_request` is closing the sandbox (`jupyter
  console` sends that request and exits at once), and leaves the box behind: its daemon lingers for a
  kernel that restarts (30 s by default), a cloud sandbox runs until its timeout. Nothing can restart a
  kernel whose manager is gone, so `OrphanWatch`, in place of ipykernel's watch, ends the sandbox (after
  a close already under way), then the kernel. It hears of the parent's end from a pidfd where it can
  (at once), else by looking every second, as ipykernel does.
* SIGTERM. jupyter_client sends it when a kernel has not exited 2.5 s after `shutdown_request` (a cloud
  slow to delete a sandbox on a busy machine), and SIGKILL 2.5 s later; Python's default would end the
  kernel in the middle of the delete. So SIGTERM lets a close under way finish, whether it ends the box
  or keeps it for a restart, then ends the kernel. Without one, the kernel cannot tell a shutdown from
  a restart (some provisioners restart with SIGTERM), and leaves the box as a crash leaves it: kept
  for a kernel that restarts, until its linger or timeout runs out.

Either way the wait is bounded: a cloud that does not answer cannot keep the kernel alive.
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


def end_on_sigterm(let_close_finish: Callable[[], None]) -> None:
    """Called by the kernel's app on the main thread: SIGTERM lets a close of the sandbox under way finish,
    then ends the kernel with the status a SIGTERM gives (a second SIGTERM changes nothing)."""
    once = threading.Lock()

    def terminated(signum: int, _frame: FrameType | None) -> None:
        if once.acquire(blocking=False):
            log.warning("SIGTERM: the kernel ends once a close of its sandbox under way has finished")
            threading.Thread(target=end_then_exit, args=(let_close_finish, 128 + signum), name="sigterm",
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
