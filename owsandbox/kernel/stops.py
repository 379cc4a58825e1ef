"""Which commands a Stop ends: the cell's running commands, and a cell's command that has not started.

A Stop (`interrupt_request` on the control channel, or SIGINT) is handled on another thread than the
cell, and may come at any moment of it: before the cell's first command is sent (the cell still
waits for the sandbox, or runs a magic first), between its sending and the box starting it, or
before the kernel has even taken up the `execute_request` (the two channels are not ordered). None
of these may lose it:

* a Stop while a cell executes ends its running commands (`shell.interrupt` with each run's request
  id) and every command the cell would start after it (`before_start` is true, and the cell ends as
  interrupted without sending it);
* a command sent in the moment of the Stop is told by `started`, which the kernel calls after
  sending it: true means the Stop came in between, and the kernel interrupts that run itself;
* a Stop while no cell executes is kept by the time its message was sent: a cell whose
  `execute_request` was sent at or before it is stopped as it begins (`cell_began`), a later cell
  is not (a Stop pressed while nothing ran stops nothing later). Both times are the sending
  client's clock, as the message headers carry them.

Plain data under one lock, tested without a kernel.
"""

from __future__ import annotations

import threading
from datetime import datetime


class CellStops:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executing = False
        self._stopped = False  # a Stop came while the current cell executes
        self._idle_stop: datetime | None = None  # the sending time of the latest Stop that found no cell
        self._running: dict[str, str] = {}  # shell -> the request id of the run the cell has on it

    def cell_began(self, sent: datetime | None) -> bool:
        """A cell begins, its `execute_request` sent at `sent`; whether a Stop sent at or after that
        came before it (then it is stopped before it starts)."""
        with self._lock:
            self._executing = True
            self._running.clear()
            idle = self._idle_stop
            self._stopped = idle is not None and sent is not None and _comparable(sent, idle) and sent <= idle
            return self._stopped

    def cell_ended(self) -> None:
        with self._lock:
            self._executing = self._stopped = False
            self._running.clear()

    def stop(self, sent: datetime | None) -> list[tuple[str, str]]:
        """A Stop, sent at `sent`: the (shell, request id) of the runs to interrupt now."""
        with self._lock:
            if self._executing:
                self._stopped = True
            elif sent is not None and (self._idle_stop is None or not _comparable(sent, self._idle_stop)
                                       or sent > self._idle_stop):
                self._idle_stop = sent
            return list(self._running.items())

    @property
    def before_start(self) -> bool:
        """Whether the executing cell was stopped: it starts nothing more."""
        with self._lock:
            return self._stopped

    def started(self, shell: str, request_id: str) -> bool:
        """The cell sent run `request_id` on `shell`; true when a Stop came since `before_start` was
        last read (the caller interrupts the run: the Stop did not know it)."""
        with self._lock:
            self._running[shell] = request_id
            return self._stopped

    def ended(self, shell: str, request_id: str) -> None:
        with self._lock:
            if self._running.get(shell) == request_id:
                del self._running[shell]

    def running(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._running.items())


def _comparable(a: datetime, b: datetime) -> bool:
    """Whether two datetimes can be ordered (both aware or both naive)."""
    return (a.tzinfo is None) == (b.tzinfo is None)
