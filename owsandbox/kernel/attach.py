"""`%attach`: long-running JSON-lines programs in the sandbox, watched and steered from the notebook.

A program runs in an execd pipe session (the runner box's own endpoint, or a real OpenSandbox
execd). Its records show live in the output area of the cell that attached, as one display that is
updated at most a few times a second, and keep coming while other cells run: the channels live on
an asyncio loop of their own thread. `%send` writes records; when a record has an `id`, the cell
waits for the answer with that id. Session ids and cursors are remembered in the sandbox, so
`%attach --last` picks up after a kernel restart with nothing lost or repeated. A program that exits
before it is up (before its first record, within a second) makes `%attach` an error that names its
exit status and the last lines of its stderr; so does attaching again to a program that has ended.

`AttachManager` ties the parts together, each with one job:

* `attach_loop.py`: the loop thread the channels run on, and the execd endpoints they reach;
* `attach_registry.py`: the file in the sandbox that remembers programs and cursors;
* `attach_view.py`: what a program's display shows, and when it is brought up to date;
* `attach_answers.py`: which record answers a `%send`, and the waits for those answers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shlex
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .attach_answers import Answers
from .attach_loop import AttachLoop, ch, endpoint_for, has_ended, restarts_when_ended, session_status
from .attach_registry import AttachRegistry, saved_tail
from .attach_view import LiveDisplay, listing_row
from .errors import AttachedProgramExited, AttachError, AttachFailed

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..channel import ExecdEndpoint, ExecdJsonLineChannel

KEEP_RECORDS = 1000  # per program, for the display and %records
# A program that exits this soon after %attach started it makes the cell an error; %attach waits this
# long at most, and returns at the program's first record.
START_CHECK_SECONDS = 1.0
# How long %attach --session/--last waits for execd's exit notice of a program that has ended.
EXIT_NOTICE_SECONDS = 5.0
STDERR_LINES = 10  # the last lines of stderr an error shows


@dataclass
class Program:
    number: int
    name: str
    session_id: str
    endpoint: ExecdEndpoint
    command: str
    cwd: str
    url: str | None = None  # None for the sandbox's own endpoint
    channel: ExecdJsonLineChannel | None = None
    records: deque[tuple[int, dict[str, Any]]] = field(default_factory=lambda: deque(maxlen=KEEP_RECORDS))
    seen: int = 0
    state: str = "starting"
    display_id: str = ""
    parent: dict[str, Any] | None = None
    render_due: bool = False
    cursor: int = 0
    cursor_tail: bytes = b""  # the output just before `cursor`, checked against execd's ring on reattach
    since: int = 0  # where this attachment started reading
    answers: Answers = field(default_factory=Answers)  # the %send records that wait for their answer
    connected_at: float = 0.0  # time.monotonic() when the connection (which starts a new program) began
    ended_at: float | None = None  # when the channel learnt that the program ended
    news: asyncio.Event | None = None  # set by the first record or the failure while %attach waits for either

    def describe(self) -> str:
        return f"#{self.number} {self.name}"


class AttachManager:
    """Every attached program of one kernel: what the magics ask for, done by the parts above."""

    def __init__(self, send_display: Callable[[dict[str, Any], dict[str, Any], str, bool], None],
                 runner_call: Callable[..., Any], box_endpoint: Callable[[], ExecdEndpoint],
                 registry_path: Callable[[], str]) -> None:
        self._box_endpoint = box_endpoint
        self.programs: dict[int, Program] = {}
        self._numbers = 0
        self._loop = AttachLoop()
        self._registry = AttachRegistry(runner_call, registry_path, self.programs.values, self._loop)
        self._view = LiveDisplay(send_display, self._loop)

    # -- attaching --------------------------------------------------------------------------

    def start(self, command: str, name: str | None, cwd: str | None, url: str | None,
              headers: dict[str, str], parent: dict[str, Any]) -> Program:
        endpoint = endpoint_for(url, headers, self._box_endpoint)
        control = ch.ExecdControl(endpoint)
        try:
            session_id = control.create(cwd=cwd)  # the command goes in as the first stdin line
        except ch.ExecdError as exc:
            raise AttachError(f"could not start {command!r}: {exc}") from None
        program = self._new_program(name or _short_name(command), session_id, endpoint, command, cwd or "", url)
        # A program that cannot start (a missing file, a bad import) exits at once: wait for that, or
        # for its first record, which says it is up, but not longer than START_CHECK_SECONDS.
        self._connect(program, 0, parent, settle=START_CHECK_SECONDS, until_record=True, command=command)
        return program

    def reattach(self, session_id: str | None, last: bool, since: int | None, url: str | None,
                 headers: dict[str, str], parent: dict[str, Any]) -> Program:
        saved = self._registry.load()
        entry: dict[str, Any] | None = None
        if last:
            if not saved:
                raise AttachError("no program was attached in this sandbox yet; start one with %attach -- COMMAND")
            entry = saved[-1]
        else:
            entry = next((s for s in saved if s["session_id"].startswith(session_id or "")), None)
            if entry is None and session_id:
                entry = {"session_id": session_id, "name": session_id[:8], "command": "", "cwd": "", "cursor": 0,
                         "url": url}
        assert entry is not None
        for program in self.programs.values():
            if program.session_id == entry["session_id"] and program.channel is not None \
                    and program.channel.is_connected:
                raise AttachError(f"{program.describe()} is attached already; %detach {program.number} first")
        endpoint = endpoint_for(url or entry.get("url"), headers, self._box_endpoint)
        # Ask before every reattach whether the program still runs. On the box's own endpoint an
        # ended program gets an exit notice right after the connection's `connected`: wait for it,
        # so that attaching to it again is an error that says so. A released execd would start a
        # new bash in the session instead (and send no exit), so there it is not connected at all.
        status = session_status(endpoint, entry["session_id"])
        ended = has_ended(status)
        if ended and status is not None and restarts_when_ended(status):
            who = repr(entry["command"]) if entry.get("command") else f"session {entry['session_id'][:8]}"
            raise AttachedProgramExited(
                f"{who} has ended: execd says it is no longer running (its output reached offset "
                f"{status.get('output_offset', '?')}). It is not attached again, since this execd would "
                "start the session anew")
        program = self._new_program(entry.get("name") or entry["session_id"][:8], entry["session_id"], endpoint,
                                    entry.get("command", ""), entry.get("cwd", ""), url or entry.get("url"))
        self._connect(program, since if since is not None else int(entry.get("cursor", 0)), parent,
                      settle=EXIT_NOTICE_SECONDS if ended else 0.0, until_record=False,
                      since_tail=saved_tail(entry) if since is None else b"")
        return program

    def _new_program(self, name: str, session_id: str, endpoint: ExecdEndpoint, command: str, cwd: str,
                     url: str | None) -> Program:
        self._numbers += 1
        program = Program(self._numbers, name, session_id, endpoint, command, cwd, url)
        program.display_id = f"owsandbox-attach-{session_id}-{program.number}"
        self.programs[program.number] = program
        return program

    def _connect(self, program: Program, since: int, parent: dict[str, Any], settle: float = 0.0,
                 until_record: bool = False, command: str | None = None, since_tail: bytes = b"") -> None:
        """Connect `program`'s channel from `since`; then wait up to `settle` seconds for its failure
        (or, with `until_record`, its first record). Raises AttachedProgramExited when the program has
        ended by then, AttachFailed when the channel failed otherwise."""
        program.parent = parent
        program.cursor = program.since = since
        program.cursor_tail = since_tail

        async def on_record(record: dict[str, Any], offset: int) -> None:
            program.records.append((offset, record))
            program.seen += 1
            program.cursor = offset
            program.cursor_tail = program.channel.tail_at(offset) if program.channel is not None else b""
            if until_record and program.news is not None:
                program.news.set()
            if program.channel is not None:
                program.answers.offer(program.channel, record)
            self._view.render_soon(program)
            self._registry.save_soon()

        async def on_failure(exc: BaseException) -> None:
            program.state = f"ended: {exc}"
            if isinstance(exc, ch.ProgramExited) and since > 0 and not exc.stderr_tail.strip():
                # Attached again after its stderr: whatever it wrote came before `since`.
                how = "killed by a signal" if exc.exit_code == -1 else f"exited with code {exc.exit_code}"
                program.state = f"ended: {program.name} {how}"
            program.ended_at = time.monotonic()
            if program.channel is not None:
                program.cursor, program.cursor_tail = program.channel.cursor, program.channel.cursor_tail
            if program.news is not None:
                program.news.set()
            self._view.render_soon(program, now=True)
            self._registry.save_soon()

        async def connect() -> None:
            channel = ch.ExecdJsonLineChannel(program.endpoint, session_id=program.session_id, on_record=on_record,
                                           on_failure=on_failure, label=program.name)
            program.channel = channel
            program.state = "attaching"
            program.news = asyncio.Event()
            self._view.show(program)
            program.connected_at = time.monotonic()
            await channel.connect(since=since, takeover=True, command=command, since_tail=since_tail)
            if channel.fatal is None:
                program.state = "attached"
                if channel.cursor_mismatches:  # loudly: a record may be missing or repeated here
                    program.state = (f"attached, but the saved cursor {since} disagreed with execd's output "
                                     f"ring: resumed at offset {channel.cursor}, the next line boundary")
            if settle > 0 and channel.fatal is None:
                try:
                    await asyncio.wait_for(program.news.wait(), settle)
                except asyncio.TimeoutError:
                    pass
            program.news = None

        try:
            self._loop.run(connect())
        except (ch.ExecdError, RuntimeError, OSError) as exc:
            if not isinstance(_fatal(program), ch.ProgramExited):
                program.state = f"not attached: {exc}"
                self._view.render(program)
                raise AttachError(f"could not attach to {program.describe()}: {exc}") from None
        self._view.render(program)
        self._registry.save_quietly()
        fatal = _fatal(program)
        if fatal is not None:
            raise _failed_at_once(program, fatal, started=until_record)

    # -- using programs ---------------------------------------------------------------------

    def pick(self, number: int | None) -> Program:
        if not self.programs:
            raise AttachError("nothing is attached; start a program with %attach -- COMMAND")
        if number is None:
            return self.programs[max(self.programs)]
        program = self.programs.get(number)
        if program is None:
            raise AttachError(f"no attached program #{number}; %attach --list shows them")
        return program

    def send(self, number: int | None, records: list[dict[str, Any]], wait: float) -> list[dict[str, Any]]:
        """Write records; wait for the answers to those with an `id`; return them in order."""
        program = self.pick(number)
        channel = program.channel
        if channel is None or not channel.is_connected:
            raise AttachError(f"{program.describe()} is not attached ({program.state}); %attach --session "
                              f"{program.session_id[:8]} attaches again")

        try:
            return self._loop.run(program.answers.exchange(channel, records, wait, program.describe()),
                                  timeout=wait + 10)
        except (ch.ExecdError, RuntimeError) as exc:
            raise AttachError(f"could not send to {program.describe()}: {exc}") from None

    def detach(self, number: int | None) -> Program:
        program = self.pick(number)
        channel = program.channel
        if channel is not None:
            self._loop.run(channel.detach())
            program.cursor, program.cursor_tail = channel.cursor, channel.cursor_tail
        program.state = "detached"
        self._view.render(program)
        self._registry.save()
        return program

    def kill(self, number: int | None) -> Program:
        program = self.pick(number)
        channel = program.channel
        if channel is not None:
            self._loop.run(channel.delete())
        else:
            ch.ExecdControl(program.endpoint).delete(program.session_id)
        program.state = "killed"
        self._view.render(program)
        for number in [n for n, p in self.programs.items() if p.session_id == program.session_id]:
            del self.programs[number]  # every attachment to that session is gone with it
        self._registry.save(forget={program.session_id})
        return program

    def listing(self) -> list[dict[str, Any]]:
        saved = {s["session_id"]: s for s in self._registry.load()}
        live: dict[str, dict[str, Any]] = {}
        listed = False  # whether the box's endpoint said which sessions it holds
        try:
            for session in ch.ExecdControl(self._box_endpoint()).list_sessions():
                live[session["session_id"]] = session
            listed = True
        except (ch.ExecdError, OSError) as exc:
            log.debug("the box's endpoint did not list its sessions: %s", exc)
        rows = []
        for session_id in sorted(set(saved) | set(live), key=lambda s: saved.get(s, {}).get("updated", 0)):
            entry, state = saved.get(session_id, {}), live.get(session_id, {})
            attached = max((p for p in self.programs.values() if p.session_id == session_id),
                           key=lambda p: p.number, default=None)  # the newest attachment speaks for it
            known_here = listed and not entry.get("url")  # programs of another execd are not in the box's list
            rows.append(listing_row(session_id, entry, state, attached, known_here))
        return rows

    def close(self) -> None:
        """Detach everything (programs keep running) and write the cursors down, exactly."""
        for program in list(self.programs.values()):
            if program.channel is not None and program.channel.is_connected:
                try:
                    self._loop.run(program.channel.detach(), timeout=10)
                    program.cursor, program.cursor_tail = program.channel.cursor, program.channel.cursor_tail
                    program.state = "detached"
                except (AttachError, ch.ExecdError, RuntimeError) as exc:
                    log.warning("%s: not detached cleanly at shutdown: %s", program.describe(), exc)
        if self.programs:
            self._registry.save_quietly()
        self._loop.stop()

    def cancel_waits(self) -> None:
        """Stop: every %send waiting for an answer gives up now."""
        if not self._loop.started:
            return
        for program in self.programs.values():
            if program.channel is not None:
                program.answers.cancel(program.channel, self._loop)


def _fatal(program: Program) -> BaseException | None:
    return program.channel.fatal if program.channel is not None else None


def _failed_at_once(program: Program, fatal: BaseException, started: bool) -> AttachError:
    """The error for a program whose channel failed while %attach waited: `started` when %attach had
    just started it, else it was attached again."""
    who = f"#{program.number} {program.command!r}" if program.command else program.describe()
    if not isinstance(fatal, ch.ProgramExited):
        return AttachFailed(f"{who}: {fatal} (it may still be running: %attach --kill {program.number} ends it)")
    how = "was ended by a signal" if fatal.exit_code == -1 else f"exited with status {fatal.exit_code}"
    tail = _last_lines(fatal.stderr_tail)
    sep = "\n" if "\n" in tail else " "  # several lines start on a line of their own
    if started:
        seconds = max((program.ended_at or time.monotonic()) - program.connected_at, 0.0)
        text = f"{who} {how} within {math.ceil(seconds * 10) / 10:.1f} s"
        told = f":{sep}{tail}" if tail else ", writing nothing to stderr"
    else:
        text = f"{who} has ended: it {how}"
        told = f"; its stderr ended with:{sep}{tail}" if tail else ""
    return AttachedProgramExited(text + told)


def _last_lines(text: str, lines: int = STDERR_LINES, chars: int = 2000) -> str:
    """The last `lines` lines of `text`, at most `chars` characters of them."""
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


def _short_name(command: str) -> str:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for word in words:
        base = os.path.basename(word)
        if base and not base.startswith("-") and base not in ("python", "python3", "node", "env", "exec", "bash"):
            return base
    return os.path.basename(words[0]) if words else "program"
