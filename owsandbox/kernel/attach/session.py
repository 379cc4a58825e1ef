"""`%attach`: long-running JSON-lines programs in the sandbox, watched and steered from the notebook.

A program runs in an execd pipe session (the runner box's own endpoint, or a real OpenSandbox
execd). Its records show live in the output area of the cell that attached, as one display that is
updated at most a few times a second, and keep coming while other cells run: the channels live on
an asyncio loop of their own thread. `%send` writes records; a request waits for its answer. A
program that speaks JSON-RPC 2.0 (MCP, ACP, LSP over lines) is followed as a conversation: calls
with their latency, notifications, stderr and stray stdout lines in lanes of their own, error
answers as the cell's error, Stop as the dialect's cancel, and the whole of it saved and replayed
against a fresh program. Session ids, numbers and cursors are remembered in the sandbox, so
`%attach --last` picks up after a kernel restart with nothing lost or repeated, under the same
number. A program that exits before it is up (before its first record, within a second) makes
`%attach` an error that names its exit status and the last lines of its stderr; so does attaching
again to a program that has ended.

`AttachManager` ties the parts together, each with one job:

* `loop.py`: the loop thread the channels run on, and the execd endpoints they reach;
* `registry.py`: the file in the sandbox that remembers programs and cursors;
* `view.py` and `timeline.py`: what a program's display shows, and when;
* `conversation.py` (with `jsonrpc.py`, `dialects.py`, `jsonrpc_errors.py`): what was said both ways,
  matched into calls;
* `answers.py`: the waits for a `%send`'s answers, their timeouts and cancels;
* `asked.py`: the program's own requests: the line that answers one, and `--answer` files;
* `tools.py` (with `json_schema.py`): the methods and tools it named, a tools/call's check;
* `replay.py`: saved conversations and a replay's verdict.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import AttachedProgramExited, AttachError, AttachFailed
from . import jsonrpc as R
from .answers import Answers, NoAnswer, Waiter, error_in
from .asked import AutoAnswer, saved_answers
from .conversation import RECEIVED, SENT, Call, Conversation, Entry
from .dialects import DIALECTS
from .jsonrpc_errors import JsonRpcError
from .loop import AttachLoop, ch, endpoint_for, has_ended, restarts_when_ended, session_status
from .registry import AttachRegistry, saved_tail
from .replay import Saved
from .tools import Vocabulary
from .view import LiveDisplay, listing_row

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ...channel import ExecdEndpoint, ExecdJsonLineChannel
    from ...settings import Settings

# A program that exits this soon after %attach started it makes the cell an error; %attach waits this
# long at most, and returns at the program's first record. A box slow to answer is slow to start the
# program too (a loaded machine, a far one), so the wait grows by SLOW_BOX_FACTOR times what the
# connection that started it took.
START_CHECK_SECONDS = 1.0
SLOW_BOX_FACTOR = 4.0
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
    conversation: Conversation = field(default_factory=Conversation)
    state: str = "starting"
    display_id: str = ""
    parent: dict[str, Any] | None = None
    render_due: bool = False
    shown: bool = False  # its display went out (after the line saying what was attached)
    ticking: bool = False  # a frame is due for the timer of a pending call
    attachments: int = 0  # connections made in this kernel, for a display of each
    on_change: Callable[[], None] = lambda: None  # the view has news (set by the manager)
    cursor: int = 0
    cursor_tail: bytes = b""  # the output just before `cursor`, checked against execd's ring on reattach
    since: int = 0  # where this attachment started reading
    replayed_from: int = 0  # where execd was asked to replay from (before `since` when the cursor is checked)
    answers: Answers = field(default_factory=Answers)  # the %send records that wait for their answer
    connected_at: float = 0.0  # time.monotonic() when the connection (which starts a new program) began
    ended_at: float | None = None  # when the channel learnt that the program ended
    news: asyncio.Event | None = None  # set by the first record or the failure while %attach waits for either
    auto_answers: dict[str, AutoAnswer] = field(default_factory=dict)  # method → `--answer` for its requests
    vocabulary: Vocabulary = field(default_factory=Vocabulary)  # methods said, tools listed

    def describe(self) -> str:
        return f"#{self.number} {self.name}"

    @property
    def seen(self) -> int:
        """Records received from the program, in every attachment of this kernel."""
        return self.conversation.counts[RECEIVED]

    @property
    def attached(self) -> bool:
        return self.channel is not None and self.channel.is_connected

    def changed(self) -> None:
        self.on_change()


class AttachManager:
    """Every attached program of one kernel: what the magics ask for, done by the parts above."""

    def __init__(self, send_display: Callable[[dict[str, Any], dict[str, Any], str, bool], None],
                 runner_call: Callable[..., Any], box_endpoint: Callable[[], ExecdEndpoint],
                 registry_path: Callable[[], str], settings: Settings | None = None) -> None:
        self._box_endpoint = box_endpoint
        self._settings = settings
        self.programs: dict[int, Program] = {}
        self._numbers = 0
        self._loop = AttachLoop()
        self._registry = AttachRegistry(runner_call, registry_path, self.programs.values, self._loop)
        self._view = LiveDisplay(send_display, self._loop)

    # -- attaching --------------------------------------------------------------------------

    def start(self, command: str, name: str | None, cwd: str | None, url: str | None,
              headers: dict[str, str], parent: dict[str, Any], dialect: str | None = None,
              auto_answers: dict[str, AutoAnswer] | None = None) -> Program:
        """Start `command` and attach to it. Its display waits for `show`, so that the cell's line
        saying what was attached comes before it."""
        endpoint = endpoint_for(url, headers, self._box_endpoint, self._settings)
        control = ch.ExecdControl(endpoint)
        try:
            session_id = control.create(cwd=cwd)  # the command goes in as the first stdin line
        except ch.ExecdError as exc:
            raise AttachError(f"could not start {command!r}: {exc}") from None
        program = self._new_program(name or _short_name(command), session_id, endpoint, command, cwd or "", url,
                                    dialect=dialect)
        program.auto_answers = dict(auto_answers or {})
        # A program that cannot start (a missing file, a bad import) exits at once: wait for that, or
        # for its first record, which says it is up, but not longer than START_CHECK_SECONDS.
        self._connect(program, 0, parent, settle=START_CHECK_SECONDS, until_record=True, command=command)
        return program

    def show(self, program: Program) -> None:
        """The program's live display, in the cell that attached it (after that cell's first line)."""
        self._loop.run(self._show(program))

    async def _show(self, program: Program) -> None:
        self._view.show(program)  # on the loop, where records update it: no frame overtakes this one

    def reattach(self, session_id: str | None, last: bool, since: int | None, url: str | None,
                 headers: dict[str, str], parent: dict[str, Any],
                 auto_answers: dict[str, AutoAnswer] | None = None) -> Program:
        saved = self._registry.load()
        entry: dict[str, Any] | None = None
        if last:
            if not saved:
                raise AttachError("no program was attached in this sandbox yet; start one with %attach -- COMMAND")
            entry = self._last(saved)
        else:
            entry = next((s for s in saved if s["session_id"].startswith(session_id or "")), None)
            if entry is None and session_id:
                entry = {"session_id": session_id, "name": session_id[:8], "command": "", "cwd": "", "cursor": 0,
                         "url": url}
        assert entry is not None
        for program in self.programs.values():
            if program.session_id == entry["session_id"] and program.attached:
                raise AttachError(f"{program.describe()} is attached already; %detach {program.number} first")
        url = url or self._url_given_for(entry)
        endpoint = endpoint_for(url, headers, self._box_endpoint, self._settings)
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
        program = self._program_for(entry, endpoint, url)
        if auto_answers is not None:
            program.auto_answers = dict(auto_answers)
        elif not program.auto_answers:  # a kernel restarted since: the last one's `--answer`s go on
            program.auto_answers = saved_answers(entry)
        self._connect(program, since if since is not None else int(entry.get("cursor", 0)), parent,
                      settle=EXIT_NOTICE_SECONDS if ended else 0.0, until_record=False,
                      since_tail=saved_tail(entry) if since is None else b"")
        return program

    def _url_given_for(self, entry: dict[str, Any]) -> str | None:
        """The endpoint of `entry`'s program as the user gave it to this kernel (`--url`), or None for
        the sandbox's own. Never the entry's `url`: the registry is written in the sandbox, and the
        kernel connects only where the user or the provider says. A program of another execd that
        this kernel has not attached is attached again with `--url` given again."""
        for program in self.programs.values():
            if program.session_id == entry["session_id"]:
                return program.url
        if entry.get("url"):
            raise AttachError(f"session {entry['session_id'][:8]} was attached through another execd; the kernel "
                              "does not connect to an address read from the sandbox: give its --url (and --header) "
                              "again, as in %attach --session ID --url URL")
        return None

    def _last(self, saved: list[dict[str, Any]]) -> dict[str, Any]:
        """What `--last` means: the most recent program that this kernel is not attached to now (so
        that, with one program watched and another detached, it picks the detached one)."""
        attached = {p.session_id for p in self.programs.values() if p.attached}
        return next((entry for entry in reversed(saved) if entry["session_id"] not in attached), saved[-1])

    def again_hint(self, program: Program) -> str:
        """How to attach to `program` again: `%attach --last` when that is what it would pick (and
        nothing, for a program that has ended: attaching again would only say so)."""
        if isinstance(_fatal(program), ch.ProgramExited):
            return "it has ended; %attach -- COMMAND starts a new one"
        try:
            saved = self._registry.load()
        except Exception:  # noqa: BLE001 - only a hint: the longer form always works
            saved = []
        if saved and self._last(saved)["session_id"] == program.session_id:
            return "%attach --last attaches again"
        return f"%attach --session {program.session_id[:8]} attaches again"

    def _program_for(self, entry: dict[str, Any], endpoint: ExecdEndpoint, url: str | None) -> Program:
        """The program of `entry`'s session, under its number: the one this kernel knows (its
        conversation goes on), else a new one under the number the registry remembers, if free."""
        for program in self.programs.values():
            if program.session_id == entry["session_id"]:
                program.endpoint, program.url = endpoint, url
                return program
        number = entry.get("number")
        free = isinstance(number, int) and not isinstance(number, bool) and number > 0 and number not in self.programs
        return self._new_program(entry.get("name") or entry["session_id"][:8], entry["session_id"], endpoint,
                                 entry.get("command", ""), entry.get("cwd", ""), url,
                                 number=number if free else None,
                                 dialect=entry.get("dialect") if entry.get("dialect_named") else None)

    def _new_program(self, name: str, session_id: str, endpoint: ExecdEndpoint, command: str, cwd: str,
                     url: str | None, number: int | None = None, dialect: str | None = None) -> Program:
        if number is None:
            number = max(self._numbers, max(self.programs, default=0)) + 1
        self._numbers = max(self._numbers, number)
        chosen = DIALECTS.get(dialect or "")
        program = Program(number, name, session_id, endpoint, command, cwd, url, conversation=Conversation(chosen))
        program.on_change = lambda: self._view.render_soon(program)
        self.programs[program.number] = program
        return program

    def _connect(self, program: Program, since: int, parent: dict[str, Any], settle: float = 0.0,
                 until_record: bool = False, command: str | None = None, since_tail: bytes = b"") -> None:
        """Connect `program`'s channel from `since`; then wait up to `settle` seconds (and SLOW_BOX_FACTOR
        times what connecting took) for its failure (or, with `until_record`, its first record). Raises
        AttachedProgramExited when the program has ended by then, AttachFailed when the channel failed
        otherwise."""
        program.parent = parent
        program.cursor = program.since = since
        program.cursor_tail = since_tail
        program.attachments += 1
        program.shown = False
        program.display_id = f"owsandbox-attach-{program.session_id}-{program.number}" + (
            f"-{program.attachments}" if program.attachments > 1 else "")
        conversation = program.conversation

        def moved(offset: int) -> None:
            program.cursor = offset
            program.cursor_tail = program.channel.tail_at(offset) if program.channel is not None else b""
            if until_record and program.news is not None:
                program.news.set()
            self._view.render_soon(program)
            self._registry.save_soon()

        async def on_record(record: dict[str, Any], offset: int) -> None:
            entry = conversation.received(record, time.time(), offset)
            program.vocabulary.said(record)
            call = entry.call
            if call is not None and call.answer is entry and call.asked_by == SENT:
                program.vocabulary.listed(call.method, record)
            channel = program.channel
            if channel is not None:
                program.answers.offer(channel, entry)
            moved(offset)  # before any wait: the channel counts the record delivered once handed over
            auto = program.auto_answers.get(call.method) if call is not None and call.request is entry \
                and call.asked_by == RECEIVED and entry.kind == R.REQUEST else None
            if auto is not None and channel is not None:
                await self._answer_by_itself(program, channel, auto, record)

        async def on_not_json(text: str, offset: int) -> None:
            conversation.stdout_text(text, time.time(), offset)
            moved(offset)

        async def on_stderr(text: str) -> None:
            conversation.stderr(text, time.time())
            self._view.render_soon(program)

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
                                              on_failure=on_failure, label=program.name, on_stderr=on_stderr,
                                              on_not_json=on_not_json)
            program.channel = channel
            program.state = "attaching"
            program.news = asyncio.Event()
            program.connected_at = time.monotonic()
            await channel.connect(since=since, takeover=True, command=command, since_tail=since_tail)
            connecting = time.monotonic() - program.connected_at
            program.replayed_from = channel.asked_since
            if channel.fatal is None:
                program.state = "attached"
                if channel.cursor_mismatches:  # loudly: a record may be missing or repeated here
                    program.state = (f"attached, but the saved cursor {since} disagreed with execd's output "
                                     f"ring: resumed at offset {channel.cursor}, the next line boundary")
            if settle > 0 and channel.fatal is None:
                try:
                    await asyncio.wait_for(program.news.wait(), settle + SLOW_BOX_FACTOR * connecting)
                except asyncio.TimeoutError:
                    pass
            program.news = None

        try:
            self._loop.run(connect())
        except (ch.ExecdError, RuntimeError, OSError) as exc:
            if not isinstance(_fatal(program), ch.ProgramExited):
                program.state = f"not attached: {exc}"
                raise AttachError(f"could not attach to {program.describe()}: {exc}") from None
        self._registry.save_quietly()
        fatal = _fatal(program)
        if fatal is not None:
            self.show(program)  # what it wrote before it failed (its stderr, a line that was not JSON)
            raise _failed_at_once(program, fatal, started=until_record)

    @staticmethod
    async def _answer_by_itself(program: Program, channel: ExecdJsonLineChannel, auto: AutoAnswer,
                                request: dict[str, Any]) -> None:
        """`--answer`: the program's request answered from its file, on the loop, so that it goes out
        even while a %send waits (for the very call that made the program ask, often)."""
        response = auto.to(request)
        entry = program.conversation.sent(response, time.time())
        entry.by = auto.path
        try:
            await channel.send(response)
        except Exception as exc:  # noqa: BLE001 - shown on the answer's line; the view goes on
            entry.failed = str(exc) or type(exc).__name__
            log.warning("%s: the --answer to %s could not be sent: %s", program.describe(), auto.method, exc)

    def words(self, number: int | None) -> tuple[list[str], list[str]]:
        """For Tab in a %send line: the method names program #`number` (None: the latest) has seen,
        then its dialect's usual ones, and the tools its tools/list named; nothing when none is attached."""
        try:
            program = self.pick(number)
        except AttachError:
            return [], []
        methods = list(program.vocabulary.methods)
        methods += [m for m in program.conversation.dialect.methods if m not in program.vocabulary.methods]
        return methods, list(program.vocabulary.tools)

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

    def send(self, number: int | None, records: list[dict[str, Any]],
             timeout: float | None, check: bool = True) -> tuple[Program, list[Entry]]:
        """Write records; wait for the answers to the requests among them (each within `timeout` of its
        last progress; None: not at all). The entries sent: each request's `call.answer` holds its answer."""
        program = self.pick(number)
        channel = program.channel
        if channel is None or not channel.is_connected:
            raise AttachError(f"{program.describe()} is not attached ({program.state}); {self.again_hint(program)}")
        if check:
            for record in records:  # before anything goes: a refused record sends none of them
                program.vocabulary.check(record)
        for record in records:
            program.vocabulary.said(record)
        try:
            sent = self._loop.run(program.answers.exchange(channel, program, records, timeout), timeout=None)
        except (ch.ExecdError, RuntimeError) as exc:
            raise AttachError(f"could not send to {program.describe()}: {exc}") from None
        return program, sent

    @staticmethod
    def errors_in(program: Program, sent: list[Entry]) -> list[JsonRpcError]:
        """The error answers (an `error` member, or MCP's `result.isError`) among the sent requests'."""
        dialect = program.conversation.dialect
        found = []
        for entry in sent:
            call = entry.call
            if call is not None and call.asked_by == SENT and call.request is entry:
                error = error_in(call, dialect.codes, dialect.tool_error, program.describe())
                if error is not None:
                    found.append(error)
        return found

    def replay(self, program: Program, saved: Saved, timeout: float) -> tuple[list[Call], str | None]:
        """Send a saved client side to `program` in the saved order: a record goes once what came
        before it in the saved conversation has come again (the answers it waited for; for an answer
        to the program's own request, that request). The calls made, and why it stopped early, if it did."""
        return self._loop.run(self._replay(program, saved, timeout), timeout=None)

    async def _replay(self, program: Program, saved: Saved, timeout: float) -> tuple[list[Call], str | None]:
        shadow = saved.conversation()  # the saved conversation, matched again as the replay goes
        waiting: dict[Call, Waiter] = {}  # a saved call → the wait for its fresh answer
        calls: list[Call] = []
        step = 0

        async def answered(waiter: Waiter) -> None:
            try:
                await program.answers.wait(channel, program, [waiter])
            except NoAnswer:
                pass  # the verdict says "no answer"

        for entry in saved.entries:
            record = entry.get("record")
            if not isinstance(record, dict) or entry.get("failed"):
                continue
            if entry.get("dir") == RECEIVED:
                seen = shadow.received(record, float(entry.get("at") or 0))
                if seen.call is not None and seen.call.answer is seen and seen.call in waiting:
                    await answered(waiting.pop(seen.call))
                continue
            if entry.get("dir") != SENT:
                continue
            step += 1
            mine = shadow.sent(record, float(entry.get("at") or 0))
            channel = program.channel
            if channel is None or not channel.is_connected:
                return calls, f"{program.describe()} ended before step {step} ({program.state})"
            if R.kind_of(record) == R.RESPONSE:
                await self._asked(program, record.get("id"), timeout)
            try:
                sent, waiters = await program.answers.post(channel, program, [record], timeout)
            except (AttachError, ch.ExecdError, RuntimeError) as exc:
                return calls, f"step {step} could not be replayed: {exc}"
            if waiters:
                calls.append(sent[0].call or waiters[0].call)
                if mine.call is not None:
                    waiting[mine.call] = waiters[0]
                else:
                    await answered(waiters[0])
        for waiter in waiting.values():  # asked, but never answered in the saved conversation
            await answered(waiter)
        return calls, None

    @staticmethod
    async def _asked(program: Program, request_id: Any, timeout: float) -> None:
        """Wait (up to `timeout`) until the program has asked the request whose answer comes next."""
        deadline = time.monotonic() + timeout
        while program.conversation.pending_call(request_id, RECEIVED) is None and time.monotonic() < deadline:
            if program.channel is None or not program.channel.is_connected:
                return
            await asyncio.sleep(0.02)

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
            attached = next((p for p in self.programs.values() if p.session_id == session_id), None)
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
        """Stop: every %send waiting for an answer gives up now, its request cancelled in the program's
        dialect (the cell's error says what was sent)."""
        if not self._loop.started:
            return
        for program in self.programs.values():
            if program.channel is not None:
                program.answers.cancel(program.channel, program, self._loop)


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
