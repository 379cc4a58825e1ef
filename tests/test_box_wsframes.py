"""The box's WebSocket codec, fed bytes the way a client sends them, without sockets or threads."""

from __future__ import annotations

import base64
import os
import struct

import pytest

from owsandbox.box.execd import wsframes as ws

pytestmark = pytest.mark.unit

MASK = b"\x37\xfa\x21\x3d"


def client_frame(opcode: int, payload: bytes = b"", fin: bool = True) -> bytes:
    return ws.encode_frame(opcode, payload, fin=fin, mask=MASK)


def test_accept_key_is_the_one_from_the_rfc():
    assert ws.accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_a_masked_text_frame_from_the_rfc_is_unmasked():
    frame = bytes.fromhex("818537fa213d7f9f4d5158")  # RFC 6455 §5.7: a masked "Hello"
    assert ws.FrameParser().feed(frame) == [(ws.OP_TEXT, b"Hello")]
    assert client_frame(ws.OP_TEXT, b"Hello") == frame


@pytest.mark.parametrize("size, header_bytes", [(0, 2), (125, 2), (126, 4), (65535, 4), (65536, 10)])
def test_each_length_encoding_round_trips(size: int, header_bytes: int):
    payload = os.urandom(size)
    server = ws.encode_frame(ws.OP_BINARY, payload)
    assert len(server) == header_bytes + size  # server frames carry no mask
    assert server[1] & 0x80 == 0
    frame = client_frame(ws.OP_BINARY, payload)
    assert len(frame) == header_bytes + 4 + size
    assert ws.FrameParser().feed(frame) == [(ws.OP_BINARY, payload)]
    assert ws.FrameParser(require_mask=False).feed(server) == [(ws.OP_BINARY, payload)]


def test_a_frame_fed_one_byte_at_a_time_comes_out_once_whole():
    frame = client_frame(ws.OP_BINARY, b"x" * 300)
    parser = ws.FrameParser()
    messages = []
    for i in range(len(frame)):
        messages += parser.feed(frame[i : i + 1])
    assert messages == [(ws.OP_BINARY, b"x" * 300)]


def test_several_frames_in_one_read_all_come_out_in_order():
    data = client_frame(ws.OP_TEXT, b"one") + client_frame(ws.OP_BINARY, b"\x00two") + client_frame(ws.OP_PING, b"p")
    assert ws.FrameParser().feed(data) == [(ws.OP_TEXT, b"one"), (ws.OP_BINARY, b"\x00two"), (ws.OP_PING, b"p")]


def test_fragments_are_joined_and_control_frames_may_come_between_them():
    parser = ws.FrameParser()
    assert parser.feed(client_frame(ws.OP_TEXT, b"hel", fin=False)) == []
    assert parser.feed(client_frame(ws.OP_PING, b"are you there")) == [(ws.OP_PING, b"are you there")]
    assert parser.feed(client_frame(ws.OP_CONTINUATION, b"lo ", fin=False)) == []
    assert parser.feed(client_frame(ws.OP_PONG)) == [(ws.OP_PONG, b"")]
    assert parser.feed(client_frame(ws.OP_CONTINUATION, "wörld".encode())) == [(ws.OP_TEXT, "hello wörld".encode())]
    assert parser.feed(client_frame(ws.OP_BINARY, b"next")) == [(ws.OP_BINARY, b"next")]


def test_a_utf8_character_split_across_fragments_is_fine():
    encoded = "é".encode()
    data = client_frame(ws.OP_TEXT, encoded[:1], fin=False) + client_frame(ws.OP_CONTINUATION, encoded[1:])
    assert ws.FrameParser().feed(data) == [(ws.OP_TEXT, encoded)]


