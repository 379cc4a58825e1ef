"""The functions, aliases and PATH that cells defined in a shell, written to a file for completion.

Completion and inspection (complete.py) need the functions and aliases that cells defined, which only
the shell knows. The shell writes them when asked, and only while it is idle: one line (builtins
only: `declare -f`, `alias -p`, `declare -p PATH` into a private file, then a marker), written under
the lock that starts commands, so a command that comes meanwhile is queued behind it in bash's input
and the two cannot mix; the line leaves `$?` and `$_` as the end marker left them and sends nothing
to the command's channels (not even `set -x` traces). A busy shell is never written to: its file is
used as it is. So that this file is not stale, a shell that was asked once writes it again when it
has been idle for DEFINITIONS_REFRESH_SECONDS after a command: cells run at a person's pace leave
that moment, so a function defined in one is known while the next one runs; commands that follow at
once (Run All, an agent) are not held up, and a busy shell's file may then be a few cells old. Only a
command that comes in the very moment the line runs waits for it (~0.1 ms; ~1 ms once a cell has
sourced a big library of functions, such as bash-completion's): written before every command, the
line would cost each ~0.4 ms of round trip, ~1.6 ms with such a library.

A Tab may read the file while the shell writes it again, so the shell never writes it in place: each
line writes a file of its own token beside it, and the daemon renames that onto the path when the
line's marker comes (the marker follows the write). A reader opens the last whole file or the new one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from .lines import definitions_line

DEFINITIONS_REFRESH_SECONDS = 0.05  # idle this long after a command, a shell asked once writes them again


class Definitions:
    """A shell's definitions file at `path` (None: not wanted). `lock` is the shell's, under which
    commands start; `idle()` (asked under it) says whether the shell is up and runs nothing; `write`
    gives bash a line."""

    def __init__(self, path: str | None, lock: threading.Lock, idle: Callable[[], bool],
                 write: Callable[[str], None]) -> None:
        self.path = path
        self._lock = lock
        self._idle = idle
        self._write = write
        self._wanted: dict[str, threading.Event | None] = {}  # marker token -> set when written (None: a refresh)
        self._used = False  # asked for once: written again once the shell has been idle a moment
        self.refresh_at: float | None = None  # when to write them again, if still idle (reader thread)

    def write_now(self, timeout: float) -> bool:
        """Have the shell write them, if it is idle; True once they are written. A busy shell is left
        alone: its file is as it was."""
        if self.path is None:
            return False
        self._used = True
        written = threading.Event()
        with self._lock:  # `run` starts a command under this lock: it cannot write its line before ours
            if not self._idle() or not self._give_line(written):
                return False
        return written.wait(timeout)

    def _give_line(self, written: threading.Event | None) -> bool:
        """Give bash the line (under the lock, the shell idle); False if it cannot be written."""
        assert self.path is not None
        token = os.urandom(8).hex()
        self._wanted[token] = written  # before the line: its marker may come at once
        try:
            self._write(definitions_line(self.path, token))
        except OSError:
            del self._wanted[token]
            return False  # the reader sees the shell go
        return True

    def command_started(self) -> None:
        """A command comes (under the shell's lock): it goes first, the refresh waits."""
        self.refresh_at = None

    def command_ended(self) -> None:
        """A command ended (under the shell's lock): once asked for, they are written again soon."""
        if self._used:
            self.refresh_at = time.monotonic() + DEFINITIONS_REFRESH_SECONDS

    def refresh(self) -> None:
        """Write them again, if no command has started since the last one ended (one that has will set
        a new time when it ends). No marker: nobody waits for this one."""
        with self._lock:
            self.refresh_at = None
            if self._idle() and self.path is not None:
                self._give_line(None)

    def on_marker(self, token: str) -> bool:
        """Whether `token` is the marker of a definitions line: its file is whole, and becomes the
        one a Tab reads (whoever waits for it is told then)."""
        if token not in self._wanted:
            return False
        written = self._wanted.pop(token)
        assert self.path is not None
        try:
            os.replace(f"{self.path}.{token}", self.path)
        except OSError:
            pass  # bash could not write it (`|| :`): the last one stays
        if written is not None:
            written.set()
        return True

    def shell_exited(self) -> None:
        """No write will come: whoever waits is told now, and the files go, a line's unfinished one too."""
        for token, written in list(self._wanted.items()):
            if written is not None:
                written.set()
            self._remove(f"{self.path}.{token}")
        self._wanted.clear()
        if self.path is not None:
            self._remove(self.path)

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass
