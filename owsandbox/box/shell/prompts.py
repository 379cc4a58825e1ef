"""A running command that waits to read its terminal: noticed, asked about once, answered.

Whether it waits is read from /proc (terminal.py `waiting_reader`), never guessed from a silence. A
wait is reported once, with the prompt the command printed and whether echo is off; when whoever
asked cannot answer, the command gets end-of-input instead, and a note says so once.
"""

from __future__ import annotations

from collections.abc import Callable

from ...protocol.methods import SHELL_INPUT_WANTED
from .command import Command
from .delivery import Delivery
from .process import BashProcess
from .reader import ChannelReader
from .terminal import EOF_NOTE, waiting_reader

INPUT_CHECK_SECONDS = 0.02  # how often a running command's terminal is checked for a waiting reader
# How long a wait with no prompt read yet is looked at again before it is asked about with none: what the
# reader printed just before it waits is handed on through the terminal by a kernel worker, which a busy
# machine runs late (a second `input('b? ')` was once asked about as '' with one look 20 ms later). A
# read that prints no prompt (`cat`, `read` alone) is asked about this much later; one that no one can
# answer gets end-of-input after one more look, as its prompt only goes before the note.
PROMPT_SETTLE_SECONDS = 0.3


class Prompts:
    """Watches the running command's terminals for a reader (`check`) and types answers (`answer`)."""

    def __init__(self, bash: BashProcess, channels: ChannelReader, delivery: Delivery,
                 current: Callable[[], Command | None]) -> None:
        self._bash = bash
        self._current = current
        self._channels = channels
        self._delivery = delivery

    def check(self, cmd: Command, now: float) -> None:
        """Whether `cmd` now waits to read its terminal: if so, say so once (with the prompt it
        printed, and whether echo is off), or, when no one can answer, give it end-of-input."""
        if cmd.stopping or now - cmd.last_check < INPUT_CHECK_SECONDS:
            return
        cmd.last_check = now
        terminals = self._bash.terminals
        wait = waiting_reader(self._bash.pid, [terminal.device for terminal in terminals],
                              [terminal.hides_input() for terminal in terminals])
        if wait is None:
            cmd.waiting_since = None
            return
        if wait == cmd.handled:
            return  # the wait already asked about (or answered, and the reader has not run since)
        # What the reader printed before it began to wait may still be on its way through the terminal
        # (a terminal hands output on from a kernel worker): read both, then look at the prompt.
        self._channels.take_terminals(now)
        if self._current() is not cmd:
            return
        self._channels.flush_lines(now)  # a command waiting to read has written all it will before the answer
        if not cmd.partial:  # no prompt yet: more looks, in case it is still in the terminal
            if cmd.waiting_since is None:
                cmd.waiting_since = now
            if now - cmd.waiting_since < (PROMPT_SETTLE_SECONDS if cmd.allow_stdin else INPUT_CHECK_SECONDS):
                return
        cmd.handled = wait
        cmd.reading = wait[2]
        cmd.waiting_since = None
        terminal = terminals[cmd.reading]
        if not cmd.allow_stdin:
            if not cmd.eof_noted:
                cmd.eof_noted = True
                self._delivery.note(cmd, EOF_NOTE, now)
            cmd.partial = ""
            terminal.write(terminal.end_of_input())
            return
        self._delivery.send_live(cmd, cmd.batcher.flush())  # the prompt goes out before the question
        assert cmd.on_live is not None
        cmd.on_live(SHELL_INPUT_WANTED, {"prompt": cmd.partial, "password": terminal.hides_input()})

    def answer(self, cmd: Command, text: str | None) -> None:
        """Type `text` and Enter into the terminal `cmd` reads (None: end-of-input)."""
        cmd.partial = ""  # the next prompt is what comes after the answer (which may come at once)
        terminal = self._bash.terminals[cmd.reading]
        if text is None:
            terminal.write(terminal.end_of_input())
        else:
            data = text.replace("\r\n", "\n").replace("\n", " ").encode("utf-8", "surrogateescape") + b"\n"
            if terminal.echoes():  # by the terminal, or by a line editor (readline) in its place
                self._channels.expect_echo(cmd.reading, data)
            terminal.write(data)
