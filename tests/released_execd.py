"""A released OpenSandbox execd (docker/execd v1.0.10 to v1.0.18), played by the box's own
execd-compatible endpoint where the two differ, for the tests of everything that talks to one.

The real execd cannot be built from a package registry (Go and its modules), so the tests reach its
behaviour through `ReleasedExecd`, a subclass of the box's `ExecdServer` that uses its hooks; each
difference is written down in `RELEASE_QUIRKS` with the Go source that shows it. The box itself
ships none of this. `ReleasedExecd(proxy_refusals=True)` also answers refusals as OpenSandbox's
server proxy does. `ProxyingExecd` adds execd's own reverse proxy (`/proxy/{port}/...`), which the
Docker runtime's bridge mode gives as every endpoint.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from typing import Any
from urllib.parse import urlencode

from owsandbox.box.execd import wsframes as ws
from owsandbox.box.execd.endpoint import (
    _SESSION_PATH,
    UNAUTHORIZED,
    ExecdServer,
    HttpError,
    Request,
    WsConnection,
    _close_gently,
    _ws_key,
)
from owsandbox.box.execd.ptysessions import KIND_STDERR, PtySession

# The released execds this plays.
RELEASES = tuple(f"v1.0.{n}" for n in range(10, 19))
# What differs, each as OpenSandbox's Go source (components/execd) shows it at docker/execd/v1.0.10
# to v1.0.18:
RELEASE_QUIRKS = {
    "command ignored": "pkg/web/model/pty.go: CreatePTYSessionRequest decodes `cwd` only; the session is a "
                       "bare `bash --norc --noprofile` (runtime/pty_session.go, StartPipe/StartPTY)",
    "no takeover": "controller/pty_ws.go: `if !session.LockWS()` answers 409 ALREADY_CONNECTED; the lock is "
                   "held until the handler's read loop ends (a vanished client: the 60 s read deadline)",
    "restart": "controller/pty_ws.go: `if !session.IsRunning()` starts bash again; IsRunning is `pid != 0` and "
               "waitAndExitPipe sets pid to 0 (runtime/pty_session.go); the new connection gets no `exit`",
    "exit first": "controller/pty_ws.go, ptyExitWatcher: `exit` when the process is reaped, not after the "
                  "pumps, then the Close frame and conn.Close()",
    "live order": "runtime/pty_session.go writeAndFanout writes the ring, then each stream's io.Pipe read by its "
                  "own pump goroutine (controller/pty_ws.go ptyStreamPump): stdout and stderr frames may cross",
    "no list": "pkg/web/router.go: no GET on /pty, gin answers 404",
    "status": "model/pty.go PTYSessionStatusResponse: session_id, running, output_offset only",
}


class ReleasedSession(PtySession):
    def restarts_when_ended(self) -> bool:  # "restart"
        return True


class ReleasedConnection(WsConnection):
    """Output frames wait `lag` s (stderr twice that), as behind execd's separate stdout and stderr
    pumps, so that live stdout and stderr can cross ("live order"), and `exit` overtakes what is
    still held, then the Close, and TCP closes without waiting for the client's ("exit first")."""

    def __init__(self, *args: Any, lag: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lag = lag

    def output_delay(self, kind: int) -> float:
        return self.lag * (2 if kind == KIND_STDERR else 1)

    def send_exit(self, exit_code: int) -> None:
        self.close_after_queued(ws.encode_frame(ws.OP_TEXT, json.dumps({"type": "exit",
                                                                         "exit_code": exit_code}).encode()))


class ReleasedExecd(ExecdServer):
    takeover_allowed = False  # "no takeover"
    status_keys = ("session_id", "running", "output_offset")  # "status"
    session_class = ReleasedSession

    def __init__(self, *args: Any, release: str = RELEASES[-1], lag: float = 0.05, proxy_refusals: bool = False,
                 **kwargs: Any) -> None:
        if release not in RELEASES:
            raise ValueError(f"the released execds played are {', '.join(RELEASES)}, not {release!r}")
        super().__init__(*args, **kwargs)
        self.release = release
        self.lag = lag
        # As behind OpenSandbox's server proxy: a refused WebSocket is accepted, then closed with 1008
        # and no reason (server/opensandbox_server/api/proxy.py, _proxy_websocket_request).
        self.proxy_refusals = proxy_refusals

    def _list_sessions(self) -> tuple[int, dict[str, Any]]:  # "no list"
        raise HttpError(404, "NOT_FOUND", "404 page not found")

    def _session_command(self, command: str | None) -> str | None:  # "command ignored"
        return None

    def _connection(self, sock: socket.socket, session: PtySession) -> WsConnection:
        return ReleasedConnection(sock, session, ping_interval=self.ping_interval, idle_timeout=self.idle_timeout,
                                  close_timeout=self.close_timeout, lag=self.lag)

    def _unauthorized(self, sock: socket.socket) -> None:
        if self.proxy_refusals:
            raise HttpError(401, "UNAUTHORIZED", UNAUTHORIZED["error"])
        super()._unauthorized(sock)

    def _refused(self, sock: socket.socket, request: Request, err: HttpError) -> bool:
        if not (self.proxy_refusals and _SESSION_PATH.fullmatch(request.path) and request.path.endswith("/ws")):
            return False
        return refuse_as_proxy(sock, request)


def refuse_as_proxy(sock: socket.socket, request: Request) -> bool:
    """Accept the WebSocket, then close it with 1008 and no reason, as OpenSandbox's server proxy
    answers a WebSocket that execd refused; False when the request is no WebSocket upgrade."""
    try:
        key = _ws_key(request)
    except HttpError:
        return False
    try:
        sock.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + ws.accept_key(key).encode("ascii") + b"\r\n\r\n"
                     + ws.encode_frame(ws.OP_CLOSE, ws.close_payload(1008, "")))
    except OSError:
        pass
    _close_gently(sock)
    return True


