"""The user's own terminal, as a terminal client needs it: raw mode for the session's length, and its size.

In raw mode every key reaches the box as the byte it is (Ctrl-C is 0x03, Ctrl-Z 0x1a, Ctrl-D 0x04), so
the box's terminal decides what they mean, as ssh does; this terminal neither echoes nor turns them
into signals for the client. Its settings are put back however the session ends.
"""

from __future__ import annotations

import os
import termios
import tty
from collections.abc import Iterator
from contextlib import contextmanager

DEFAULT_SIZE = (80, 24)


class NotATerminal(RuntimeError):
    """The client was not started on a terminal."""


@contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """`fd`'s terminal in raw mode until the block ends; its settings as they were afterwards."""
    try:
        saved = termios.tcgetattr(fd)
    except termios.error as exc:
        raise NotATerminal(f"owsandbox shell needs a terminal, and its input is not one ({exc})") from None
    tty.setraw(fd, termios.TCSANOW)
    try:
        yield
    finally:
        try:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        except termios.error:
            pass  # the terminal has hung up: there is nothing left to put back


def window_size(fd: int) -> tuple[int, int]:
    """(columns, rows) of `fd`'s terminal; 80x24 when it does not say."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return DEFAULT_SIZE
    if size.columns <= 0 or size.lines <= 0:
        return DEFAULT_SIZE
    return min(size.columns, 0xFFFF), min(size.lines, 0xFFFF)
