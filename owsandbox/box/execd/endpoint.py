"""An execd-compatible PTY/pipe endpoint, served from inside the sandbox with the standard library.

OpenSandbox's execd lets a client start a long-running program (`POST /pty`), watch and steer it over
a WebSocket, detach, and later resume from a byte offset. The channel that `%attach` uses speaks
that API, so serving the same subset here makes `%attach` work in every sandbox the runner reaches,
not only in OpenSandbox ones. The API is execd's PTY API as OpenSandbox's Go source defines it
(`components/execd`: `POST /pty`, `GET /pty/{id}`, `DELETE /pty/{id}`, `GET /pty/{id}/ws` with its
binary frames and JSON control messages); where this server differs from execd, it is stricter:
after answering a client's Close it also closes the TCP connection.

The HTTP side is deliberately tiny and strict (one request per connection, a bounded head and body,
anything unusual is a 400), since its only clients are our channel and tests. Threads: one per
listening socket, one per connection (which becomes the WebSocket's reader), one writer per
WebSocket (so nothing that hands it frames ever blocks on the network), and a pump per process
(in `ptysessions`).
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import re
import selectors
import socket
import threading
import time
from typing import Any

from ..daemonctl import listen_unix
from . import portrelay
from . import wsframes as ws
from .http import HttpError, Request, RequestReader, bad_request, http_response
from .ptysessions import KIND_REPLAY, KIND_STDIN, SIGNALS, PtySession, SessionTable, StartFailed

TOKEN_HEADER = "x-execd-access-token"
HIGH_WATER_BYTES = 1024 * 1024  # output queued for a client before the pump waits for it
UNAUTHORIZED = {"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}
_SESSION_PATH = re.compile(r"/pty/([^/]+)(/ws)?")


# -- reading and answering HTTP ----------------------------------------------------------------


def _recv(sock: socket.socket, deadline: float) -> bytes:
    """Some bytes from `sock` (b"" at its end); TimeoutError after `deadline` (time.monotonic())."""
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        if not selector.select(max(0.0, deadline - time.monotonic())):
            raise TimeoutError("the client sent no request in time")
    return sock.recv(65536)


def read_request(sock: socket.socket, deadline: float) -> tuple[Request, bytes]:
    """One request, and whatever bytes came after it (the first WebSocket frames, for an upgrade)."""
    reader = RequestReader()
    while reader.request is None:
        data = _recv(sock, deadline)
        if not data:
            raise ConnectionError("the client left before sending a whole request" if not reader.head_read
                                  else "the client left before sending the whole body")
        reader.feed(data)
        if reader.wants_continue:
            reader.wants_continue = False
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl, for one, waits a second for this
    return reader.request, reader.rest





def _close_gently(sock: socket.socket, linger: float = 1.0) -> None:
    """Close after an answer, reading what the client still sends for a moment, so that unread
    request bytes do not turn the close into a reset that could destroy the answer in flight."""
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + linger
        while _recv(sock, deadline):
            pass
    except OSError:
        pass
    finally:
        sock.close()


# -- the WebSocket ------------------------------------------------------------------------------


class WsConnection:
    """One attached client. Frames are queued and sent by a writer thread, so the session's pump can
    hand over output under the session lock without waiting on the network; the connection's own
    thread reads (`run`), answers pings, pings the client, and drops it when it goes silent."""

    def __init__(self, sock: socket.socket, session: PtySession, *, ping_interval: float, idle_timeout: float,
                 close_timeout: float, max_message: int = ws.DEFAULT_MAX_MESSAGE) -> None:
        self.sock = sock
        self.session = session
        self.ping_interval = ping_interval
        self.idle_timeout = idle_timeout
        self.close_timeout = close_timeout
        self.max_message = max_message
        self._cond = threading.Condition()
        self._queue: list[tuple[float, int, bytes]] = []  # a heap: (when it may go, order, frame)
        self._order = itertools.count()
        self._close_queued = False  # a Close queued behind frames still due: TCP closes once it is out
        self._pending = 0  # bytes queued or being sent
        self._close_sent = False
        self._close_deadline: float | None = None
        self._finishing = False  # the writer closes TCP once the queue is empty
        self.closed = False
        self._writer = threading.Thread(target=self._write_loop, name="execd-ws-writer", daemon=True)

    # -- sending (never blocks) -------------------------------------------------------------

    def start_writer(self) -> None:
        self._writer.start()

    def send_output(self, kind: int, data: bytes) -> None:
        self._enqueue(ws.encode_frame(ws.OP_BINARY, bytes([kind]) + data), self.output_delay(kind))

    def output_delay(self, kind: int) -> float:
        """Seconds an output frame of `kind` waits before it may go: none here (a subclass may hold
        frames back, as a server whose streams are pumped apart does, so that they can cross)."""
        return 0.0

    def send_replay(self, offset: int, data: bytes) -> None:
        self._enqueue(ws.encode_frame(ws.OP_BINARY, bytes([KIND_REPLAY]) + offset.to_bytes(8, "big") + data))

    def send_json(self, message: dict[str, Any]) -> None:
        self._enqueue(ws.encode_frame(ws.OP_TEXT, json.dumps(message).encode("utf-8")))

    def send_error(self, code: str, error: str) -> None:
        self.send_json({"type": "error", "code": code, "error": error})

    def send_exit(self, exit_code: int) -> None:
        self.send_json({"type": "exit", "exit_code": exit_code})
        self.close(ws.CLOSE_NORMAL, "process exited")

    def close_after_queued(self, frame: bytes) -> None:
        """Queue `frame` now, then a Close after every frame still held back, and close TCP once that
        is out without waiting for the client's Close (for a subclass whose `exit` overtakes output)."""
        with self._cond:
            if self._close_sent or self.closed:
                return
            self._push(frame)
            self._close_queued = True
            self._close_sent = True
            self._close_deadline = time.monotonic() + self.close_timeout
            latest = max((due for due, _, _ in self._queue), default=0.0)
            self._push(ws.encode_frame(ws.OP_CLOSE, ws.close_payload(ws.CLOSE_NORMAL, "process exited")), due=latest)

    def close(self, code: int | None, reason: str = "") -> None:
        """Start the closing handshake: queue a Close frame; nothing else is sent after it."""
        payload = b"" if code is None else ws.close_payload(code, reason)
        with self._cond:
            if self._close_sent or self.closed:
                return
            self._close_sent = True
            self._close_deadline = time.monotonic() + self.close_timeout
            self._push(ws.encode_frame(ws.OP_CLOSE, payload))

    def wait_drained(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._pending <= HIGH_WATER_BYTES or self.closed)

    def _enqueue(self, frame: bytes, lag: float = 0.0) -> None:
        with self._cond:
            if not self._close_sent and not self.closed:
                self._push(frame, time.monotonic() + lag if lag else 0.0)

    def _push(self, frame: bytes, due: float = 0.0) -> None:
        heapq.heappush(self._queue, (due, next(self._order), frame))
        self._pending += len(frame)
        self._cond.notify_all()

    def _due_frames(self) -> list[bytes]:
        """The frames that may go now, in order (the caller holds `_cond`)."""
        now = time.monotonic()
        frames = []
        while self._queue and self._queue[0][0] <= now:
            frames.append(heapq.heappop(self._queue)[2])
        return frames

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._finishing or self.closed)
                if self.closed:
                    return
                if not self._queue:
                    break
                frames = self._due_frames()
                if not frames:  # the first frame is still held back
                    self._cond.wait(max(0.0, self._queue[0][0] - time.monotonic()))
                    continue
                last = not self._queue and self._close_queued
            data = b"".join(frames)
            try:
                self.sock.sendall(data)
            except OSError:
                self.abort()
                return
            with self._cond:
                self._pending -= len(data)
                self._cond.notify_all()
            if last:
                break  # the queued Close is out: TCP closes now
        self.abort()  # everything is sent: close TCP

    def abort(self) -> None:
        """Close TCP now; queued frames are dropped and anyone waiting on the queue is released."""
        with self._cond:
            if self.closed:
                return
            self.closed = True
            self._queue.clear()
            self._pending = 0
            self._cond.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def finish(self) -> None:
        """Close TCP once what is queued is sent, waiting at most `close_timeout` for a slow client."""
        with self._cond:
            self._finishing = True
            self._cond.notify_all()
            flushed = self._cond.wait_for(lambda: self.closed, self.close_timeout)
        if not flushed:
            self.abort()

    # -- reading ----------------------------------------------------------------------------

    def run(self, initial: bytes = b"") -> None:
        """Read the client until it closes, goes silent, or breaks the protocol; then close TCP."""
        parser = ws.FrameParser(self.max_message)
        try:
            self._read_loop(parser, initial)
        except ws.ProtocolError as err:
            self.close(err.code, str(err))
        except OSError:
            self.abort()
        finally:
            self.session.detach(self)  # before TCP closes: a client that reconnects at once must not get a 409
            self.finish()

    def _read_loop(self, parser: ws.FrameParser, data: bytes) -> None:
        now = time.monotonic()
        last_heard, next_ping = now, now + self.ping_interval
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            while not self.closed:
                if data:
                    for opcode, payload in parser.feed(data):
                        if not self._on_message(opcode, payload):
                            return
                    data = b""
                    last_heard = time.monotonic()  # the time spent handling it is not the client's silence
                now = time.monotonic()
                if self._close_deadline is not None and now >= self._close_deadline:
                    return  # the client never answered our Close
                if now >= last_heard + self.idle_timeout:
                    self.close(ws.CLOSE_GOING_AWAY, f"nothing heard from the client for {self.idle_timeout:g} s")
                    return
                if now >= next_ping:
                    self._ping()
                    next_ping = now + self.ping_interval
                # Wake at least once a second: a Close queued by another thread sets a deadline too.
                wake = min(next_ping, last_heard + self.idle_timeout, self._close_deadline or next_ping, now + 1.0)
                if selector.select(max(0.0, wake - now)):
                    data = self.sock.recv(65536)
                    if not data:
                        return
                    last_heard = time.monotonic()

    def _ping(self) -> None:
        self._enqueue(ws.encode_frame(ws.OP_PING, b""))

    def _on_message(self, opcode: int, payload: bytes) -> bool:
        """Handle one message; False once the connection is done reading."""
        if opcode == ws.OP_CLOSE:
            code, _reason = ws.parse_close(payload)
            self.session.detach(self)
            self.close(None if code == ws.CLOSE_NO_STATUS else code)  # echo, unless ours went first
            return False
        if opcode == ws.OP_PING:
            self._enqueue(ws.encode_frame(ws.OP_PONG, payload))
        elif opcode == ws.OP_PONG or self._close_sent:
            pass  # a pong only shows the client is alive; data after our Close is dropped
        elif opcode == ws.OP_BINARY:
            self._on_binary(payload)
        else:
            self._on_text(payload.decode("utf-8"))
        return True

    def _on_binary(self, payload: bytes) -> None:
        if not payload or payload[0] != KIND_STDIN:
            self.send_error("INVALID_FRAME", "a binary frame from the client must start with 0x00 (stdin)")
            return
        if len(payload) > 1:
            self._write_stdin(payload[1:])

    def _on_text(self, text: str) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            return  # text that is not JSON is ignored, as execd does
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "stdin" and isinstance(message.get("data"), str):
            self._write_stdin(message["data"].encode("utf-8", "replace"))
        elif kind == "signal" and message.get("signal") in SIGNALS:
            self.session.signal(SIGNALS[message["signal"]])
        elif kind == "resize" and _dimension(message.get("cols")) and _dimension(message.get("rows")):
            self._resize(message["cols"], message["rows"])
        elif kind == "ping":
            self.send_json({"type": "pong"})
        else:
            self.send_error("INVALID_FRAME", f"not a control frame this server knows: {text[:200]}")

    def _write_stdin(self, data: bytes) -> None:
        try:
            self.session.write_stdin(data)
        except (OSError, ValueError) as exc:
            self.send_error("STDIN_WRITE_FAILED", f"could not write to the process's stdin: {exc}")

    def _resize(self, cols: int, rows: int) -> None:
        try:
            self.session.resize(cols, rows)
        except OSError as exc:
            self.send_error("RUNTIME_ERROR", f"resize failed: {exc}")