_PROXY_PATH = re.compile(r"/proxy/(\d+)(/.*)?")


class ProxyingExecd(ReleasedExecd):
    """A released execd with its reverse proxy: a request to `/proxy/{port}/PATH` goes to
    `127.0.0.1:{port}/PATH` inside the same sandbox, WebSocket upgrades included (OpenSandbox's
    single-host networking guide: the Docker runtime's bridge mode publishes only execd's port and
    gives every endpoint as `host:published/proxy/{port}`). Played at the connection level: the
    request is sent on with its prefix taken off, then bytes are relayed both ways until one side
    closes, so the proxied execd's answers, upgrades and WebSocket frames pass unchanged. Each proxied
    request is printed (`proxied METHOD PATH`), so a test can tell what came through the proxy."""

    def _dispatch(self, sock: socket.socket, request: Request, rest: bytes) -> bool:
        match = _PROXY_PATH.fullmatch(request.path)
        if match is None:
            return super()._dispatch(sock, request, rest)
        try:
            upstream = socket.create_connection(("127.0.0.1", int(match.group(1))), timeout=10)
        except OSError as exc:
            raise HttpError(502, "BAD_GATEWAY", f"cannot reach port {match.group(1)}: {exc}") from None
        target = (match.group(2) or "/") + (f"?{urlencode(request.query)}" if request.query else "")
        head = [f"{request.method} {target} HTTP/1.1"]
        head += [f"{name}: {value}" for name, values in request.headers.items() for value in values
                 if name != "content-length"]
        if request.body or request.method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(request.body)}")
        upstream.settimeout(None)
        for each in (upstream, sock):  # relayed as they come, as Go's connections are (no Nagle's delay)
            each.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        print(f"proxied {request.method} {target}", flush=True)
        upstream.sendall("\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + request.body + rest)
        relay = threading.Thread(target=_pump, args=(sock, upstream), name="execd-proxy", daemon=True)
        relay.start()
        _pump(upstream, sock)
        relay.join(10)  # the client's side ends when it closes; it may not
        for each in (upstream, sock):
            each.close()
        return True  # the connection is finished here


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Bytes from `source` to `sink` until `source` ends; then `sink` is told no more comes."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