@pytest.mark.parametrize("data, code", [
    (ws.encode_frame(ws.OP_TEXT, b"not masked"), 1002),
    (client_frame(ws.OP_CONTINUATION, b"nothing to continue"), 1002),
    (client_frame(ws.OP_TEXT, b"a", fin=False) + client_frame(ws.OP_TEXT, b"b"), 1002),
    (client_frame(ws.OP_PING, b"x" * 126), 1002),
    (client_frame(ws.OP_PING, b"x", fin=False), 1002),
    (bytes([0x80 | 0x40 | ws.OP_TEXT]) + client_frame(ws.OP_TEXT, b"x")[1:], 1002),  # RSV1 without extension
    (bytes([0x83]) + client_frame(ws.OP_TEXT, b"x")[1:], 1002),  # opcode 3 is reserved
    (client_frame(ws.OP_TEXT, b"\xff\xfe"), 1007),
    (bytes([0x82, 0xFF]) + struct.pack("!Q", 1 << 63) + MASK, 1002),
])
def test_protocol_violations_are_refused_with_their_close_code(data: bytes, code: int):
    with pytest.raises(ws.ProtocolError) as caught:
        ws.FrameParser().feed(data)
    assert caught.value.code == code


def test_an_oversize_message_is_refused_from_its_header_before_its_payload_arrives():
    parser = ws.FrameParser(max_message=1000)
    header = client_frame(ws.OP_BINARY, b"x" * 1001)[:8]  # 2 + 2 length bytes + 4 mask bytes
    with pytest.raises(ws.ProtocolError) as caught:
        parser.feed(header)
    assert caught.value.code == ws.CLOSE_TOO_BIG
    assert ws.FrameParser(max_message=1000).feed(client_frame(ws.OP_BINARY, b"x" * 1000)) == [
        (ws.OP_BINARY, b"x" * 1000)]


def test_fragments_count_together_against_the_limit():
    parser = ws.FrameParser(max_message=1000)
    assert parser.feed(client_frame(ws.OP_BINARY, b"x" * 600, fin=False)) == []
    with pytest.raises(ws.ProtocolError) as caught:
        parser.feed(client_frame(ws.OP_CONTINUATION, b"x" * 401))
    assert caught.value.code == ws.CLOSE_TOO_BIG


def test_the_default_limit_is_four_mebibytes():
    parser = ws.FrameParser()
    assert parser.max_message == 4 * 1024 * 1024
    with pytest.raises(ws.ProtocolError):
        parser.feed(bytes([0x82, 0xFF]) + struct.pack("!Q", 4 * 1024 * 1024 + 1) + MASK)


def test_close_payloads_round_trip():
    assert ws.parse_close(ws.close_payload(1000, "process exited")) == (1000, "process exited")
    assert ws.parse_close(ws.close_payload(4001, "TAKEN_OVER")) == (4001, "TAKEN_OVER")
    assert ws.close_payload(1001) == b"\x03\xe9"
    assert ws.parse_close(b"") == (ws.CLOSE_NO_STATUS, "")


def test_a_long_close_reason_is_cut_to_fit_a_control_frame_without_breaking_a_character():
    payload = ws.close_payload(1000, "é" * 100)
    assert len(payload) <= 125
    code, reason = ws.parse_close(payload)
    assert code == 1000 and set(reason) == {"é"}
    assert ws.FrameParser(require_mask=False).feed(ws.encode_frame(ws.OP_CLOSE, payload)) == [(ws.OP_CLOSE, payload)]


@pytest.mark.parametrize("payload", [b"\x03", b"\x03\xed", b"\x03\xee", b"\x00\x10", b"\x13\x88", b"\x03\xe8\xff"])
def test_bad_close_payloads_are_refused(payload: bytes):
    with pytest.raises(ws.ProtocolError):
        ws.parse_close(payload)


def test_masking_is_its_own_inverse():
    data = os.urandom(1001)
    assert ws.apply_mask(ws.apply_mask(data, MASK), MASK) == data
    assert ws.apply_mask(b"", MASK) == b""
    assert base64.b64decode(ws.accept_key(base64.b64encode(os.urandom(16)).decode()))  # 20 bytes of SHA-1
