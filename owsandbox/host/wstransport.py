"""A pipe to the daemon carried by an execd pipe session, for boxes reached only through execd.

An OpenSandbox sandbox offers no `ssh` and no `docker exec`: only its execd, an HTTP + WebSocket
API. The runner needs nothing more than a command with stdin and stdout, and execd's pipe sessions
are exactly that: `POST /pty` makes the session, the WebSocket `GET /pty/{id}/ws?pty=0&since=0`
starts its bash, the first stdin line (`execdws.start_line`) makes that bash exec the command —
released execds ignore a `command` in `POST /pty` — and the WebSocket carries its bytes — binary frames `0x00 + data` to
its stdin, `0x01` (STDOUT) and `0x03` (REPLAY, an 8-byte offset then bytes) back from its stdout,
`0x02` from its stderr. So `ExecdPipeTransport` is `PipeTransport` with a WebSocket in place of a
child process, and the runner client cannot tell them apart.

The WebSocket itself (frame kinds and codec, control messages, connect options, handshake errors,
the close quirk) is `channel.execdws`'s, shared with the `%attach` channel; this module is its thin
threaded shell. Threads: the runner client reads in its pump thread and sends from others.
websockets' sync client fits that: its own thread reads the socket, `recv` hands over messages in
order, and `send` may be called from any thread (a lock here keeps one frame sequence whole).

execd's quirks, handled here (and in `execdws`):

* a REPLAY frame may come before `connected`; its bytes are stdout like the rest;
* `exit` can overtake the last output (released execds send it when the process is reaped, without
  waiting for their output pumps: `controller/pty_ws.go`, `ptyExitWatcher`), so the stream goes on
  after `exit` until the connection closes, for `EXIT_GRACE_SECONDS` at most;
* execd answers a Close but never closes TCP, and websockets, as a client, waits for the server to
  do it (RFC 6455 allows that). So once both Close frames have crossed, `execdws`'s close watcher
  closes the socket; a peer that never answers our Close is cut off after `CLOSE_TIMEOUT_SECONDS`;
* there is no "close stdin": the relay leaves when its session is deleted (`close()`), when the
  daemon drops it (a newer connection won), or after its own silence timeout.

A connection that drops ends the stream (`read()` → b""), as a relay process that dies does; the
runner client then opens a new pipe and resumes. Nothing is resumed at this level: a pipe never
connects to its session twice, which matters because a released execd would start a new bash in a
session whose program has ended (`controller/pty_ws.go`: `if !session.IsRunning()`). Behind
OpenSandbox's server proxy a refused WebSocket comes as Close 1008 before `connected`; the
session's status then says which refusal it was (`control.refused_through_proxy`).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from ..channel.control import ExecdControl, refused_through_proxy, session_path
from ..channel.endpoint import ExecdEndpoint
from ..channel.errors import BadFrame, ExecdError, ExecdHTTPError, ExecdUnreachable
from ..channel.execdws import (
    CLOSE_POLICY_VIOLATION,
    CLOSE_TIMEOUT_SECONDS,
    KEEPALIVE_SECONDS,
    REPLAY,
    STDOUT,
    Connected,
    Exited,
    ServerError,
    decode_frame,
    open_sync,
    parse_control,
    start_line,
    stdin_frames,
)

try:
    from websockets.exceptions import ConcurrencyError
except ImportError:  # websockets < 14 raised a plain RuntimeError for two readers at once
    ConcurrencyError = RuntimeError  # type: ignore[assignment,misc]

SEND_CHUNK_BYTES = 16 * 1024  # the most stdin in one frame: small, so a socket with room takes it whole
OPEN_TIMEOUT_SECONDS = 15.0  # the handshake, and then execd's `connected`
CONTROL_TIMEOUT_SECONDS = 10.0  # POST /pty and DELETE /pty/{id}
# CLOSE_TIMEOUT_SECONDS (how long a Close waits for execd's answer) and KEEPALIVE_SECONDS (WebSocket
# pings: a dead network ends the stream instead of hanging it) are execdws's.
STDERR_TAIL_BYTES = 8192
EXIT_GRACE_SECONDS = 2.0  # after execd's `exit`, how long output may still come before the connection closes


class ExecdTransportError(ConnectionError):
    """The pipe session could not be opened. An OSError, so the runner client retries a reconnect;
    `cause` is the channel's error (a 401 for a wrong token, execd unreachable, ...)."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class ExecdPipeTransport:
    """`command` run by execd (`bash -c command`, in `cwd` or execd's folder) as a pipe: the Transport
    the runner client uses (`send`, `read`, `close`, `kill`, `stderr_tail`)."""

    def __init__(self, endpoint: ExecdEndpoint, command: str, cwd: str | None = None, *,
                 open_timeout: float = OPEN_TIMEOUT_SECONDS, keepalive: float | None = KEEPALIVE_SECONDS) -> None:
        self._init_state(endpoint, command)
        try:
            self.session_id = self._control.create(cwd=cwd)
        except ExecdError as exc:
            raise ExecdTransportError(str(exc), exc) from exc
        try:
            self._ws = self._open(open_timeout, keepalive)
            self._await_connected(open_timeout)
            self.send(start_line(command))
        except OSError as exc:
            self._abandon()
            if isinstance(exc, ExecdTransportError):
                raise
            raise ExecdTransportError(f"could not start {command!r} through execd: {exc}", exc) from exc
        except BaseException:
            self._abandon()
            raise

    def _init_state(self, endpoint: ExecdEndpoint, command: str) -> None:
        self.endpoint = endpoint
        self.command = command
        self.session_id = ""
        self.mode: str | None = None  # as execd's `connected` said: "pipe"
        self.exit_code: int | None = None  # from execd's exit frame, once the command has ended
        self.ended = threading.Event()  # set once read() has reached the end of the stream
        self.closed = False
        self._control = ExecdControl(endpoint, timeout=CONTROL_TIMEOUT_SECONDS)
        self._ws: ClientConnection | None = None
        self._pending: list[bytes] = []  # stdout that came before `connected`
        self._tail = bytearray()
        self._lock = threading.Lock()  # the flags below and the tail
        self._send_lock = threading.Lock()
        self._reading = False
        self._finished = False  # no more stdout: Close, dropped connection, or the grace after `exit`
        self._exit_deadline: float | None = None  # time.monotonic() by which the connection should close after `exit`
        self._killed = False
        self._error_before_start: str | None = None  # an execd error frame that came before `connected`

    # -- opening ----------------------------------------------------------------------------

    def _open(self, open_timeout: float, keepalive: float | None) -> ClientConnection:
        try:
            return open_sync(self.endpoint, session_path(self.session_id, "/ws"), {"pty": "0", "since": "0"},
                             open_timeout=open_timeout, keepalive=keepalive, max_size=None,
                             close_timeout=CLOSE_TIMEOUT_SECONDS)
        except ExecdHTTPError as error:  # execd refused: its status and body say why
            raise ExecdTransportError(str(error), error) from None
        except ExecdUnreachable as error:
            cause = error.__cause__  # what websockets or the network raised
            raise ExecdTransportError(str(error), cause) from cause

    def _await_connected(self, timeout: float) -> None:
        """Read up to execd's `connected` (keeping any REPLAY or output that comes first)."""
        assert self._ws is not None
        deadline = _Deadline(timeout)
        while self.mode is None and not self._finished:
            try:
                message = self._ws.recv(deadline.left())
            except TimeoutError:
                raise ExecdTransportError(f"execd at {self.endpoint.describe()} did not confirm the pipe session "
                                          f"within {timeout:g} s") from None
            except ConnectionClosed as exc:
                if exc.rcvd is not None and exc.rcvd.code == CLOSE_POLICY_VIOLATION:
                    # OpenSandbox's server proxy: execd refused, the client gets Close 1008 (see
                    # control.refused_through_proxy), so the session's status says why.
                    error = refused_through_proxy(self._control, self.session_id)
                    raise ExecdTransportError(str(error), error) from None
                raise ExecdTransportError(f"execd at {self.endpoint.describe()} closed the pipe session before "
                                          f"it started{self._why(exc)}") from None
            data = self._take(message)
            if data:
                self._pending.append(data)
            if self._error_before_start is not None:
                raise ExecdTransportError(f"execd could not start {self.command!r}: {self._error_before_start}")

    def _abandon(self) -> None:
        """Undo a half-made pipe: drop the connection, forget the session."""
        ws = self._ws
        if ws is not None:
            ws.close_socket()
        if self.session_id:
            with contextlib.suppress(ExecdError, OSError):
                self._control.delete(self.session_id)

    # -- frames -----------------------------------------------------------------------------

    def _take(self, message: str | bytes) -> bytes:
        """The stdout bytes in one message (b"" for none); notes control frames and stderr."""
        if isinstance(message, str):
            self._control_frame(message)
            return b""
        try:
            frame = decode_frame(message)
        except BadFrame:  # nothing execd sends to a client: ignored
            return b""
        if frame.kind == STDOUT:
            return frame.data
        if frame.kind == REPLAY:
            if frame.offset != 0:  # we ask from 0 on a fresh session: anything else means bytes were lost
                self._add_tail(f"execd's replay starts at offset {frame.offset}, not 0: output was lost; "
                               "this pipe ends here\n".encode())
                self._finished = True
                return b""
            return frame.data
        self._add_tail(frame.data)  # STDERR
        return b""

    def _control_frame(self, text: str) -> None:
        control = parse_control(text)
        if isinstance(control, Connected):
            self.mode = control.mode or "pipe"
        elif isinstance(control, Exited):  # output may still follow: read on until the connection closes
            self.exit_code = control.exit_code
            if self._exit_deadline is None:
                self._exit_deadline = time.monotonic() + EXIT_GRACE_SECONDS
        elif isinstance(control, ServerError):
            said = f"{control.code}: {control.message}"
            self._add_tail(f"execd reported {said}\n".encode())
            if self.mode is None:
                self._error_before_start = said

    def _add_tail(self, data: bytes) -> None:
        with self._lock:
            self._tail += data
            del self._tail[:-STDERR_TAIL_BYTES]

    def _why(self, closed: ConnectionClosed) -> str:
        received = closed.rcvd
        if received is None:
            return " (the connection dropped)"
        return f" (close code {received.code}{' ' + received.reason if received.reason else ''})"

    # -- the Transport ----------------------------------------------------------------------

    def stderr_tail(self) -> str:
        with self._lock:
            return bytes(self._tail).decode("utf-8", "replace").strip()

    def send(self, data: bytes) -> None:
        """Write all of `data` to the command's stdin; raises OSError when the pipe is gone."""
        ws = self._ws
        if ws is None or self.closed or self._killed:
            raise BrokenPipeError("the execd pipe session is closed")
        try:
            with self._send_lock:
                for frame in stdin_frames(data, SEND_CHUNK_BYTES):
                    self._await_room(ws)
                    ws.send(frame)
        except ConnectionClosed as exc:
            raise BrokenPipeError(f"the execd pipe session ended{self._why(exc)}") from None

    def _await_room(self, ws: ClientConnection) -> None:
        """Wait until the socket takes more, without holding websockets' lock.

        websockets writes under the lock its reading thread needs, so a write that blocks stops our
        reading too; and execd may stop reading our stdin until we read its stdout (the relay copies
        one way at a time). Waiting here instead keeps output flowing while execd catches up."""
        while not (self.closed or self._killed):
            try:
                _, writable, _ = select.select([], [ws.socket], [], 1.0)
            except (OSError, ValueError):  # the socket was closed meanwhile
                break
            if writable:
                return
        raise BrokenPipeError("the execd pipe session is closed")

    def read(self, timeout: float | None = None) -> bytes:
        """The command's next stdout bytes; b"" once the stream has ended (exit, Close, a dropped
        connection, `kill()` or `close()`). With `timeout`, TimeoutError when nothing came in time."""
        with self._lock:
            if self._pending:
                return self._pending.pop(0)
            if self._finished or self._killed or self.closed or self._ws is None:
                self._finished = True
                self.ended.set()
                return b""
            self._reading = True
        try:
            return self._read(self._ws, timeout)
        finally:
            with self._lock:
                self._reading = False

    def _read(self, ws: ClientConnection, timeout: float | None) -> bytes:
        deadline = _Deadline(timeout)
        while True:
            wait = deadline.left()
            after_exit = self._exit_deadline is not None
            if after_exit:
                grace = max(0.0, self._exit_deadline - time.monotonic())
                wait = grace if wait is None else min(wait, grace)
            try:
                message = ws.recv(wait)
            except TimeoutError:
                if after_exit and time.monotonic() >= self._exit_deadline:
                    return self._end()  # execd said `exit` and then kept the connection open
                raise
            except (ConnectionClosed, ConcurrencyError) as exc:
                unasked = not (self._killed or self.closed)
                if isinstance(exc, ConnectionClosed) and unasked and (exc.rcvd is None or exc.rcvd.code != 1000):
                    self._add_tail(f"the pipe session at {self.endpoint.describe()} ended{self._why(exc)}\n".encode())
                return self._end()
            data = self._take(message)
            if data:
                return data
            if self._finished or self._killed:
                return self._end()

    def _end(self) -> bytes:
        self._finished = True
        self.ended.set()
        return b""

    def kill(self) -> None:
        """Cut the connection abruptly, as a lost network would (the session stays until `close`)."""
        self._killed = True
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(OSError):
                ws.socket.shutdown(socket.SHUT_RDWR)
            ws.close_socket()

    def close(self) -> None:
        """Detach (the closing handshake, bounded) and delete the session, so the relay exits."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            reader_active = self._reading
        ws = self._ws
        if ws is not None:
            if not reader_active:  # read what still comes, or flow control could hold back execd's answer
                threading.Thread(target=self._discard, args=(ws,), name="execd-pipe-drain", daemon=True).start()
            with contextlib.suppress(ConnectionClosed, OSError, RuntimeError):
                ws.close()
            ws.close_socket()
        self.ended.set()
        if self.session_id:
            with contextlib.suppress(ExecdError, OSError):
                self._control.delete(self.session_id)

    @staticmethod
    def _discard(ws: ClientConnection) -> None:
        with contextlib.suppress(ConnectionClosed, ConcurrencyError, TimeoutError, OSError, RuntimeError):
            while True:
                ws.recv(CLOSE_TIMEOUT_SECONDS + 1.0)

    def __repr__(self) -> str:
        return f"ExecdPipeTransport({self.endpoint.describe()!r}, session {self.session_id or '-'})"


class _Deadline:
    def __init__(self, timeout: float | None) -> None:
        self._end = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        """Seconds left (None: no deadline)."""
        return None if self._end is None else max(0.0, self._end - time.monotonic())