def _dimension(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 0xFFFF


# -- the server ---------------------------------------------------------------------------------


class ExecdServer:
    """The HTTP + WebSocket server on a Unix socket and/or a TCP port; `start()` returns at once.

    What differs in a released OpenSandbox execd is played by a subclass in the tests through the
    hooks below (`takeover_allowed`, `status_keys`, `session_class`, `_list_sessions`,
    `_session_command`, `_connection`, `_unauthorized`, `_refused`); the box ships none of it.
    """

    #: Whether `takeover=1` may replace an attached client (execd's own main branch has it).
    takeover_allowed = True
    #: The fields of `GET /pty/{id}`: `exit_code` says that an ended program's session can be
    #: attached to again to read its exit.
    status_keys: tuple[str, ...] = ("session_id", "running", "output_offset", "exit_code")
    session_class = PtySession

    def __init__(self, token: str, unix_path: str | None = None, tcp_host: str | None = None, tcp_port: int = 0,
                 *, cwd: str | None = None, ping_interval: float = 30.0, idle_timeout: float = 60.0,
                 kill_grace: float = 2.0, close_timeout: float = 5.0, request_timeout: float = 30.0,
                 unix_listener: socket.socket | None = None) -> None:
        if not token:
            raise ValueError("an access token is required")
        if unix_path is None and tcp_host is None:
            raise ValueError("give a Unix socket path, a TCP host, or both")
        self.token = token
        self.unix_path = os.path.abspath(unix_path) if unix_path is not None else None
        self.tcp_host = tcp_host
        self.tcp_port = tcp_port
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.ping_interval = ping_interval
        self.idle_timeout = idle_timeout
        self.close_timeout = close_timeout
        self.request_timeout = request_timeout
        self.sessions = SessionTable(kill_grace, self.session_class)
        self.ports = portrelay.PortRelays()  # `/ports`: relays to the box's own loopback (%preview)
        self._listeners: list[socket.socket] = []
        # A listening socket made by whoever started the box (so the box cannot swap the file the
        # host connects to); `unix_path` then only names it.
        self._given_listener = unix_listener
        self._threads: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def __enter__(self) -> ExecdServer:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        if self._listeners:
            raise RuntimeError("the server is already started")
        try:
            if self._given_listener is not None:
                self._listeners.append(self._given_listener)
            elif self.unix_path is not None:
                self._listeners.append(listen_unix(self.unix_path))
            if self.tcp_host is not None:
                listener = socket.create_server((self.tcp_host, self.tcp_port), family=_family(self.tcp_host))
                self.tcp_port = listener.getsockname()[1]
                self._listeners.append(listener)
        except BaseException:
            self._close_listeners()
            raise
        for listener in self._listeners:
            thread = threading.Thread(target=self._accept_loop, args=(listener,), name="execd-listener", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop listening, kill every session's processes, and drop every connection."""
        self._stopping.set()
        self._close_listeners()
        for thread in self._threads:
            thread.join(5)
        self.sessions.kill_all()
        with self._lock:
            connections = list(self._connections)
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def address(self) -> dict[str, str]:
        """Where and how to reach the server: `unix_socket` and/or `url`, and the `token`."""
        found: dict[str, str] = {}
        if self.unix_path is not None:
            found["unix_socket"] = self.unix_path
        if self.tcp_host is not None:
            host = f"[{self.tcp_host}]" if ":" in self.tcp_host else self.tcp_host
            found["url"] = f"http://{host}:{self.tcp_port}"
        found["token"] = self.token
        return found

    def _close_listeners(self) -> None:
        for listener in self._listeners:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            except OSError:
                pass
            listener.close()
        if self.unix_path is not None and self._listeners and self._given_listener is None:
            try:
                os.unlink(self.unix_path)
            except OSError:
                pass

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.05)  # out of descriptors, say: keep serving once some are freed
                continue
            with self._lock:
                self._connections.add(sock)
            threading.Thread(target=self._serve, args=(sock,), name="execd-conn", daemon=True).start()

    # -- one connection ---------------------------------------------------------------------

    def _serve(self, sock: socket.socket) -> None:
        upgraded = False
        request: Request | None = None
        try:
            request, rest = read_request(sock, time.monotonic() + self.request_timeout)
            upgraded = self._dispatch(sock, request, rest)
        except HttpError as err:
            if request is not None and self._refused(sock, request, err):
                return
            self._answer(sock, err.status, err.body)
        except (OSError, ValueError):
            pass  # the client left, or never finished its request
        finally:
            with self._lock:
                self._connections.discard(sock)
            if not upgraded:
                _close_gently(sock)

    def _answer(self, sock: socket.socket, status: int, body: dict[str, Any]) -> None:
        try:
            sock.sendall(http_response(status, body))
        except OSError:
            pass

    def _dispatch(self, sock: socket.socket, request: Request, rest: bytes) -> bool:
        """Answer `request`; True when it became a WebSocket (which is then finished and closed)."""
        if not self._authorized(request):
            self._unauthorized(sock)
            return False
        match = _SESSION_PATH.fullmatch(request.path)
        if request.path == "/pty":
            status, body = self._on_pty(request)
        elif match is not None and match.group(2):
            _require(request, "GET")
            self._websocket(sock, request, match.group(1), rest)
            return True
        elif match is not None:
            status, body = self._on_session(request, match.group(1))
        elif portrelay.matches(request.path):
            relayed, status, body = self.ports.dispatch(sock, request, rest)
            if relayed:
                return True
        else:
            raise HttpError(404, "NOT_FOUND", f"no such path: {request.path}")
        self._answer(sock, status, body)
        return False

    def _unauthorized(self, sock: socket.socket) -> None:
        self._answer(sock, 401, UNAUTHORIZED)

    def _refused(self, sock: socket.socket, request: Request, err: HttpError) -> bool:
        """A refusal answered otherwise than in HTTP (True when done); this server answers in HTTP."""
        return False

    def _authorized(self, request: Request) -> bool:
        import hmac  # here, not at the top: it loads OpenSSL, which an idle daemon has no use for

        values = request.headers.get(TOKEN_HEADER, [])
        given = values[0].encode("latin-1") if len(values) == 1 else b""
        return hmac.compare_digest(given, self.token.encode("utf-8"))

    # -- HTTP endpoints ---------------------------------------------------------------------

    def _on_pty(self, request: Request) -> tuple[int, dict[str, Any]]:
        _require(request, "GET", "POST")
        if request.method == "GET":
            return self._list_sessions()
        cwd, command = self._create_params(request.body)
        session = self.sessions.create(cwd, command)
        return 201, {"session_id": session.session_id}

    def _list_sessions(self) -> tuple[int, dict[str, Any]]:
        return 200, {"sessions": [session.describe() for session in self.sessions.all()]}

    def _session_command(self, command: str | None) -> str | None:
        """The program a new session runs (None: a bare bash), from the creating request's `command`."""
        return command

    def _create_params(self, body: bytes) -> tuple[str, str | None]:
        try:
            params = json.loads(body) if body.strip() else {}
        except ValueError as exc:
            raise bad_request(f"the body is not JSON: {exc}") from None
        if not isinstance(params, dict):
            raise bad_request("the body must be a JSON object")
        cwd, command = params.get("cwd"), params.get("command")
        if cwd is not None and not isinstance(cwd, str):
            raise bad_request("'cwd' must be a string")
        if command is not None and not isinstance(command, str):
            raise bad_request("'command' must be a string")
        command = self._session_command(command)
        folder = os.path.join(self.cwd, cwd) if cwd else self.cwd
        if not os.path.isdir(folder):
            raise bad_request(f"cwd does not exist or is not a folder: {folder}")
        return folder, command or None

    def _on_session(self, request: Request, session_id: str) -> tuple[int, dict[str, Any]]:
        _require(request, "GET", "DELETE")
        if request.method == "DELETE":
            if not self.sessions.delete(session_id):
                raise _not_found(session_id)
            return 200, {"session_id": session_id, "deleted": True}
        session = self._session(session_id)
        info = session.describe()
        return 200, {key: info[key] for key in self.status_keys}

    def _session(self, session_id: str) -> PtySession:
        session = self.sessions.get(session_id)
        if session is None:
            raise _not_found(session_id)
        return session

    # -- the WebSocket endpoint -------------------------------------------------------------

    def _websocket(self, sock: socket.socket, request: Request, session_id: str, rest: bytes) -> None:
        session = self._session(session_id)
        use_pty, since, takeover = _ws_query(request)
        key = _ws_key(request)
        conn = self._connection(sock, session)
        takeover = takeover and self.takeover_allowed
        with session.lock:
            if session.client is not None and not takeover:
                raise HttpError(409, "ALREADY_CONNECTED", "another client is attached to this session; "
                                "connect with takeover=1 to replace it")
            sock.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Accept: " + ws.accept_key(key).encode("ascii") + b"\r\n\r\n")
            self._attach_locked(session, conn, use_pty, since)
        conn.start_writer()
        try:
            conn.run(rest)
        except Exception:
            conn.abort()  # nothing may be answered in HTTP any more
            raise
        finally:
            session.detach(conn)

    def _connection(self, sock: socket.socket, session: PtySession) -> WsConnection:
        return WsConnection(sock, session, ping_interval=self.ping_interval, idle_timeout=self.idle_timeout,
                            close_timeout=self.close_timeout)

    def _attach_locked(self, session: PtySession, conn: WsConnection, use_pty: bool, since: int) -> None:
        """Start the process if needed, then: replay, `connected`, and `exit` if it is over already."""
        try:
            session.start_locked(use_pty)
        except StartFailed as exc:
            conn.send_error(exc.code, str(exc))
            conn.close(ws.CLOSE_INTERNAL_ERROR, exc.code)
            return
        old, replay = session.attach_locked(conn, since)
        if replay is not None:
            conn.send_replay(*replay)
        conn.send_json({"type": "connected", "session_id": session.session_id, "mode": session.mode})
        if session.done.is_set():
            conn.send_exit(session.exit_code if session.exit_code is not None else -1)
        if old is not None and old is not conn:
            old.close(4001, "TAKEN_OVER")


def _require(request: Request, *methods: str) -> None:
    if request.method not in methods:
        raise HttpError(405, "METHOD_NOT_ALLOWED", f"{request.method} is not allowed on {request.path}")


def _not_found(session_id: str) -> HttpError:
    return HttpError(404, "NOT_FOUND", f"no session {session_id}")


def _ws_query(request: Request) -> tuple[bool, int, bool]:
    """(PTY mode, since, takeover) from the query: `pty=0` is pipe mode, anything else a PTY."""
    since_text = request.query.get("since", "0")
    if not (since_text.isascii() and since_text.isdigit()):
        raise bad_request(f"'since' must be a byte offset (a whole number ≥ 0), not {since_text!r}")
    return request.query.get("pty") != "0", int(since_text), request.query.get("takeover") in ("1", "true")


def _ws_key(request: Request) -> str:
    """The client's Sec-WebSocket-Key, once the request is checked to be a WebSocket upgrade."""
    upgrade = (request.header("upgrade") or "").lower()
    connection = {token.strip().lower() for token in (request.header("connection") or "").split(",")}
    if upgrade != "websocket" or "upgrade" not in connection:
        raise bad_request("this path is a WebSocket: send Upgrade: websocket and Connection: Upgrade")
    if request.header("sec-websocket-version") != "13":
        raise bad_request("only WebSocket version 13 is supported")
    key = request.header("sec-websocket-key")
    if key is None or len(key) != 24 or not key.endswith("=="):
        raise bad_request("a missing or malformed Sec-WebSocket-Key")
    return key


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
