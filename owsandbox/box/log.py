"""The daemon's log: the lines `logging` wrote, without importing `logging`.

`logging`, with what it imports (traceback, linecache, tokenize, textwrap, string, weakref), was about
0.7 MiB of an idle daemon's private memory, for a handful of lines in its life. Once `configure`d (by
`serve`), a record is one line on stderr (the daemon's log), in the format the daemon's log has always
had (`logging.basicConfig` with `FORMAT`: `2026-01-02 03:04:05,678 [owbox INFO owsandbox.box.server]
...`), at the level chosen, with the traceback after it for `exception`; a message that cannot be
formatted is said so instead, and a line that cannot be written is dropped. Where the box's code runs
in a process that did not configure it (the direct provider's shells run in the kernel; tests), each
record goes to `logging`, whose configuration is that process's.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

FORMAT = "%(asctime)s [owbox %(levelname)s %(name)s] %(message)s"  # what this module writes, in logging's words
LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40}
_NAMES = {number: name for name, number in LEVELS.items()}

_lock = threading.Lock()
_level: int | None = None  # the daemon's level, once configured: then this module writes the lines itself


def configure(level: str) -> None:
    """From now on this process writes its box records itself, on stderr, from `level` up."""
    global _level
    _level = LEVELS[level.upper()]


def unconfigure() -> None:
    """Back to `logging` (for tests)."""
    global _level
    _level = None


def line(name: str, level: int, message: str, created: float) -> str:
    """One record as `logging.Formatter(FORMAT)` writes it (its default time format, with milliseconds)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
    return f"{stamp},{int((created - int(created)) * 1000):03d} [owbox {_NAMES[level]} {name}] {message}"


class Logger:
    """`logging.Logger`'s calls that the box makes."""

    def __init__(self, name: str) -> None:
        self.name = name

    def debug(self, message: str, *args: Any) -> None:
        self._log(LEVELS["DEBUG"], message, args)

    def info(self, message: str, *args: Any) -> None:
        self._log(LEVELS["INFO"], message, args)

    def warning(self, message: str, *args: Any) -> None:
        self._log(LEVELS["WARNING"], message, args)

    def error(self, message: str, *args: Any) -> None:
        self._log(LEVELS["ERROR"], message, args)

    def exception(self, message: str, *args: Any) -> None:
        """An error with the traceback of the exception being handled."""
        self._log(LEVELS["ERROR"], message, args, with_traceback=True)

    def _log(self, level: int, message: str, args: tuple[Any, ...], with_traceback: bool = False) -> None:
        if _level is None:
            import logging

            logging.getLogger(self.name).log(level, message, *args, exc_info=with_traceback, stacklevel=3)
            return
        if level < _level:
            return
        try:
            said = message % args if args else message
        except Exception as exc:  # noqa: BLE001 - said instead, as logging says it, and the daemon goes on
            said = f"--- Logging error --- {type(exc).__name__}: {exc}; message {message!r}, arguments {args!r}"
        text = line(self.name, level, said, time.time())
        if with_traceback:
            import traceback

            text += "\n" + "".join(traceback.format_exception(*sys.exc_info())).removesuffix("\n")
        try:
            with _lock:
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
        except (OSError, ValueError):  # the log's pipe is gone: nowhere left to say anything
            pass


def getLogger(name: str) -> Logger:  # noqa: N802 - logging's name, so the call sites read as before
    return Logger(name)
