"""execd's HTTP, without I/O: a request read from bytes as they come, and the answers' bytes.

The endpoint serves a handful of JSON calls and the WebSocket upgrade on a Unix socket or a port,
so it needs HTTP/1.1's request head, a `Content-Length` body and `Expect: 100-continue`, nothing
more; anything else is refused with a 400 that names it (`Transfer-Encoding` included). Bounded:
a head over MAX_HEAD_BYTES or a body over MAX_BODY_BYTES is refused before it is read. The reader
is fed whatever a `recv` returned, the way `wsframes` reads WebSocket frames.

`urllib.parse` (with the `ipaddress` it imports) is imported by the first request: a box whose
endpoint is never called (no `%attach`, no terminal) does not hold it.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024
REASONS = {101: "Switching Protocols", 200: "OK", 201: "Created", 400: "Bad Request", 401: "Unauthorized",
            404: "Not Found", 405: "Method Not Allowed", 409: "Conflict", 500: "Internal Server Error",
           502: "Bad Gateway", 504: "Gateway Timeout"}
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (\S+) HTTP/1\.[01]")

class HttpError(Exception):
    """An answer other than success: `status` and the JSON `body` to send."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {"code": code, "message": message}


def bad_request(message: str) -> HttpError:
    return HttpError(400, "INVALID_REQUEST", message)


class Request:
    def __init__(self, method: str, target: str, headers: dict[str, list[str]], body: bytes) -> None:
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(target)
        self.method = method
        self.path = parts.path
        self.query = {name: values[-1] for name, values in parse_qs(parts.query, keep_blank_values=True).items()}
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        """The one value of header `name` (lower case); None when absent, a 400 when repeated."""
        values = self.headers.get(name)
        if not values:
            return None
        if len(values) > 1:
            raise bad_request(f"header {name} given more than once")
        return values[0]


class RequestReader:
    """Reads one request: `feed` bytes until `request` is set; `rest` is what came after it (the first
    WebSocket frames of an upgrade). `wants_continue` turns true once when the client waits for
    `100 Continue` before its body (the caller sends it and sets it back). Raises HttpError."""

    def __init__(self) -> None:
        self.request: Request | None = None
        self.rest = b""
        self.wants_continue = False
        self.head_read = False
        self._buffer = b""
        self._head: tuple[str, str, dict[str, list[str]]] | None = None
        self._length = 0

    def feed(self, data: bytes) -> None:
        if self.request is not None:
            self.rest += data
            return
        self._buffer += data
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    raise bad_request(f"the request head is larger than {MAX_HEAD_BYTES} bytes")
                return
            if end > MAX_HEAD_BYTES:
                raise bad_request(f"the request head is larger than {MAX_HEAD_BYTES} bytes")
            self._head = _parse_head(self._buffer[:end])
            self.head_read = True
            self._length = _content_length(self._head[2])
            self._buffer = self._buffer[end + 4:]
            expect = self._head[2].get("expect", [])
            if len(self._buffer) < self._length and any(v.lower() == "100-continue" for v in expect):
                self.wants_continue = True
        if len(self._buffer) >= self._length:
            method, target, headers = self._head
            self.request = Request(method, target, headers, self._buffer[:self._length])
            self.rest = self._buffer[self._length:]
            self._buffer = b""


def _parse_head(head: bytes) -> tuple[str, str, dict[str, list[str]]]:
    lines = head.split(b"\r\n")
    match = _REQUEST_LINE.fullmatch(lines[0])
    if match is None:
        raise bad_request("a malformed request line")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise bad_request("a malformed header line")
        headers.setdefault(name.decode("ascii").lower(), []).append(value.strip(b" \t").decode("latin-1"))
    target = match.group(2).decode("latin-1")
    if not target.startswith("/"):
        raise bad_request("the request target must be a path")
    return match.group(1).decode("ascii"), target, headers


def _content_length(headers: dict[str, list[str]]) -> int:
    if "transfer-encoding" in headers:
        raise bad_request("Transfer-Encoding is not supported; send a Content-Length")
    values = headers.get("content-length", [])
    if not values:
        return 0
    if len(values) > 1 or not values[0].isdigit() or not values[0].isascii():
        raise bad_request("a malformed Content-Length")
    length = int(values[0])
    if length > MAX_BODY_BYTES:
        raise bad_request(f"a body of {length} bytes is larger than the limit of {MAX_BODY_BYTES}")
    return length


def http_response(status: int, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode("utf-8")
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + data
