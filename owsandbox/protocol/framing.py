"""The runner protocol's framing: one JSON-RPC 2.0 object per line, and the builders of each kind.

Frames are encoded as ASCII-only JSON without spaces so that no payload can ever put a raw newline
into a frame; a reader drops any line that is not a JSON object, so login banners or stray prints
from a provider never break the stream. Everything here is pure: bytes in, objects out.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import RunnerError

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024


def encode(message: dict[str, Any]) -> bytes:
    """One frame: ASCII JSON, no spaces, exactly one trailing newline."""
    return json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def decode(line: bytes) -> dict[str, Any] | None:
    """The JSON object on this line, or None for anything that is not a frame."""
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # deeply nested junk is junk too
        return None
    return value if isinstance(value, dict) else None


def request(request_id: str, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}


def notification(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params or {}}


def result(request_id: Any, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": RunnerError(code, message, data).to_json()}


_ID_NEAR_START = re.compile(rb'"id":("(?:[^"\\]|\\.){0,200}"|-?\d{1,20})')


def sniff_id(head: bytes) -> Any:
    """The request id found near the start of a frame too large to parse, so its caller still gets an
    answer. Our encoder writes `id` second, so it sits within the first few hundred bytes."""
    found = _ID_NEAR_START.search(head[:512])
    if not found:
        return None
    try:
        return json.loads(found.group(1))
    except ValueError:
        return None


class Oversize:
    """A line that was longer than the limit; its bytes were discarded, its start kept for `sniff_id`."""

    __slots__ = ("head", "size")

    def __init__(self, head: bytes, size: int) -> None:
        self.head = head
        self.size = size


class LineSplitter:
    """Cuts a byte stream into lines, never holding more than `max_line` bytes of one line.

    `feed` returns complete lines (without their newline) and `Oversize` markers for lines that
    went over the limit, in stream order. Sans-I/O: feed it whatever a read returned.
    """

    def __init__(self, max_line: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_line = max_line
        self._parts: list[bytes] = []
        self._size = 0
        self._skipping: Oversize | None = None

    def feed(self, data: bytes) -> list[bytes | Oversize]:
        out: list[bytes | Oversize] = []
        start = 0
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                self._take(data[start:])
                return out
            self._take(data[start:newline])
            if self._skipping is not None:
                out.append(self._skipping)
                self._skipping = None
            else:
                out.append(b"".join(self._parts))
            self._parts = []
            self._size = 0
            start = newline + 1

    def _take(self, chunk: bytes) -> None:
        if not chunk:
            return
        if self._skipping is not None:
            self._skipping.size += len(chunk)
            return
        if self._size + len(chunk) > self.max_line:
            head = (b"".join(self._parts) + chunk)[:512]
            self._skipping = Oversize(head, self._size + len(chunk))
            self._parts = []
            self._size = 0
            return
        self._parts.append(chunk)
        self._size += len(chunk)

    @property
    def buffered(self) -> int:
        return self._size
