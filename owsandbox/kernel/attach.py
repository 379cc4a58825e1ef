"""`%attach`: long-running JSON-lines programs in the sandbox, watched and steered from the notebook.

A program runs in an execd pipe session (the runner box's own endpoint, or a real OpenSandbox
execd). Its records show live in the output area of the cell that attached, as one display that is
updated at most a few times a second, and keep coming while other cells run: the channels live on
an asyncio loop of their own thread. `%send` writes records; when a record has an `id`, the cell
waits for the answer with that id — the kernel decides what an answer is, not the channel: the first
later record with the same `id` that is not an event (no `method`, and no `type` among event,
progress, notification, log). Session ids and cursors are remembered in the sandbox, so `%attach
--last` picks up after a kernel restart with nothing lost or repeated. A program that exits before
it is up (before its first record, within a second) makes `%attach` an error that names its exit
status and the last lines of its stderr; so does attaching again to a program that has ended.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..runner.box import protocol as P

if TYPE_CHECKING:
    from ..channel import ExecdEndpoint, ExecdJsonLineChannel


class _Channel:
    """`owsandbox.channel`, imported on first use: it brings in websockets, which the kernel need not
    load before anybody attaches."""

    def __getattr__(self, name: str) -> Any:
        from .. import channel
        from ..channel import endpoint

        return getattr(channel, name, None) or getattr(endpoint, name)


ch = _Channel()

EVENT_TYPES = frozenset({"event", "progress", "notification", "log"})
KEEP_RECORDS = 1000  # per program, for the display and %records
SHOW_RECORDS = 20  # in the live display
RENDER_SECONDS = 0.2  # the live display is updated at most this often
SAVE_SECONDS = 1.0  # cursors are written to the sandbox at most this often while records arrive
# A program that exits this soon after %attach started it makes the cell an error; %attach waits this
# long at most, and returns at the program's first record.
START_CHECK_SECONDS = 1.0
# How long %attach --session/--last waits for execd's exit notice of a program that has ended.
EXIT_NOTICE_SECONDS = 5.0
STDERR_LINES = 10  # the last lines of stderr an error shows


class AttachError(Exception):
    """A clear reason why an %attach operation could not be done."""

    ename = "UsageError"


class AttachedProgramExited(AttachError):
    """The program exited while %attach started it, or had ended before %attach --session/--last."""

    ename = "AttachedProgramExited"


class AttachFailed(AttachError):
    """The channel to a program failed at once (a line that is not JSON, execd's error), not by an exit."""

    ename = "AttachFailed"


def is_answer(record: dict[str, Any], request_id: Any) -> bool:
    return (record.get("id") == request_id and "method" not in record
            and record.get("type") not in EVENT_TYPES)


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
    since: int = 0  # where this attachment started reading
    waiting: set[Any] = field(default_factory=set)
    connected_at: float = 0.0  # time.monotonic() when the connection (which starts a new program) began
    ended_at: float | None = None  # when the channel learnt that the program ended
    news: asyncio.Event | None = None  # set by the first record or the failure while %attach waits for either

    def describe(self) -> str:
        return f"#{self.number} {self.name}"


class AttachManager:
    """Every attached program of one kernel, on one event loop thread."""

    def __init__(self, send_display: Callable[[dict[str, Any], dict[str, Any], str, bool], None],
                 runner_call: Callable[..., Any], box_endpoint: Callable[[], ExecdEndpoint],
                 registry_path: Callable[[], str]) -> None:
        self._send_display = send_display  # (parent, data, display_id, update)
        self._runner_call = runner_call
        self._box_endpoint = box_endpoint
        self._registry_path = registry_path
        self.programs: dict[int, Program] = {}
        self._numbers = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        self._last_save = 0.0
        self._save_scheduled = False

    # -- the loop ---------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="attach-loop", daemon=True).start()
                self._loop = loop
            return self._loop

    def _run(self, coro: Any, timeout: float | None = 60) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise AttachError(f"no answer within {timeout:g} s") from None

    # -- endpoints --------------------------------------------------------------------------

    def endpoint_for(self, url: str | None, headers: dict[str, str]) -> ExecdEndpoint:
        if url:
            merged = dict(headers)
            token = os.environ.get("OWSANDBOX_EXECD_TOKEN")
            if token and not any(k.lower() == ch.TOKEN_HEADER.lower() for k in merged):
                merged[ch.TOKEN_HEADER] = token
            if url.startswith("unix:"):
                return ch.ExecdEndpoint(unix_socket=url[5:], headers=merged)
            return ch.ExecdEndpoint(origin=url, headers=merged)
        if os.environ.get("OWSANDBOX_EXECD_URL"):
            return ch.ExecdEndpoint.from_env()
        return self._box_endpoint()

    # -- the registry in the sandbox --------------------------------------------------------

    def load_registry(self) -> list[dict[str, Any]]:
        try:
            page = self._runner_call("fs.read", {"path": self._registry_path(), "limit_lines": 100000})
        except P.RunnerError as err:
            if err.code == P.FS_ERROR:
                return []
            raise
        try:
            sessions = json.loads(page["text"]).get("sessions", [])
        except (ValueError, AttributeError):
            return []
        return [s for s in sessions if isinstance(s, dict) and s.get("session_id")]

    def save_registry(self, forget: set[str] | None = None) -> None:
        known = {s["session_id"]: s for s in self.load_registry()}
        for program in self.programs.values():
            known[program.session_id] = {
                "session_id": program.session_id, "name": program.name, "command": program.command,
                "cwd": program.cwd, "url": program.url, "cursor": program.cursor, "state": program.state,
                "updated": time.time()}
        for session_id in forget or ():
            known.pop(session_id, None)
        entries = sorted(known.values(), key=lambda s: s.get("updated", 0))[-50:]
        self._runner_call("fs.write", {"path": self._registry_path(), "make_parents": True,
                                       "text": json.dumps({"sessions": entries}, indent=1) + "\n"})
        self._last_save = time.monotonic()

    # -- attaching --------------------------------------------------------------------------

    def start(self, command: str, name: str | None, cwd: str | None, url: str | None,
              headers: dict[str, str], parent: dict[str, Any]) -> Program:
        endpoint = self.endpoint_for(url, headers)
        control = ch.ExecdControl(endpoint)
        try:
            session_id = control.create(cwd=cwd, command=command)
        except ch.ExecdError as exc:
            raise AttachError(f"could not start {command!r}: {exc}") from None
        program = self._new_program(name or _short_name(command), session_id, endpoint, command, cwd or "", url)
        # A program that cannot start (a missing file, a bad import) exits at once: wait for that, or
        # for its first record, which says it is up, but not longer than START_CHECK_SECONDS.
        self._connect(program, 0, parent, settle=START_CHECK_SECONDS, until_record=True)
        return program

    def reattach(self, session_id: str | None, last: bool, since: int | None, url: str | None,
                 headers: dict[str, str], parent: dict[str, Any]) -> Program:
        saved = self.load_registry()
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
        endpoint = self.endpoint_for(url or entry.get("url"), headers)
        # A program that has ended gets an exit notice right after the connection's `connected`:
        # wait for it, so that attaching to it again is an error that says so.
        ended = _has_ended(endpoint, entry["session_id"])
        program = self._new_program(entry.get("name") or entry["session_id"][:8], entry["session_id"], endpoint,
                                    entry.get("command", ""), entry.get("cwd", ""), url or entry.get("url"))
        self._connect(program, since if since is not None else int(entry.get("cursor", 0)), parent,
                      settle=EXIT_NOTICE_SECONDS if ended else 0.0, until_record=False)
        return program

    def _new_program(self, name: str, session_id: str, endpoint: ExecdEndpoint, command: str, cwd: str,
                     url: str | None) -> Program:
        self._numbers += 1
        program = Program(self._numbers, name, session_id, endpoint, command, cwd, url)
        program.display_id = f"owsandbox-attach-{session_id}-{program.number}"
        self.programs[program.number] = program
        return program

    def _connect(self, program: Program, since: int, parent: dict[str, Any], settle: float = 0.0,
                 until_record: bool = False) -> None:
        """Connect `program`'s channel from `since`; then wait up to `settle` seconds for its failure
        (or, with `until_record`, its first record). Raises AttachedProgramExited when the program has
        ended by then, AttachFailed when the channel failed otherwise."""
        program.parent = parent
        program.cursor = program.since = since

        async def on_record(record: dict[str, Any], offset: int) -> None:
            program.records.append((offset, record))
            program.seen += 1
            program.cursor = offset
            if until_record and program.news is not None:
                program.news.set()
            channel = program.channel
            if channel is not None:
                for request_id in list(program.waiting):
                    if is_answer(record, request_id) and channel.complete_request(request_id, record):
                        program.waiting.discard(request_id)
            self._schedule_render(program)
            self._schedule_save()

        async def on_failure(exc: BaseException) -> None:
            program.state = f"ended: {exc}"
            if isinstance(exc, ch.ProgramExited) and since > 0 and not exc.stderr_tail.strip():
                # Attached again after its stderr: whatever it wrote came before `since`.
                how = "killed by a signal" if exc.exit_code == -1 else f"exited with code {exc.exit_code}"
                program.state = f"ended: {program.name} {how}"
            program.ended_at = time.monotonic()
            if program.channel is not None:
                program.cursor = program.channel.cursor
            if program.news is not None:
                program.news.set()
            self._schedule_render(program, now=True)
            self._schedule_save()

        async def connect() -> None:
            channel = ch.ExecdJsonLineChannel(program.endpoint, session_id=program.session_id, on_record=on_record,
                                           on_failure=on_failure, label=program.name)
            program.channel = channel
            program.state = "attaching"
            program.news = asyncio.Event()
            self._send_display(parent, self._bundle(program), program.display_id, False)
            program.connected_at = time.monotonic()
            await channel.connect(since=since, takeover=True)
            if channel.fatal is None:
                program.state = "attached"
            if settle > 0 and channel.fatal is None:
                try:
                    await asyncio.wait_for(program.news.wait(), settle)
                except asyncio.TimeoutError:
                    pass
            program.news = None

        try:
            self._run(connect())
        except (ch.ExecdError, RuntimeError, OSError) as exc:
            if not isinstance(_fatal(program), ch.ProgramExited):
                program.state = f"not attached: {exc}"
                self._render(program)
                raise AttachError(f"could not attach to {program.describe()}: {exc}") from None
        self._render(program)
        self._save_quietly()
        fatal = _fatal(program)
        if fatal is not None:
            raise _failed_at_once(program, fatal, started=until_record)

    # -- the live display -------------------------------------------------------------------

    def _schedule_render(self, program: Program, now: bool = False) -> None:
        loop = self._ensure_loop()
        if now:
            self._render(program)
            return
        if not program.render_due:
            program.render_due = True
            loop.call_later(RENDER_SECONDS, self._render, program)

    def _render(self, program: Program) -> None:
        program.render_due = False
        if program.parent is not None:
            self._send_display(program.parent, self._bundle(program), program.display_id, True)

    def _bundle(self, program: Program) -> dict[str, Any]:
        header = (f"{program.describe()} [{program.state}] session {program.session_id[:8]}, cursor "
                  f"{program.cursor}, {program.seen} records" + (f" — {program.command}" if program.command else ""))
        recent = list(program.records)[-SHOW_RECORDS:]
        lines = [json.dumps(record, ensure_ascii=False) for _, record in recent]
        if program.seen > len(recent):
            lines.insert(0, f"… {program.seen - len(recent)} earlier records (%records {program.number})")
        return {"text/plain": header + "\n" + "\n".join(lines)}

    def _schedule_save(self) -> None:
        if self._save_scheduled:
            return
        self._save_scheduled = True
        delay = max(0.0, SAVE_SECONDS - (time.monotonic() - self._last_save))

        def save() -> None:
            self._save_scheduled = False
            self._save_quietly()

        self._ensure_loop().call_later(delay, lambda: threading.Thread(target=save, daemon=True).start())

    def _save_quietly(self) -> None:
        try:
            self.save_registry()
        except Exception:  # noqa: BLE001 - the live view must not fail for a bookkeeping write
            pass

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

        async def go() -> list[Any]:
            futures = []
            for record in records:
                if "id" in record:
                    if record["id"] in program.waiting:
                        raise AttachError(f"a record with id {record['id']!r} is still waiting for its answer")
                    futures.append(channel.register_request(record["id"]))
                    program.waiting.add(record["id"])
            for record in records:
                await channel.send(record)
            if not futures:
                return []
            try:
                return list(await asyncio.wait_for(asyncio.gather(*futures), wait))
            except asyncio.TimeoutError:
                for record in records:
                    program.waiting.discard(record.get("id"))
                    if "id" in record:
                        channel.fail_request(record["id"], AttachError("gave up"))
                raise AttachError(f"no answer from {program.describe()} within {wait:g} s "
                                  "(records keep arriving in its display)") from None

        try:
            return self._run(go(), timeout=wait + 10)
        except (ch.ExecdError, RuntimeError) as exc:
            raise AttachError(f"could not send to {program.describe()}: {exc}") from None

    def detach(self, number: int | None) -> Program:
        program = self.pick(number)
        channel = program.channel
        if channel is not None:
            self._run(channel.detach())
            program.cursor = channel.cursor
        program.state = "detached"
        self._render(program)
        self.save_registry()
        return program

    def kill(self, number: int | None) -> Program:
        program = self.pick(number)
        channel = program.channel
        if channel is not None:
            self._run(channel.delete())
        else:
            ch.ExecdControl(program.endpoint).delete(program.session_id)
        program.state = "killed"
        self._render(program)
        for number in [n for n, p in self.programs.items() if p.session_id == program.session_id]:
            del self.programs[number]  # every attachment to that session is gone with it
        self.save_registry(forget={program.session_id})
        return program

    def listing(self) -> list[dict[str, Any]]:
        saved = {s["session_id"]: s for s in self.load_registry()}
        live: dict[str, dict[str, Any]] = {}
        listed = False  # whether the box's endpoint said which sessions it holds
        try:
            for session in ch.ExecdControl(self._box_endpoint()).list_sessions():
                live[session["session_id"]] = session
            listed = True
        except (ch.ExecdError, OSError):
            pass
        rows = []
        for session_id in sorted(set(saved) | set(live), key=lambda s: saved.get(s, {}).get("updated", 0)):
            entry, state = saved.get(session_id, {}), live.get(session_id, {})
            attached = max((p for p in self.programs.values() if p.session_id == session_id),
                           key=lambda p: p.number, default=None)  # the newest attachment speaks for it
            known_here = listed and not entry.get("url")  # programs of another execd are not in the box's list
            rows.append({"#": attached.number if attached else "-", "session": session_id[:8],
                         "name": entry.get("name", ""), "command": entry.get("command") or state.get("command", ""),
                         "program": _program_state(state, known_here), "offset": state.get("output_offset", "?"),
                         "cursor": attached.cursor if attached else entry.get("cursor", 0),
                         "attachment": _attachment_state(attached.state if attached else entry.get("state", ""))})
        return rows

    def close(self) -> None:
        """Detach everything (programs keep running) and write the cursors down, exactly."""
        for program in list(self.programs.values()):
            if program.channel is not None and program.channel.is_connected:
                try:
                    self._run(program.channel.detach(), timeout=10)
                    program.cursor = program.channel.cursor
                    program.state = "detached"
                except (AttachError, ch.ExecdError, RuntimeError):
                    pass
        if self.programs:
            self._save_quietly()
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    def cancel_waits(self) -> None:
        """Stop: every %send waiting for an answer gives up now."""
        loop = self._loop
        if loop is None:
            return
        for program in self.programs.values():
            channel = program.channel
            if channel is None:
                continue
            for request_id in list(program.waiting):
                program.waiting.discard(request_id)
                loop.call_soon_threadsafe(channel.fail_request, request_id, AttachError("interrupted by user"))


def _program_state(session: dict[str, Any], known_here: bool) -> str:
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


def _attachment_state(state: str) -> str:
    """A Program.state, short: attached, detached, ended, killed, not attached (the reason is in its display)."""
    return state.partition(":")[0].strip() or "-"


def _fatal(program: Program) -> BaseException | None:
    return program.channel.fatal if program.channel is not None else None


def _has_ended(endpoint: ExecdEndpoint, session_id: str) -> bool:
    """Whether execd says the session's program is not running (False when it cannot tell)."""
    try:
        return ch.ExecdControl(endpoint).status(session_id).get("running") is False
    except (ch.ExecdError, OSError):
        return False


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
