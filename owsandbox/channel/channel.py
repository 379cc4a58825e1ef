"""A JSON-lines conversation with a program behind execd's PTY WebSocket, for asyncio callers.

The layering follows python-websockets' own: `jsonlines.JsonLineDecoder` is the sans-I/O core that
knows the byte stream, `execdws` knows execd's WebSocket (frames, control messages, connecting,
closing), and this module is the thin asyncio shell around them. It opens the WebSocket
(`GET /pty/{id}/ws?pty=0&since=N&takeover=1`), runs one reader task that feeds binary frames to the
decoder and hands each record to `on_record(record, offset)`, turns control frames and closes into
failures, and writes records to the program's stdin.

What the channel promises:

* Every record reaches `on_record`, in order; the channel never decides that a record answers a
  request. `register_request` / `complete_request` only keep the futures: the adapter that knows
  the program's protocol settles them.
* `cursor` is the `since` for a later connection that loses nothing not yet delivered (a record
  counts as delivered once its callback returned). It counts stderr bytes too, as execd does.
* A failure (exit, takeover, lost connection, bad stream) fails every waiting request once and is
  reported to `on_failure` once, first cause only; `fatal` keeps it. An exit is reported once the
  connection closes after execd's `exit` notice, since output may still follow that notice.
* `detach()` leaves the program running: it stops reading, completes the closing handshake and
  closes TCP itself, because execd answers Close but never closes the connection. A peer that
  never answers is waited for `CLOSE_TIMEOUT_SECONDS`, then cut off.

Everything here runs on one event loop. A thread-based caller (the kernel) runs a loop in its own
thread and submits coroutines with `asyncio.run_coroutine_threadsafe`; callbacks then run on that
loop's thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from .control import ExecdControl, refused_through_proxy, session_path
from .endpoint import ExecdEndpoint
from .errors import (
    ChannelDetached,
    ChannelTakenOver,
    ExecdAlreadyConnected,
    ExecdError,
    ExecdServerError,
    ProgramExited,
)
from .execdws import (
    CLOSE_POLICY_VIOLATION,
    CLOSE_TAKEN_OVER,
    CLOSE_TIMEOUT_SECONDS,
    KEEPALIVE_SECONDS,
    REPLAY,
    REPLAY_HEADER_BYTES,
    STDERR,
    STDIN,
    STDOUT,
    Connected,
    Exited,
    ServerError,
    close_async,
    encode_frame,
    open_async,
    parse_control,
    signal_message,
    start_line,
)
from .jsonlines import DEFAULT_MAX_LINE_BYTES, JsonLineDecoder, NotJsonLine, Record

log = logging.getLogger(__name__)

# CLOSE_TIMEOUT_SECONDS, how long a detach waits for execd to answer Close, is execdws's; it is read
# here at each detach, so tests patch it in this module. How long `connect` waits for the opening
# handshake, and then for execd's `connected` frame:
OPEN_TIMEOUT_SECONDS = 10.0
CONNECT_TIMEOUT_SECONDS = 30.0
# How many of the latest output bytes (in arrival order) are kept to know the byte before the cursor.
RECENT_BYTES = 64 * 1024
CURSOR_TAIL_BYTES = 32  # how much output before a cursor a reattach checks against execd's ring
CURSOR_SEARCH_BYTES = 4096  # how far before that a reattach looks for those bytes when they are misplaced
# A REPLAY frame can carry execd's whole 1 MiB ring in one message.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# After execd's `exit`, how long output may still come before the connection closes: a released
# execd sends `exit` without waiting for its output pumps (`controller/pty_ws.go`, `ptyExitWatcher`).
EXIT_GRACE_SECONDS = 2.0
# A 409 (another client holds the session) is tried again for this long: a released execd has no
# takeover and keeps a vanished client's hold until its 60 s read deadline (`controller/pty_ws.go`).
BUSY_RETRY_SECONDS = 10.0
BUSY_RETRY_PAUSE_SECONDS = 0.5

RecordCallback = Callable[[dict[str, Any], int], Awaitable[None]]
FailureCallback = Callable[[BaseException], Awaitable[None]]
StderrCallback = Callable[[str], Awaitable[None]]
NotJsonCallback = Callable[[str, int], Awaitable[None]]  # (the line, the offset just past it)

# Failures that keep their own type; anything else is a bug somewhere and becomes ChannelDetached.
_EXPECTED_FAILURES = (RuntimeError, OSError)


class _Refused(Exception):
    """A refusal that came as Close 1008 through a proxy, for `connect`: `error` is execd's."""

    def __init__(self, error: ExecdError) -> None:
        super().__init__(str(error))
        self.error = error


