"""What an attached program shows: one display in the output area of the cell that attached it (a
header with its state and cursor, then its conversation as timeline.py lays it out), updated
at most a few times a second however fast records arrive (and once a second while a call is
pending, so that its timer counts), and counted against that cell's output limit as the one
display it is (kernel/cell/budget.py); and the words of `%attach --list`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...protocol.words import counted
from ...terminal.boxshell import terminal_label
from .timeline import RECORD_CHARS as RECORD_CHARS  # the view's line length, named here too
from .timeline import timeline

if TYPE_CHECKING:
    from .loop import AttachLoop
    from .session import Program

RENDER_SECONDS = 0.2  # the live display is updated at most this often
PENDING_TICK_SECONDS = 1.0  # and this often while a call is pending, for its timer


def bundle(program: Program) -> dict[str, Any]:
    """The display's content: the header line, then the conversation (timeline.py)."""
    header = (f"{program.describe()} [{program.state}] session {program.session_id[:8]}, cursor "
              f"{program.cursor}, {counted(program.seen, 'record')}"
              + (f" — {program.command}" if program.command else ""))
    return {"text/plain": "\n".join([header, *timeline(program.conversation, program.number, time.time())])}


class LiveDisplay:
    """Sends programs' displays: `send_display(parent, data, display_id, update)` is the kernel's."""

    def __init__(self, send_display: Callable[[dict[str, Any], dict[str, Any], str, bool], None],
                 loop: AttachLoop) -> None:
        self._send_display = send_display
        self._loop = loop

    def show(self, program: Program) -> None:
        """The program's display, new in the output of the cell that attached it (`program.parent`),
        once that cell has said which program it attached: the line that says so comes first."""
        program.shown = True
        program.render_due = False
        if program.parent is not None:
            self._send_display(program.parent, bundle(program), program.display_id, False)
        self._tick_while_pending(program)

    def render(self, program: Program) -> None:
        """The program's display, brought up to date now (nothing before `show`)."""
        program.render_due = False
        if program.parent is not None and program.shown:
            self._send_display(program.parent, bundle(program), program.display_id, True)
            self._tick_while_pending(program)

    def render_soon(self, program: Program, now: bool = False) -> None:
        """Bring the display up to date within RENDER_SECONDS (at once with `now`), once however many
        records arrive meanwhile."""
        if now:
            self.render(program)
            return
        if not program.render_due:
            program.render_due = True
            self._loop.call_later(RENDER_SECONDS, self.render, program)

    def _tick_while_pending(self, program: Program) -> None:
        """A pending call's timer counts on screen: one more frame a second while any call waits, the
        notebook's or the program's own (each frame replaces the one before, so the cell's output
        limit counts it once)."""
        if program.ticking or not program.attached or not program.conversation.pending_calls():
            return
        program.ticking = True

        def tick() -> None:
            program.ticking = False
            self.render_soon(program)

        self._loop.call_later(PENDING_TICK_SECONDS, tick)


def listing_row(session_id: str, entry: dict[str, Any], session: dict[str, Any], attached: Program | None,
                known_here: bool) -> dict[str, Any]:
    """One row of `%attach --list`: the registry's `entry`, execd's `session` (empty when it did not
    list it; `known_here` when it lists every session of the program's endpoint) and the newest
    attachment in this kernel, if any."""
    return {"#": attached.number if attached else "-", "session": session_id[:8],
            "name": entry.get("name", ""), "command": _command(entry.get("command") or session.get("command", "")),
            "program": program_state(session, known_here), "offset": session.get("output_offset", "?"),
            "cursor": attached.cursor if attached else entry.get("cursor", 0),
            "attachment": attachment_state(attached.state if attached else entry.get("state", ""))}


def _command(command: Any) -> str:
    """A session's command as the list shows it: a terminal's kilobyte of set-up as a short label."""
    text = command if isinstance(command, str) else ""
    return terminal_label(text) or text


def program_state(session: dict[str, Any], known_here: bool) -> str:
    """The program's state as execd lists it: running, exited N, ended by a signal, gone, unknown."""
    if not session:
        return "gone" if known_here else "unknown"
    if session.get("running") is True:
        return "running"
    code = session.get("exit_code")
    if code == -1:
        return "ended by a signal"
    if isinstance(code, int):
        return f"exited {code}"
    return "not started"


def attachment_state(state: str) -> str:
    """A Program.state, short: attached, detached, ended, killed, not attached (the reason is in its display)."""
    return state.partition(":")[0].strip() or "-"
