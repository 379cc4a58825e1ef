"""A sans-I/O WebSocket (RFC 6455) codec for the server side of the execd-compatible endpoint.

The box may import nothing but the standard library, so it cannot use `websockets`; and a codec that
is only fed bytes and hands back messages can be tested exhaustively without sockets or threads (the
approach of `websockets` and `h11`). The parser is strict where the RFC says a server must be:
client frames must be masked, reserved bits and opcodes are refused (no extension is ever
negotiated), control frames are short and unfragmented, text is UTF-8, and a message may not grow
past a size limit, which is checked against the declared length before any payload is buffered.
"""

from __future__ import annotations

import struct

OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA
_DATA_OPCODES = {OP_TEXT, OP_BINARY}
_CONTROL_OPCODES = {OP_CLOSE, OP_PING, OP_PONG}

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_NO_STATUS = 1005  # reported for an empty close payload; never sent
CLOSE_INVALID_DATA = 1007
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL_ERROR = 1011

DEFAULT_MAX_MESSAGE = 4 * 1024 * 1024
_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_MAX_CONTROL_PAYLOAD = 125


class ProtocolError(Exception):
    """The peer broke RFC 6455; `code` is the close code to fail the connection with."""

    def __init__(self, message: str, code: int = CLOSE_PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


def accept_key(key: str) -> str:
    """The `Sec-WebSocket-Accept` value answering a client's `Sec-WebSocket-Key`."""
    import base64
    import hashlib  # here, not at the top: it loads OpenSSL, which an idle daemon has no use for

    digest = hashlib.sha1((key + _GUID).encode("ascii"), usedforsecurity=False).digest()
    return base64.b64encode(digest).decode("ascii")


def apply_mask(payload: bytes, mask: bytes) -> bytes:
    """XOR `payload` with the 4-byte `mask` (masking and unmasking are the same operation)."""
    n = len(payload)
    if n == 0:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def encode_frame(opcode: int, payload: bytes = b"", *, fin: bool = True, mask: bytes | None = None) -> bytes:
    """One frame. Servers send unmasked frames; `mask` (4 bytes) is for clients, i.e. for tests."""
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    mask_bit = 0x80 if mask is not None else 0
    if n < 126:
        header = struct.pack("!BB", first, mask_bit | n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", first, mask_bit | 126, n)
    else:
        header = struct.pack("!BBQ", first, mask_bit | 127, n)
    if mask is None:
        return header + payload
    if len(mask) != 4:
        raise ValueError("a mask is 4 bytes")
    return header + mask + apply_mask(payload, mask)


def close_payload(code: int, reason: str = "") -> bytes:
    """The payload of a Close frame; the reason is cut to fit a control frame (UTF-8 kept whole)."""
    raw = reason.encode("utf-8")[: _MAX_CONTROL_PAYLOAD - 2]
    return struct.pack("!H", code) + raw.decode("utf-8", "ignore").encode("utf-8")


def _valid_close_code(code: int) -> bool:
    return 3000 <= code <= 4999 or (1000 <= code <= 1014 and code not in (1004, 1005, 1006))


def parse_close(payload: bytes) -> tuple[int, str]:
    """(code, reason) of a Close frame; an empty payload is (1005, "")."""
    if not payload:
        return CLOSE_NO_STATUS, ""
    if len(payload) == 1:
        raise ProtocolError("a close payload of one byte")
    (code,) = struct.unpack("!H", payload[:2])
    if not _valid_close_code(code):
        raise ProtocolError(f"invalid close code {code}")
    try:
        reason = payload[2:].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("the close reason is not UTF-8", CLOSE_INVALID_DATA) from None
    return code, reason


class FrameParser:
    """Fed the bytes a client sends; returns complete messages as (opcode, payload).

    Fragments are joined into one message; control frames (ping, pong, close) are returned as they
    come, also between the fragments of a message. Any violation raises `ProtocolError`, after
    which the parser must not be fed again.
    """

    def __init__(self, max_message: int = DEFAULT_MAX_MESSAGE, require_mask: bool = True) -> None:
        self.max_message = max_message
        self.require_mask = require_mask
        self._buffer = bytearray()
        self._fragments: list[bytes] = []
        self._fragment_opcode: int | None = None
        self._fragment_size = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buffer += data
        messages: list[tuple[int, bytes]] = []
        while True:
            frame = self._next_frame()
            if frame is None:
                return messages
            message = self._on_frame(*frame)
            if message is not None:
                messages.append(message)

    def _next_frame(self) -> tuple[bool, int, bytes] | None:
        """(fin, opcode, unmasked payload) of the first whole frame in the buffer, taken out of it."""
        buf = self._buffer
        if len(buf) < 2:
            return None
        first, second = buf[0], buf[1]
        fin, opcode, masked, length = bool(first & 0x80), first & 0x0F, bool(second & 0x80), second & 0x7F
        self._check_header(first, opcode, masked, fin, length)
        pos = 2
        if length == 126:
            if len(buf) < 4:
                return None
            (length,) = struct.unpack_from("!H", buf, 2)
            pos = 4
        elif length == 127:
            if len(buf) < 10:
                return None
            (length,) = struct.unpack_from("!Q", buf, 2)
            if length >> 63:
                raise ProtocolError("a 64-bit length with its top bit set")
            pos = 10
        self._check_size(opcode, length)
        mask = b""
        if masked:
            if len(buf) < pos + 4:
                return None
            mask = bytes(buf[pos : pos + 4])
            pos += 4
        if len(buf) < pos + length:
            return None
        payload = bytes(buf[pos : pos + length])
        del buf[: pos + length]
        return fin, opcode, apply_mask(payload, mask) if masked else payload

    def _check_header(self, first: int, opcode: int, masked: bool, fin: bool, length: int) -> None:
        if first & 0x70:
            raise ProtocolError("reserved bits set, but no extension was negotiated")
        if opcode not in _DATA_OPCODES and opcode not in _CONTROL_OPCODES and opcode != OP_CONTINUATION:
            raise ProtocolError(f"unknown opcode {opcode:#x}")
        if self.require_mask and not masked:
            raise ProtocolError("a client frame that is not masked")
        if opcode in _CONTROL_OPCODES and (not fin or length > _MAX_CONTROL_PAYLOAD):
            raise ProtocolError("a control frame that is fragmented or longer than 125 bytes")

    def _check_size(self, opcode: int, length: int) -> None:
        if opcode in _CONTROL_OPCODES:
            return
        size = length + (self._fragment_size if opcode == OP_CONTINUATION else 0)
        if size > self.max_message:
            raise ProtocolError(f"a message of more than {self.max_message} bytes", CLOSE_TOO_BIG)

    def _on_frame(self, fin: bool, opcode: int, payload: bytes) -> tuple[int, bytes] | None:
        if opcode in _CONTROL_OPCODES:
            return opcode, payload
        if opcode == OP_CONTINUATION:
            if self._fragment_opcode is None:
                raise ProtocolError("a continuation frame with no message to continue")
        elif self._fragment_opcode is not None:
            raise ProtocolError("a new message before the fragmented one was finished")
        else:
            self._fragment_opcode = opcode
        self._fragments.append(payload)
        self._fragment_size += len(payload)
        if not fin:
            return None
        message_opcode = self._fragment_opcode
        data = b"".join(self._fragments)
        self._fragments, self._fragment_opcode, self._fragment_size = [], None, 0
        if message_opcode == OP_TEXT:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError("a text message that is not UTF-8", CLOSE_INVALID_DATA) from None
        return message_opcode, data