def probe_offset(since: int, tail: bytes | None) -> int:
    """Where a reattach that checks its cursor asks execd to replay from: before the tail, with room
    to find the tail again when the ring holds it elsewhere."""
    return max(0, since - len(tail) - CURSOR_SEARCH_BYTES) if tail else since


def nearest(data: bytes, needle: bytes, around: int) -> int:
    """The end of the occurrence of `needle` in `data` whose end is nearest `around`; -1 when none."""
    best = -1
    start = data.find(needle) if needle else -1
    while start >= 0:
        end = start + len(needle)
        if best < 0 or abs(end - around) < abs(best - around):
            best = end
        start = data.find(needle, start + 1)
    return best


class ExecdJsonLineChannel:
    """One program's JSON-lines stdin/stdout over execd's PTY WebSocket (pipe mode unless `mode_pty`)."""

    def __init__(self, endpoint: ExecdEndpoint, *, session_id: str, on_record: RecordCallback,
                 on_failure: FailureCallback, label: str = "program", mode_pty: bool = False,
                 on_stderr: StderrCallback | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                 keepalive_seconds: float | None = KEEPALIVE_SECONDS,
                 on_not_json: NotJsonCallback | None = None) -> None:
        self.endpoint = endpoint
        self.session_id: str | None = session_id
        self.label = label
        self.mode_pty = mode_pty
        self.mode: str | None = None  # "pipe" or "pty", as execd's `connected` frame said
        self._on_record = on_record
        self._on_failure = on_failure
        self._on_stderr = on_stderr
        self._on_not_json = on_not_json  # given: a live stdout line that is not JSON is told there, not fatal
        self._keepalive = keepalive_seconds
        self._control = ExecdControl(endpoint)
        self._decoder = JsonLineDecoder(0, max_line_bytes=max_line_bytes, lenient_stdout=mode_pty,
                                        flag_non_json=on_not_json is not None)
        self._cursor = 0
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._handing: asyncio.Task[Any] | None = None  # the reader while it awaits an adapter's callback
        self._finishing: set[asyncio.Task[Any]] = set()  # released readers whose callback still runs
        self._ready: asyncio.Future[None] | None = None  # set while `connect` waits for `connected`
        self._connected = False
        self._opening = False
        self._requests: dict[Hashable, asyncio.Future[Any]] = {}
        self._fatal: BaseException | None = None
        self._exited: Exited | None = None  # execd's `exit`, while the output that may follow it is read
        self._recent = bytearray()  # the latest output bytes as they arrived, ending at `_arrived`
        self._arrived = 0
        self._probe: tuple[int, bytes] | None = None  # (since, the bytes expected just before it)
        # The `since` the last connection asked execd for: before the cursor when it is checked.
        self.asked_since = 0
        self.cursor_mismatches = 0  # reattaches whose cursor did not agree with execd's ring

    # ── state ────────────────────────────────────────────────────────────────────────────────────

    @property
    def cursor(self) -> int:
        """The `since` that resumes right after the last delivered record (stderr bytes counted)."""
        return self._cursor

    @property
    def cursor_tail(self) -> bytes:
        """The output bytes just before `cursor` as they arrived (up to `CURSOR_TAIL_BYTES`; b"" when
        not known): a later `connect(since=cursor, since_tail=...)` checks them against execd's ring."""
        return self.tail_at(self._cursor)

    def tail_at(self, offset: int) -> bytes:
        """The arrived output bytes just before `offset` (up to `CURSOR_TAIL_BYTES`), as far as known."""
        end = len(self._recent) - (self._arrived - offset)
        if offset <= 0 or end <= 0 or end > len(self._recent):
            return b""
        return bytes(self._recent[max(0, end - CURSOR_TAIL_BYTES):end])

    @property
    def stderr_tail(self) -> str:
        """The last 8 KiB of the program's stderr (and replayed lines that were not records)."""
        return self._decoder.stderr_tail

    @property
    def fatal(self) -> BaseException | None:
        """The failure that ended this channel, or None."""
        return self._fatal

    @property
    def is_connected(self) -> bool:
        ws = self._ws
        return self._connected and self._fatal is None and ws is not None and ws.state is State.OPEN

    # ── connecting and leaving ───────────────────────────────────────────────────────────────────

    async def connect(self, since: int = 0, takeover: bool = True, command: str | None = None,
                      since_tail: bytes | None = None) -> None:
        """Open the WebSocket at output offset `since` and wait for execd's `connected`; with
        `command`, a fresh session's bash then execs it (`execdws.start_line`: released execds ignore
        a command given to `POST /pty`).

        A 409 (another client holds the session: a released execd has no takeover) is tried again
        for `BUSY_RETRY_SECONDS`, then raised as `ExecdAlreadyConnected`.

        `since_tail`, the old channel's `cursor_tail`, checks the cursor against execd's ring: the
        replay is asked from a little before the cursor (`probe_offset`) and must hold those bytes
        right before `since` (one byte would not do: a misplaced cursor right after another line's LF
        has the same byte before it). A released execd sends live stdout and stderr through separate
        pumps (`controller/pty_ws.go`, `ptyStreamPump`), so they may arrive in another order than its
        ring holds them, and a cursor counted as they arrived can land inside a record. A mismatch is
        logged and told to on_stderr, counted in `cursor_mismatches`, and the cursor is taken from the
        ring instead: reading resumes right after those bytes where the ring holds them (nearest the
        cursor), else at the first line that starts after `since - 1` in the replay.

        A REPLAY that comes first is decoded and its records delivered before this returns. Refusals
        raise `ExecdHTTPError` kinds (`ExecdNotFound`, `ExecdAlreadyConnected`, `ExecdUnauthorized`)
        or `ExecdUnreachable` and leave the channel usable; a failure after the handshake (such as
        `ReplayGap`) is fatal, reported to on_failure, and raised here.
        """
        if self._fatal is not None:
            raise ChannelDetached(f"the {self.label} channel has failed ({self._fatal}); open a new channel "
                                  "with since=<the old one's cursor>") from self._fatal
        if self.session_id is None:
            raise ChannelDetached(f"the {self.label} session was deleted")
        if self._ws is not None or self._opening:
            raise ExecdError(f"the {self.label} channel is already connected")
        if since < 0:
            raise ValueError(f"since must not be negative, not {since}")
        probe = bool(since_tail) and since >= len(since_tail or b"")
        loop = asyncio.get_running_loop()
        busy_until = loop.time() + BUSY_RETRY_SECONDS
        while True:
            try:
                await self._attempt(since, takeover, since_tail if probe else None)
                break
            except (ExecdAlreadyConnected, _Refused) as exc:
                # 409 from execd, or Close 1008 from OpenSandbox's proxy in its place (then execd's
                # answer, found from the session's status, is the error)
                proxied = isinstance(exc, _Refused)
                if proxied:
                    await self._release()
                error = exc.error if isinstance(exc, _Refused) else exc  # narrowed for the type checker
                if not isinstance(error, ExecdAlreadyConnected):
                    raise error from None
                if loop.time() + BUSY_RETRY_PAUSE_SECONDS > busy_until:
                    if proxied:
                        raise error from None
                    raise ExecdAlreadyConnected(
                        error.method, error.path, error.status, error.body,
                        f"another client still holds the {self.label} session after {BUSY_RETRY_SECONDS:g} s of "
                        "retrying. Released execds (up to v1.0.18) cannot take a session over, and keep a client "
                        "that vanished without closing attached for up to 60 s: try again in a minute") from None
                log.info("the %s session is held by another client (%s); trying again", self.label,
                         "1008 through a proxy" if proxied else "409")
                await asyncio.sleep(BUSY_RETRY_PAUSE_SECONDS)
        if command is not None and self.is_connected:
            await self._send(encode_frame(STDIN, start_line(command)))

    async def _attempt(self, since: int, takeover: bool, since_tail: bytes | None) -> None:
        self._opening = True
        try:
            self.asked_since = probe_offset(since, since_tail)
            ws = await self._open(self.asked_since, takeover)
        finally:
            self._opening = False
        self._decoder.reset(since)
        self._cursor = since
        self._exited = None
        self._recent.clear()
        self._arrived = since
        self._probe = (since, since_tail) if since_tail else None
        self._ws = ws
        self._connected = False
        self._ready = ready = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(ws), name=f"execd {self.label} reader")
        try:
            await asyncio.wait_for(asyncio.shield(ready), CONNECT_TIMEOUT_SECONDS)
        except asyncio.TimeoutError:
            error = ChannelDetached(f"execd did not confirm the {self.label} connection within "
                                    f"{CONNECT_TIMEOUT_SECONDS:g} s")
            await self.fail(error)
            raise error from None
        except asyncio.CancelledError:
            await self._release()
            raise
        finally:
            self._ready = None

    async def detach(self) -> None:
        """Stop reading and close the connection; the program keeps running and waiting requests keep
        waiting (a later `connect(since=cursor)` may still deliver their answers).

        Prompt even while an adapter's callback is busy: that callback is not cut off but left to
        finish on its own, and its record counts as delivered (the cursor is past it), so that every
        record is handed over once, whichever channel resumes at the cursor."""
        await self._release()

    async def delete(self) -> bool:
        """DELETE the session (execd kills the program). True if it was deleted, False if it was
        already gone or this channel deleted it before. Waiting requests fail; on_failure is not
        called, since the caller asked for it."""
        session_id = self.session_id
        if session_id is None:
            return False
        await self._release()
        deleted = await asyncio.to_thread(self._control.delete, session_id)
        self.session_id = None
        await self._settle(ChannelDetached(f"the {self.label} session {session_id} was deleted"), report=False)
        return deleted

    async def status(self) -> dict[str, Any]:
        """GET /pty/{id}: `{"session_id", "running", "output_offset"}`."""
        if self.session_id is None:
            raise ChannelDetached(f"the {self.label} session was deleted")
        return await asyncio.to_thread(self._control.status, self.session_id)

    # ── talking ──────────────────────────────────────────────────────────────────────────────────

    async def send(self, record: dict[str, Any]) -> None:
        """Write `record` to the program's stdin as one JSON line (ASCII, so no reader can split it)."""
        if not isinstance(record, dict):
            raise TypeError(f"a record is a dict, not {type(record).__name__}")
        line = json.dumps(record, allow_nan=False).encode("ascii") + b"\n"
        await self._send(encode_frame(STDIN, line))

    async def send_signal(self, name: str) -> None:
        """Signal the program's process group: SIGINT, SIGTERM, SIGKILL, SIGQUIT or SIGHUP."""
        await self._send(signal_message(name))

    def register_request(self, request_id: Hashable) -> asyncio.Future[Any]:
        """A future for the answer to `request_id`, settled by `complete_request` (or failed by `fail`)."""
        if self._fatal is not None:
            raise ChannelDetached(f"the {self.label} channel has failed: {self._fatal}") from self._fatal
        if request_id in self._requests:
            raise ValueError(f"{request_id!r} already has a request registered on the {self.label} channel")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = future

        def forget(done: asyncio.Future[Any]) -> None:  # a caller that gave up frees the id
            if self._requests.get(request_id) is done:
                del self._requests[request_id]

        future.add_done_callback(forget)
        return future

    def complete_request(self, request_id: Hashable, value: Any) -> bool:
        """Settle the waiting request; False when none is registered under `request_id`."""
        future = self._requests.pop(request_id, None)
        if future is None or future.done():
            return False
        future.set_result(value)
        return True

    def fail_request(self, request_id: Hashable, error: BaseException) -> bool:
        """Fail one waiting request (an error answer); False when none is registered."""
        future = self._requests.pop(request_id, None)
        if future is None or future.done():
            return False
        future.set_exception(error)
        return True

    async def fail(self, exc: BaseException) -> None:
        """End the channel: fail every waiting request, close the connection, report to on_failure.

        Only the first cause counts; later calls do nothing. An exception that is neither a
        RuntimeError nor an OSError becomes a `ChannelDetached` wrapping it."""
        await self._settle(exc, report=True)

    # ── inside ───────────────────────────────────────────────────────────────────────────────────

    async def _settle(self, exc: BaseException, *, report: bool) -> None:
        if self._fatal is not None:
            return
        if isinstance(exc, _EXPECTED_FAILURES):
            fatal: BaseException = exc
        else:
            fatal = ChannelDetached(f"the {self.label} channel failed: {type(exc).__name__}: {exc}")
            fatal.__cause__ = exc
        self._fatal = fatal
        connecting, self._ready = self._ready, None  # `connect` raises once the failure is reported
        waiting, self._requests = self._requests, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(fatal)
        try:
            await self._release()
            if report:
                try:
                    await self._on_failure(fatal)
                except Exception:
                    log.exception("the %s channel's on_failure callback failed", self.label)
        finally:
            if connecting is not None and not connecting.done():
                connecting.set_exception(fatal)

    async def _send(self, message: bytes | str) -> None:
        ws = self._ws
        if ws is None or not self.is_connected:
            why = f" ({self._fatal})" if self._fatal is not None else ""
            raise ChannelDetached(f"the {self.label} channel is not connected{why}")
        try:
            await ws.send(message)
        except ConnectionClosed as exc:
            raise ChannelDetached(f"the {self.label} channel was disconnected while sending") from exc

    async def _open(self, since: int, takeover: bool) -> ClientConnection:
        assert self.session_id is not None
        query = {"pty": "1" if self.mode_pty else "0", "since": str(since)}
        if takeover:
            query["takeover"] = "1"
        return await open_async(self.endpoint, session_path(self.session_id, "/ws"), query,
                                open_timeout=OPEN_TIMEOUT_SECONDS, keepalive=self._keepalive,
                                max_size=MAX_MESSAGE_BYTES, close_timeout=CLOSE_TIMEOUT_SECONDS)

    async def _read(self, ws: ClientConnection) -> None:
        cause: BaseException
        try:
            while self._ws is ws:  # not once released (a callback let finish ends the loop here)
                if self._exited is None:
                    message = await ws.recv()
                else:  # after `exit`, output may still come until the connection closes: not for ever
                    try:
                        message = await asyncio.wait_for(ws.recv(), EXIT_GRACE_SECONDS)
                    except asyncio.TimeoutError:
                        raise ProgramExited(self.label, self._exited.exit_code, self.stderr_tail) from None
                if isinstance(message, str):
                    await self._on_control(message)
                else:
                    await self._on_frame(ws, message)
            return
        except asyncio.CancelledError:
            raise
        except ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code == CLOSE_POLICY_VIOLATION and await self._refused():
                return
            exited = self._exited
            cause = (ProgramExited(self.label, exited.exit_code, self.stderr_tail) if exited is not None
                     else self._closed_cause(exc))
        except Exception as exc:
            cause = exc
        if self._ws is ws:  # not a detach or a failure already under way
            await self.fail(cause)

    async def _on_frame(self, ws: ClientConnection, frame: bytes) -> None:
        # Handed over is delivered: the cursor passes an event before its callback runs, and a detach
        # never cuts a callback off (`_release` leaves a reader alone while it is in here: it waits
        # only in callbacks), so no later connection hands the event over again.
        reader = asyncio.current_task()
        self._handing = reader
        try:
            if self._probe is not None:
                frame = await self._check_cursor(frame)
                if not frame or self._ws is not ws:
                    return
            self._note_arrival(frame)
            decoder = self._decoder
            decoder.push(frame)
            on_record, on_not_json, on_stderr = self._on_record, self._on_not_json, self._on_stderr
            while (event := decoder.next_event()) is not None:
                self._cursor = decoder.resume_offset
                if isinstance(event, Record):
                    await on_record(event.value, event.offset)
                elif isinstance(event, NotJsonLine):
                    if on_not_json is None:
                        continue
                    await on_not_json(event.text, event.offset)
                elif on_stderr is not None:
                    await on_stderr(event.text)
                else:
                    continue
                if self._ws is not ws:
                    return  # released while the callback ran: the rest is the next connection's to read
            self._cursor = decoder.resume_offset
        finally:
            if self._handing is reader:
                self._handing = None

    async def _refused(self) -> bool:
        """Whether a Close 1008 is a refusal behind a proxy (it came before `connected`, while
        `connect` waits); if so, `connect` gets the refusal as execd would have answered it."""
        ready, session_id = self._ready, self.session_id
        if self._connected or ready is None or ready.done() or session_id is None:
            return False
        error = await asyncio.to_thread(refused_through_proxy, self._control, session_id)
        if ready.done():
            return False
        ready.set_exception(_Refused(error))
        return True

    def _note_arrival(self, frame: bytes) -> None:
        if not frame or frame[0] not in (STDOUT, STDERR, REPLAY):
            return
        if frame[0] == REPLAY:
            if len(frame) < REPLAY_HEADER_BYTES:
                return
            offset = int.from_bytes(frame[1:REPLAY_HEADER_BYTES], "big")
            data = frame[REPLAY_HEADER_BYTES:]
            if offset != self._arrived:
                self._recent.clear()
            self._arrived = offset
        else:
            data = frame[1:]
        self._recent += data[-RECENT_BYTES:]
        del self._recent[:-RECENT_BYTES]
        self._arrived += len(data)

    async def _check_cursor(self, frame: bytes) -> bytes:
        """The first output frame of a connection asked from `probe_offset`: b"" or the frame to decode."""
        assert self._probe is not None
        since, tail = self._probe
        self._probe = None
        offset = int.from_bytes(frame[1:REPLAY_HEADER_BYTES], "big") if frame[:1] == bytes([REPLAY]) else None
        if offset is not None and len(frame) < REPLAY_HEADER_BYTES:
            return frame  # the decoder says what is wrong with it
        if offset is not None and offset >= since:
            return frame  # the bytes before the cursor left the ring: nothing to check (a gap is the decoder's)
        data = frame[REPLAY_HEADER_BYTES:] if offset is not None else b""
        base = offset if offset is not None else since
        known = tail[max(0, base - (since - len(tail))):]
        if known and data[since - len(known) - base:since - base] == known:
            self._recent[:] = known  # known, for the next cursor_tail
            rest = data[since - base:]
            return encode_frame(REPLAY, rest, offset=since) if rest else b""
        # The cursor disagrees with the ring. Resume right after the bytes this channel saw last where
        # the ring holds them (the occurrence nearest the cursor), else at the first line that starts
        # after since - 1.
        self.cursor_mismatches += 1
        found = nearest(data, known, since - base) if len(known) == len(tail) else -1
        newline = data.find(b"\n", since - 1 - base) if data else -1
        if offset is None:
            resume, rest, kept = since, b"", frame
        elif found >= 0:
            resume, rest, kept = base + found, data[found:], b""
        elif newline >= 0:
            resume, rest, kept = base + newline + 1, data[newline + 1:], b""
        else:
            resume, rest, kept = max(since, base + len(data)), b"", b""
        where = ("right after the last output this kernel read" if found >= 0
                 else "the first line boundary execd's replay shows; a record may be missing or repeated here")
        said = (f"owsandbox: the {self.label} cursor {since} does not agree with execd's output ring (live "
                "stdout and stderr arrived in another order than execd stored them); resuming at offset "
                f"{resume}, {where}. Keeping the program's stderr apart (2>file) avoids this.")
        log.warning("%s", said)
        self._decoder.reset(resume)
        self._cursor = resume
        self._arrived = resume
        if self._on_stderr is not None:
            await self._on_stderr(said + "\n")
        if kept:
            return kept
        return encode_frame(REPLAY, rest, offset=resume) if rest else b""

    async def _on_control(self, text: str) -> None:
        control = parse_control(text)
        if isinstance(control, Connected):
            self.mode = control.mode
            if self.mode is not None:
                self._decoder.lenient_stdout = self.mode == "pty"
            self._connected = True
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(None)
        elif isinstance(control, Exited):
            # Not the end yet: a released execd sends `exit` before its pumps have sent the last
            # output (`controller/pty_ws.go`, `ptyExitWatcher`); the end is the connection's close.
            self._exited = control
        elif isinstance(control, ServerError):
            if control.code == "TAKEN_OVER":
                raise ChannelTakenOver(f"another client took the {self.label} session over: {control.message}")
            raise ExecdServerError(control.code, control.message)
        # "pong", text that is not a control message, and types added later: nothing to do

    def _closed_cause(self, closed: ConnectionClosed) -> ChannelDetached:
        received = closed.rcvd  # the peer's Close frame, if one came
        code, reason = (received.code, received.reason) if received is not None else (None, "")
        if code == CLOSE_TAKEN_OVER:
            return ChannelTakenOver(f"another client took the {self.label} session over (execd closed this "
                                    f"connection with {code} {reason or 'TAKEN_OVER'}); the program keeps running")
        if code is None:
            return ChannelDetached(f"the connection to execd for {self.label} was lost without a closing handshake")
        said = f" {reason}" if reason else ""
        return ChannelDetached(f"execd closed the {self.label} connection (code {code}{said}) without an exit notice")

    async def _release(self) -> None:
        """Stop the reader and close the socket (bounded); the state says 'not connected' at once."""
        ws, reader = self._ws, self._reader
        self._ws = self._reader = None
        self._connected = False
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(ChannelDetached(f"the {self.label} channel was detached while connecting"))
        if reader is not None and reader is not asyncio.current_task():
            if reader is self._handing:
                # An adapter's callback is running: its event counts as delivered, so it is let
                # finish (however long it takes: a detach stays prompt); the reader ends after it.
                self._finishing.add(reader)
                reader.add_done_callback(self._finishing.discard)
            else:
                reader.cancel()
                await asyncio.wait({reader})
        if ws is not None:
            await close_async(ws, CLOSE_TIMEOUT_SECONDS)  # this module's value, so that a patched one counts
