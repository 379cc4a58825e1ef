"""One command's life on a shell, as one transition table (in the manner of h11's `_state.py`).

A command is given to bash, begun (bash printed its start mark: a SIGINT now aborts the command, not
bash's reading of its input), maybe stopped (by Stop, or by its timeout), and ended (both end markers
came in, or the shell itself ended). Each of these is a `CommandEvent`; `COMMAND_TRANSITIONS` lists
every (state, event) pair that may happen and the state it leads to, and nothing else changes a
command's state. An event the table does not list for the state raises `CommandEventError` naming
both: it means the shell's reader and its callers disagree about the command, which must be seen.

Events that may come more than once, or race the end from other threads, are in the table as moves
to the same state, each for a reason: a second Stop (the first one's reason stays), a timeout that
fires as a Stop is under way, a Stop or timer that comes as the command ends, a start mark that comes
after the wait for it ran out (the command was signalled already).

How a command ended is its final state, and only that: `ENDINGS` maps each final state to the
result's `outcome`, its error and `timed_out`. The stop's reason is part of the state (an interrupt
and a timeout are different states), and so is whether the SIGINT has been sent: a command is
signalled once, by the caller whose event moved it into `SIGNALLED`.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ... import protocol as P
from ...protocol import messages as M
from .capture import LiveBatcher, OutputRecord
from .cellusage import CellMeter
from .lines import MARK_ERR_FD, MARK_OUT_FD


class CommandState(enum.Enum):
    SENT = "sent"  # its line is given to bash, which has not begun it yet
    RUNNING = "running"  # bash printed the line's start mark: it runs the command
    INTERRUPT_PENDING = "interrupt pending"  # Stop came before bash began it: signalled when it begins
    TIMEOUT_PENDING = "timeout pending"  # its timeout came before bash began it: likewise
    INTERRUPTING = "interrupting"  # Stop: SIGINT sent, the escalation under way
    TIMING_OUT = "timing out"  # its timeout: SIGINT sent, the escalation under way
    # Final: how it ended.
    EXITED = "exited"  # both end markers came in; the status is the command's
    SHELL_EXITED = "shell exited"  # the shell itself ended while it ran (exit, set -e, a signal)
    INTERRUPTED = "interrupted"  # stopped by Stop; its end markers came in
    INTERRUPTED_SHELL_ENDED = "interrupted, shell ended"  # stopped by Stop, which ended the shell
    TIMED_OUT = "timed out"  # stopped at its timeout; its end markers came in
    TIMED_OUT_SHELL_ENDED = "timed out, shell ended"  # stopped at its timeout, and the shell ended


class CommandEvent(enum.Enum):
    BEGUN = "begun"  # bash printed the line's start mark (`lines.command_line`)
    INTERRUPT = "interrupt"  # Stop (`shell.interrupt`)
    TIMEOUT = "timeout"  # its `timeout_s` has passed
    BEGIN_WAIT_OVER = "begin wait over"  # a stop waited BEGIN_WAIT_SECONDS for the start mark: signal anyway
    MARKERS_IN = "markers in"  # both end markers came in: all of its output is read
    SHELL_GONE = "shell gone"  # the shell itself ended


S, E = CommandState, CommandEvent

#: The states in which a stop has been asked for, whether or not it has been signalled or ended since.
STOPPED = frozenset({S.INTERRUPT_PENDING, S.TIMEOUT_PENDING, S.INTERRUPTING, S.TIMING_OUT,
                     S.INTERRUPTED, S.INTERRUPTED_SHELL_ENDED, S.TIMED_OUT, S.TIMED_OUT_SHELL_ENDED})
#: The states in which the command has been sent SIGINT (and the escalation runs).
SIGNALLED = frozenset({S.INTERRUPTING, S.TIMING_OUT})
#: The states in which a stop waits for bash to begin the line before it signals.
PENDING = frozenset({S.INTERRUPT_PENDING, S.TIMEOUT_PENDING})
FINAL = frozenset({S.EXITED, S.SHELL_EXITED, S.INTERRUPTED, S.INTERRUPTED_SHELL_ENDED, S.TIMED_OUT,
                   S.TIMED_OUT_SHELL_ENDED})


def _stop_rows(pending: CommandState, signalled: CommandState, ended: CommandState,
               shell_ended: CommandState) -> dict[tuple[CommandState, CommandEvent], CommandState]:
    """The rows of one kind of stop (an interrupt or a timeout): they differ only in their states."""
    rows = {}
    for state in (pending, signalled):
        rows[state, E.INTERRUPT] = state  # a second stop changes nothing: the first one's reason stays
        rows[state, E.TIMEOUT] = state
        rows[state, E.BEGIN_WAIT_OVER] = signalled  # pending: signal anyway; signalled: the start mark came first
        rows[state, E.BEGUN] = signalled  # pending: signal now; signalled: the wait for it ran out first
        rows[state, E.MARKERS_IN] = ended
        rows[state, E.SHELL_GONE] = shell_ended
    return rows


#: Every way a command's state may change, in one place: (state, event) -> new state. Any other pair
#: raises `CommandEventError`.
COMMAND_TRANSITIONS: dict[tuple[CommandState, CommandEvent], CommandState] = {
    (S.SENT, E.BEGUN): S.RUNNING,
    (S.SENT, E.INTERRUPT): S.INTERRUPT_PENDING,  # a SIGINT while bash reads its input would cost the shell
    (S.SENT, E.TIMEOUT): S.TIMEOUT_PENDING,
    (S.SENT, E.MARKERS_IN): S.EXITED,  # the start mark is on the pipe and may be read after a terminal's markers
    (S.SENT, E.SHELL_GONE): S.SHELL_EXITED,
    (S.RUNNING, E.INTERRUPT): S.INTERRUPTING,
    (S.RUNNING, E.TIMEOUT): S.TIMING_OUT,
    (S.RUNNING, E.MARKERS_IN): S.EXITED,
    (S.RUNNING, E.SHELL_GONE): S.SHELL_EXITED,
    **_stop_rows(S.INTERRUPT_PENDING, S.INTERRUPTING, S.INTERRUPTED, S.INTERRUPTED_SHELL_ENDED),
    **_stop_rows(S.TIMEOUT_PENDING, S.TIMING_OUT, S.TIMED_OUT, S.TIMED_OUT_SHELL_ENDED),
    # Ended: a Stop, a timeout or a stop's wait that comes from another thread as it ends finds it ended.
    **{(state, event): state for state in FINAL for event in (E.INTERRUPT, E.TIMEOUT, E.BEGIN_WAIT_OVER)},
}


class Ending(NamedTuple):
    """How a command ended, as its result says it."""

    outcome: str
    error: str | None
    timed_out: bool


#: The error of a command whose shell ended under it (or that a stop had to end with the shell).
SHELL_GONE_ERROR = ("the shell '{shell}' exited (status {status}); the next command starts a new shell in {cwd} "
                    "(variables are gone)")
#: Each final state: the result's outcome, its error (a template: `{timeout_s}`, `{shell}`, `{status}`,
#: `{cwd}`) and whether it timed out.
ENDINGS: dict[CommandState, tuple[str, str | None, bool]] = {
    S.EXITED: (P.OUTCOME_EXIT, None, False),
    S.SHELL_EXITED: (P.OUTCOME_SHELL_EXITED, SHELL_GONE_ERROR, False),
    S.INTERRUPTED: (P.OUTCOME_INTERRUPT, "interrupted by user", False),
    S.INTERRUPTED_SHELL_ENDED: (P.OUTCOME_INTERRUPT,
                                "interrupted by user; the shell had to be ended, and a new one starts in its folder",
                                False),
    S.TIMED_OUT: (P.OUTCOME_TIMEOUT, "timed out after {timeout_s:g} s", True),
    S.TIMED_OUT_SHELL_ENDED: (P.OUTCOME_TIMEOUT, SHELL_GONE_ERROR, True),
}


class CommandEventError(RuntimeError):
    """An event that the table does not allow in the command's state: the reader and its callers
    disagree about where the command is, which is a fault to see, never to pass over."""

    def __init__(self, state: CommandState, event: CommandEvent) -> None:
        super().__init__(f"a command in state {state.name} cannot take event {event.name}")
        self.state = state
        self.event = event


#: Where a command's live frames go: each frame's kind (the notification's method: output, progress, a
#: prompt) and its fields (the request's `id` and the shell's name are the dispatcher's to add).
LiveSink = Callable[[str, dict[str, Any]], None]


class Command:
    """One command in flight on a shell. Its life is `state`, changed only by `advance` (from the
    reader's thread, a Stop's and the timers'); the rest is what the reader learns on the way
    (output, prompts, the end markers' status and folder)."""

    def __init__(self, command: str, token: str, record: OutputRecord, batcher: LiveBatcher,
                 on_live: LiveSink | None,
                 on_done: Callable[[M.RunResult], None], timeout_s: float | None) -> None:
        self.command = command
        self.token = token
        self.record = record
        self.batcher = batcher
        self.on_live = on_live
        self.on_done = on_done
        self.timeout_s = timeout_s
        self.timer: threading.Timer | None = None  # its timeout, cancelled when it ends: a thread each
        self.started = time.monotonic()
        self.exit_code: int | None = None
        self.cwd: str | None = None
        self._state = CommandState.SENT
        self._state_lock = threading.Lock()  # events come from the reader, a Stop and the timers
        self._markers: set[str] = set()  # the streams whose end marker came in (a tally: `end_marker`)
        self.finished = threading.Event()  # set once its result is handed over
        self.frames_sent = 0
        self.last_news = self.started  # when the client last heard of this command (output or progress)
        self.terminal = False  # its stdin and output are the shell's terminals
        self.marker_fds = (MARK_OUT_FD, MARK_ERR_FD)
        self.notice_channel = "stderr"  # where bash's own stderr goes while it runs
        self.first_pid: int | None = None  # the namespace's last pid when it started: its jobs come after
        self.allow_stdin = False  # whoever asked can answer a prompt (else a read gets end-of-input)
        self.partial = ""  # the unfinished last line of its stdout: a prompt, when it waits to read
        self.last_check = self.started
        self.handled: tuple[int, int | None, int] | None = None  # the wait last reported or given end-of-input
        self.reading = 0  # which terminal that wait reads (0: stdin's, 1: stderr's)
        self.waiting_since: float | None = None  # when a wait with no prompt printed yet was first seen
        self.eof_noted = False
        self.meter: CellMeter | None = None  # its peak memory and CPU seconds (`RunResult.usage`)

    @property
    def state(self) -> CommandState:
        return self._state

    def advance(self, event: CommandEvent) -> tuple[CommandState, CommandState]:
        """Move on by `event`, as the table says; the states before and after. Raises
        `CommandEventError` for an event the table does not allow now."""
        if not isinstance(event, CommandEvent):
            raise TypeError(f"a command's event is a CommandEvent, not {event!r}")
        with self._state_lock:
            before = self._state
            after = COMMAND_TRANSITIONS.get((before, event))
            if after is None:
                raise CommandEventError(before, event)
            self._state = after
        return before, after

    def end_marker(self, stream: str) -> bool:
        """Note that `stream`'s end marker came in (a marker given again by a stop's escalation counts
        once); whether both are in now, when `MARKERS_IN` is due."""
        self._markers.add(stream)
        return len(self._markers) == 2

    @property
    def stopping(self) -> bool:
        """Whether Stop or its timeout has asked it to end (whether or not it has ended since)."""
        return self._state in STOPPED

    @property
    def ended(self) -> bool:
        return self._state in FINAL

    def ending(self, shell: str = "", status: int | None = None, cwd: str = "") -> Ending:
        """How it ended, from its final state alone; `shell`, `status` and `cwd` (the shell's, as it
        ended) go into the error of a command whose shell ended."""
        entry = ENDINGS.get(self._state)
        if entry is None:
            raise RuntimeError(f"a command in state {self._state.name} has not ended: it has no ending yet")
        outcome, error, timed_out = entry
        if error is not None:
            error = error.format(timeout_s=self.timeout_s, shell=shell, status=status, cwd=cwd)
        return Ending(outcome, error, timed_out)
