"""execd's HTTP control calls for PTY sessions: create, status, delete, list.

Standard library only (`http.client`), one short connection per call, blocking: these calls are
rare and small. From asyncio code run them in a thread (`await asyncio.to_thread(control.delete,
sid)`), which is what the channel does. Every answer that is not the expected one becomes an
`ExecdHTTPError` naming the method, the path, the status and the body, so a failure in a notebook
says what execd actually said.
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any
from urllib.parse import quote, urlsplit

from .endpoint import UNIX_HOST, ExecdEndpoint
from .errors import (
    ExecdAlreadyConnected,
    ExecdError,
    ExecdHTTPError,
    ExecdNotFound,
    ExecdUnauthorized,
    ExecdUnreachable,
    ExecdUnsupported,
)

DEFAULT_TIMEOUT_SECONDS = 30.0


class UnixHTTPConnection(http.client.HTTPConnection):
    """An `HTTPConnection` whose socket is a Unix socket at `path` (the Host header is nominal)."""

    def __init__(self, path: str, timeout: float | None = DEFAULT_TIMEOUT_SECONDS) -> None:
        super().__init__(UNIX_HOST, timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def session_path(session_id: str, suffix: str = "") -> str:
    """`/pty/{id}{suffix}` with the id quoted, so an odd id cannot change the path."""
    return f"/pty/{quote(session_id, safe='')}{suffix}"


class ExecdControl:
    """Blocking HTTP calls to execd's `/pty` API at one endpoint."""

    def __init__(self, endpoint: ExecdEndpoint, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.endpoint = endpoint
        self.timeout = timeout

    def create(self, cwd: str | None = None, command: str | None = None) -> str:
        """POST /pty: a new session (nothing runs until the first WebSocket); its id.

        `command` is honoured only by execd's main branch and the box's own endpoint: every released
        execd (v1.0.10 to v1.0.18, `model/pty.go`) decodes `cwd` alone and runs a bare bash. The
        clients here leave it out and send `execdws.start_line(command)` as the first stdin instead."""
        body: dict[str, str] = {}
        if cwd is not None:
            body["cwd"] = cwd
        if command is not None:
            body["command"] = command
        answer = self._json("POST", "/pty", body, expect=(201,))
        session_id = answer.get("session_id") if isinstance(answer, dict) else None
        if not isinstance(session_id, str) or not session_id:
            raise ExecdError(f"execd answered POST /pty without a session_id: {answer!r}")
        return session_id

    def status(self, session_id: str) -> dict[str, Any]:
        """GET /pty/{id}: `{"session_id", "running", "output_offset"}`; `ExecdNotFound` if unknown."""
        answer = self._json("GET", session_path(session_id), expect=(200,))
        if not isinstance(answer, dict):
            raise ExecdError(f"execd answered GET {session_path(session_id)} with a non-object: {answer!r}")
        return answer

    def delete(self, session_id: str) -> bool:
        """DELETE /pty/{id}: kills the process group. True when deleted, False when already gone (404)."""
        try:
            self._request("DELETE", session_path(session_id), expect=(200, 204))
        except ExecdNotFound:
            return False
        return True

    def list_sessions(self) -> list[dict[str, Any]]:
        """GET /pty: the sessions execd holds. An owsandbox extension: OpenSandbox's execd has no such
        call and answers 404/405, which raises `ExecdUnsupported`."""
        try:
            answer = self._json("GET", "/pty", expect=(200,))
        except (ExecdNotFound, ExecdUnsupported) as exc:
            raise ExecdUnsupported(exc.method, exc.path, exc.status, exc.body,
                                   "this execd cannot list its PTY sessions") from None
        sessions = answer.get("sessions") if isinstance(answer, dict) else answer
        if not isinstance(sessions, list):
            raise ExecdError(f"execd answered GET /pty with something that is not a list of sessions: {answer!r}")
        return sessions

    # ── plumbing ─────────────────────────────────────────────────────────────────────────────────

    def _json(self, method: str, path: str, body: Any = None, *, expect: tuple[int, ...]) -> Any:
        raw = self._request(method, path, body, expect=expect)
        try:
            return json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            raise ExecdError(f"execd answered {method} {path} with a body that is not JSON: {raw[:200]!r}") from None

    def _connection(self) -> http.client.HTTPConnection:
        if self.endpoint.unix_socket is not None:
            return UnixHTTPConnection(self.endpoint.unix_socket, timeout=self.timeout)
        parts = urlsplit(self.endpoint.origin)
        if parts.scheme == "https":
            return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=self.timeout)
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.timeout)

    def _request(self, method: str, path: str, body: Any = None, *, expect: tuple[int, ...]) -> bytes:
        headers = dict(self.endpoint.headers)
        # An empty body rather than none: http.client then sends `Content-Length: 0` with a DELETE too.
        # OpenSandbox's server proxy streams every DELETE's body on, chunked unless a length came with
        # it, and an execd that takes no chunked body (the box's own) would refuse it (400).
        payload = b"" if method == "DELETE" else None
        if body is not None:
            payload = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        target = self.endpoint.http_path(path)
        connection = self._connection()
        try:
            connection.request(method, target, body=payload, headers=headers)
            response = connection.getresponse()
            status, raw = response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ExecdUnreachable(f"cannot reach execd at {self.endpoint.describe()} for {method} {path}: "
                                   f"{type(exc).__name__}: {exc}") from exc
        finally:
            connection.close()
        if status in expect:
            return raw
        raise http_error(method, path, status, raw, has_token=self.endpoint.has_token)


def refused_through_proxy(control: ExecdControl, session_id: str) -> ExecdError:
    """The error for a WebSocket that was accepted and then closed with 1008 before execd's
    `connected`: OpenSandbox's server proxies the WebSocket by accepting the client first and then
    opening its own to execd; when execd refuses that one (401, 404, 409) the client only gets Close
    1008 with no reason (server/opensandbox_server/api/proxy.py, `_proxy_websocket_request`). The
    session's status says which refusal it was: 401 and 404 come back as themselves, and a session
    that exists was refused as held by another client (409)."""
    path = session_path(session_id, "/ws")
    try:
        control.status(session_id)
    except ExecdHTTPError as error:
        return error
    except ExecdError as error:
        return ExecdUnreachable(f"the WebSocket to {path} was closed with 1008 (refused behind a proxy), "
                                f"and the session's status is unknown: {error}")
    return ExecdAlreadyConnected("GET", path, 409, b"",
                                 "another client is attached to this session (the OpenSandbox server's proxy "
                                 "closed the WebSocket with 1008: execd refused it). Released execds (up to "
                                 "v1.0.18) cannot take a session over")


def http_error(method: str, path: str, status: int, body: bytes, *, has_token: bool) -> ExecdHTTPError:
    """The error for an unexpected answer, of the kind its status means (shared with the WebSocket)."""
    if status == 401:
        hint = ("the access token is wrong" if has_token else
                "the access token is missing: set OWSANDBOX_EXECD_TOKEN")
        return ExecdUnauthorized(method, path, status, body, f"{hint}; it goes in header X-EXECD-ACCESS-TOKEN")
    if status == 404:
        return ExecdNotFound(method, path, status, body, "no such session")
    if status == 405:
        return ExecdUnsupported(method, path, status, body, "method not allowed")
    if status == 409:
        return ExecdAlreadyConnected(method, path, status, body,
                                     "another client is attached to this session. Released execds (up to "
                                     "v1.0.18) cannot take a session over: a client that vanished without "
                                     "closing keeps its hold until execd's 60 s read deadline ends")
    return ExecdHTTPError(method, path, status, body)
