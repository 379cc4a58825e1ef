"""`channel.execdws`: execd's WebSocket, shared by the `%attach` channel and the runner's pipe transport.

The sans-I/O part is fed bytes and text (frame codec, control messages, signals, connect options,
handshake errors, the close rule); the box's copy of the frame kinds is held equal to the channel's;
and the few websockets internals the close watcher relies on are each pinned by a test here, so an
upgrade of websockets that changes one fails in this file rather than as a slow close somewhere.
Both openers are also run against a peer that, like execd, answers Close but never closes TCP.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI
from websockets.http11 import Response
from websockets.protocol import State
from websockets.sync.client import ClientConnection as SyncConnection
from websockets.uri import parse_uri

from owsandbox.box.execd import ptysessions
from owsandbox.box.execd import wsframes as box_ws
from owsandbox.channel import execdws
from owsandbox.channel.endpoint import TOKEN_HEADER, ExecdEndpoint
from owsandbox.channel.errors import BadFrame, ExecdAlreadyConnected, ExecdNotFound, ExecdUnauthorized, ExecdUnreachable
from owsandbox.channel.execdws import (
    REPLAY,
    STDERR,
    STDIN,
    STDOUT,
    Connected,
    Exited,
    ServerError,
    close_handshake_done,
    decode_frame,
    encode_frame,
    parse_control,
    signal_message,
    stdin_frames,
)

from .waiting import patience

# ── one owner on each side of the wire ───────────────────────────────────────────────────────────


@pytest.mark.unit
def test_the_box_and_the_channel_agree_on_the_frame_kinds_and_the_signals():
    """The box is standard library only and cannot import the channel: its copy is held equal here."""
    assert (ptysessions.KIND_STDIN, ptysessions.KIND_STDOUT, ptysessions.KIND_STDERR, ptysessions.KIND_REPLAY) == (
        STDIN, STDOUT, STDERR, REPLAY)
    assert set(ptysessions.SIGNALS) == execdws.SIGNALS


@pytest.mark.unit
def test_the_channel_modules_name_the_same_kinds():
    from owsandbox import channel
    from owsandbox.channel import jsonlines

    assert (jsonlines.STDIN, jsonlines.STDOUT, jsonlines.STDERR, jsonlines.REPLAY) == (STDIN, STDOUT, STDERR, REPLAY)
    assert (channel.STDIN, channel.STDOUT, channel.STDERR, channel.REPLAY) == (STDIN, STDOUT, STDERR, REPLAY)


# ── frames ───────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.unit
def test_output_frames_decode_to_their_kind_and_data():
    for kind in (STDOUT, STDERR):
        frame = decode_frame(bytes([kind]) + b"hello\n")
        assert (frame.kind, frame.offset, frame.data, frame.size) == (kind, None, b"hello\n", 6)
        assert frame.message[frame.start:] == b"hello\n"
    empty = decode_frame(b"\x01")
    assert (empty.kind, empty.data, empty.size) == (STDOUT, b"", 0)


@pytest.mark.unit
def test_a_replay_frame_carries_a_big_endian_offset():
    frame = decode_frame(b"\x03" + (0x0102030405060708).to_bytes(8, "big") + b"old bytes")
    assert (frame.kind, frame.offset, frame.data, frame.start, frame.size) == (
        REPLAY, 0x0102030405060708, b"old bytes", 9, 9)
    assert decode_frame(b"\x03" + bytes(8)).offset == 0 and decode_frame(b"\x03" + bytes(8)).data == b""


@pytest.mark.unit
@pytest.mark.parametrize(("message", "says"), [
    (b"", "empty binary frame"),
    (b"\x03\x00\x00", "REPLAY frame of 3 bytes has no room"),
    (b"\x00typed", "kind 0x00, which execd never sends to a client"),
    (b"\x04", "kind 0x04"),
    (b"\xff\x01", "kind 0xff"),
])
def test_what_execd_never_sends_is_a_bad_frame(message: bytes, says: str):
    with pytest.raises(BadFrame, match=says):
        decode_frame(message)


@pytest.mark.unit
@settings(deadline=None)  # a bound in seconds fails on a loaded machine
@given(kind=st.sampled_from([STDOUT, STDERR, REPLAY]), data=st.binary(max_size=64),
       offset=st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_encode_and_decode_are_inverse(kind: int, data: bytes, offset: int):
    message = encode_frame(kind, data, offset=offset if kind == REPLAY else None)
    frame = decode_frame(message)
    assert (frame.kind, frame.data) == (kind, data)
    assert frame.offset == (offset if kind == REPLAY else None)


@pytest.mark.unit
def test_encoding_refuses_what_is_not_a_frame():
    with pytest.raises(ValueError, match="needs an offset"):
        encode_frame(REPLAY, b"x")
    with pytest.raises(ValueError, match="needs an offset"):
        encode_frame(REPLAY, b"x", offset=1 << 64)
    with pytest.raises(ValueError, match="only a REPLAY"):
        encode_frame(STDOUT, b"x", offset=0)
    with pytest.raises(ValueError, match="no frame kind 0x07"):
        encode_frame(7, b"x")


@pytest.mark.unit
def test_stdin_goes_out_in_bounded_frames_that_join_back_to_the_data():
    data = bytes(range(256)) * 10
    frames = list(stdin_frames(data, 1000))
    assert [len(frame) for frame in frames] == [1001, 1001, 561]
    assert all(frame[0] == STDIN for frame in frames)
    assert b"".join(frame[1:] for frame in frames) == data
    assert list(stdin_frames(memoryview(b"ab"), 1)) == [b"\x00a", b"\x00b"]
    assert list(stdin_frames(b"", 16)) == []
    assert encode_frame(STDIN, b"line\n") == b"\x00line\n"
    with pytest.raises(ValueError):
        list(stdin_frames(b"x", 0))


# ── control messages ─────────────────────────────────────────────────────────────────────────────


@pytest.mark.unit
def test_control_messages_are_parsed_with_execds_defaults():
    assert parse_control('{"type": "connected", "session_id": "s", "mode": "pty"}') == Connected("pty")
    assert parse_control('{"type": "connected", "mode": 3}') == Connected(None)
    assert parse_control('{"type": "exit", "exit_code": 7}') == Exited(7)
    assert parse_control('{"type": "exit"}') == Exited(-1)  # killed by a signal
    assert parse_control('{"type": "exit", "exit_code": "7"}') == Exited(-1)
    assert parse_control('{"type": "error", "code": "SESSION_GONE", "error": "gone"}') == ServerError(
        "SESSION_GONE", "gone")
    assert parse_control('{"type": "error", "message": "older execd"}') == ServerError("RUNTIME_ERROR", "older execd")
    assert parse_control('{"type": "error"}') == ServerError("RUNTIME_ERROR", "")


@pytest.mark.unit
@pytest.mark.parametrize("text", ['{"type": "pong"}', '{"type": "later"}', "{}", "[1]", '"connected"', "not json",
                                  "[" * 100_000 + "]" * 100_000])
def test_text_that_asks_nothing_of_a_client_is_ignored(text: str):
    assert parse_control(text) is None


@pytest.mark.unit
def test_signals_are_named_either_way_and_only_execds_five_go_out():
    assert json.loads(signal_message("int")) == {"type": "signal", "signal": "SIGINT"}
    assert json.loads(signal_message("SIGkill")) == {"type": "signal", "signal": "SIGKILL"}
    with pytest.raises(ValueError, match="SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM, not 'USR1'"):
        signal_message("USR1")


# ── connecting ───────────────────────────────────────────────────────────────────────────────────

ENDPOINT = ExecdEndpoint(origin="http://box:44772", headers={TOKEN_HEADER: "tok"})


@pytest.mark.unit
def test_connect_options_leave_out_what_the_installed_websockets_does_not_know():
    def old_connect(uri: str, *, additional_headers: Any = None, compression: Any = None, open_timeout: Any = None,
                    close_timeout: Any = None, max_size: Any = None, ping_interval: Any = None,
                    ping_timeout: Any = None) -> None: ...

    options = execdws.connect_options(old_connect, ENDPOINT, open_timeout=5, close_timeout=2, keepalive=20,
                                      max_size=None)
    assert options == {"additional_headers": {TOKEN_HEADER: "tok"}, "compression": None, "open_timeout": 5,
                       "close_timeout": 2, "max_size": None, "ping_interval": 20, "ping_timeout": 20}

    sync = execdws.connect_options(execdws.sync_connect, ENDPOINT, open_timeout=5, close_timeout=2, keepalive=None,
                                   max_size=None)
    assert sync["proxy"] is None  # never through HTTP(S)_PROXY (websockets ≥ 15)
    legacy = "legacy" in inspect.signature(execdws.sync_connect).parameters
    assert sync.get("legacy") is (True if legacy else None)  # websockets ≥ 17.1: a connection, no warning
    assert "legacy" not in execdws.connect_options(execdws.async_connect, ENDPOINT, open_timeout=5, close_timeout=2,
                                                   keepalive=None, max_size=1)
    assert "create_connection" not in sync  # no subclass of websockets' connections


def _refused(status: int, body: bytes) -> InvalidStatus:
    return InvalidStatus(Response(status, "Refused", Headers(), body))


@pytest.mark.unit
def test_a_refused_handshake_becomes_the_error_for_its_status():
    unauthorized = execdws.handshake_error(ENDPOINT, "/pty/s/ws", _refused(401, b'{"error": "bad token"}'))
    assert isinstance(unauthorized, ExecdUnauthorized) and unauthorized.status == 401
    assert "GET /pty/s/ws" in str(unauthorized) and "access token is wrong" in str(unauthorized)
    assert "bad token" in unauthorized.body
    assert isinstance(execdws.handshake_error(ENDPOINT, "/p", _refused(404, b"")), ExecdNotFound)
    assert isinstance(execdws.handshake_error(ENDPOINT, "/p", _refused(409, b"")), ExecdAlreadyConnected)
    lost = execdws.handshake_error(ENDPOINT, "/pty/s/ws", ConnectionRefusedError(111, "refused"))
    assert isinstance(lost, ExecdUnreachable)
    assert str(lost).startswith("cannot open the WebSocket to execd at http://box:44772 for /pty/s/ws: "
                                "ConnectionRefusedError:")
    assert issubclass(InvalidURI, execdws.HANDSHAKE_FAILURES) and issubclass(TimeoutError, execdws.HANDSHAKE_FAILURES)


def test_both_openers_raise_our_errors():
    async def refused() -> None:
        with pytest.raises(ExecdUnreachable, match="for /pty/s/ws") as caught:
            await execdws.open_async(ExecdEndpoint(unix_socket="/nonexistent/execd.sock"), "/pty/s/ws", {},
                                     open_timeout=2, keepalive=None, max_size=None)
        assert isinstance(caught.value.__cause__, OSError)

    asyncio.run(refused())
    with pytest.raises(ExecdUnreachable, match="for /pty/s/ws") as caught:
        execdws.open_sync(ExecdEndpoint(unix_socket="/nonexistent/execd.sock"), "/pty/s/ws", {}, open_timeout=2,
                          keepalive=None, max_size=None)
    assert isinstance(caught.value.__cause__, OSError)


# ── closing, and the websockets internals it relies on ───────────────────────────────────────────

SERVER_CLOSE_1000 = b"\x88\x02\x03\xe8"  # an unmasked Close frame, code 1000


@pytest.mark.unit
def test_the_close_rule_on_websockets_sans_io_protocol_when_we_close_first():
    """Pins `Protocol.close_sent` / `close_rcvd`, which `close_handshake_done` reads."""
    client = ClientProtocol(parse_uri("ws://box/pty/s/ws"), state=State.OPEN)
    assert client.close_sent is None and client.close_rcvd is None and not close_handshake_done(client)
    client.send_close(1000)
    assert client.close_sent is not None and client.close_rcvd is None and not close_handshake_done(client)
    client.receive_data(SERVER_CLOSE_1000)
    assert client.close_rcvd is not None and client.close_rcvd.code == 1000 and close_handshake_done(client)
    assert client.state is State.CLOSING  # websockets still waits for the server to close TCP


@pytest.mark.unit
def test_the_close_rule_on_websockets_sans_io_protocol_when_execd_closes_first():
    client = ClientProtocol(parse_uri("ws://box/pty/s/ws"), state=State.OPEN)
    client.receive_data(b"\x88\x0b\x0f\xa1TAKEN_OVER")  # 4001 TAKEN_OVER
    assert client.close_rcvd is not None and client.close_rcvd.code == execdws.CLOSE_TAKEN_OVER
    assert client.close_sent is not None and close_handshake_done(client)  # the answer is queued at once
    assert any(data.startswith(b"\x88") for data in client.data_to_send())
    assert client.state is State.CLOSING


class SilentCloser:
    """A WebSocket server that behaves like execd at the end: it answers a Close (or sends one first,
    with `close_first`) and then leaves TCP open until the client closes it."""

    def __init__(self, close_first: int | None = None) -> None:
        self.close_first = close_first
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closes = 0
        self.client_left = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                       if line.lower().startswith(b"sec-websocket-key:"))
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Accept: " + box_ws.accept_key(key.decode()).encode() + b"\r\n\r\n")
            if self.close_first is not None:
                conn.sendall(box_ws.encode_frame(box_ws.OP_CLOSE, box_ws.close_payload(self.close_first, "bye")))
            parser = box_ws.FrameParser()
            while data := conn.recv(65536):
                for opcode, _payload in parser.feed(data):
                    if opcode == box_ws.OP_CLOSE:
                        self.closes += 1
                        if self.close_first is None:
                            conn.sendall(box_ws.encode_frame(box_ws.OP_CLOSE, box_ws.close_payload(1000)))
            self.client_left.set()  # never closed from this side before the client did

    def endpoint(self) -> ExecdEndpoint:
        return ExecdEndpoint(origin=f"http://127.0.0.1:{self.port}")

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def peer(request: pytest.FixtureRequest) -> Iterator[SilentCloser]:
    server = SilentCloser(getattr(request, "param", None))
    yield server
    server.close()


# The close timeout is an hour here: without the watcher each close, and each stream that execd
# closed, would last it, so a test that waits for its event with a bound (stretched by the machine's
# load, never near an hour) fails then, however busy the machine is.
LONG = 3600.0
OPEN = {"open_timeout": 5.0, "keepalive": None, "max_size": None}
OPEN_LONG = {**OPEN, "close_timeout": LONG}


def test_sync_close_does_not_wait_for_the_fin_execd_never_sends(peer: SilentCloser):
    ws = execdws.open_sync(peer.endpoint(), "/pty/s/ws", {"since": "0"}, **OPEN_LONG)
    assert isinstance(ws, SyncConnection)
    closing = threading.Thread(target=ws.close, name="closing")
    closing.start()
    closing.join(patience(10))
    assert not closing.is_alive(), "close() waited for the peer to close TCP"
    assert ws.protocol.state is State.CLOSED
    assert peer.client_left.wait(patience(10)) and peer.closes == 1


@pytest.mark.parametrize("peer", [execdws.CLOSE_TAKEN_OVER], indirect=True)
def test_sync_a_close_from_execd_ends_the_stream_at_once(peer: SilentCloser):
    ws = execdws.open_sync(peer.endpoint(), "/pty/s/ws", {}, **OPEN_LONG)
    with pytest.raises(ConnectionClosed) as closed:  # not TimeoutError
        ws.recv(patience(10))
    assert closed.value.rcvd is not None and closed.value.rcvd.code == execdws.CLOSE_TAKEN_OVER
    assert peer.client_left.wait(patience(10)) and peer.closes == 1  # our answer went out before the socket closed


def test_async_close_does_not_wait_for_the_fin_execd_never_sends(peer: SilentCloser):
    async def scenario() -> None:
        ws = await execdws.open_async(peer.endpoint(), "/pty/s/ws", {"since": "0"}, **OPEN_LONG)
        assert isinstance(ws, AsyncConnection)
        await asyncio.wait_for(execdws.close_async(ws, LONG), patience(10))
        assert ws.state is State.CLOSED
        assert ws not in execdws._async_watchers  # the watcher is gone with the connection

    asyncio.run(scenario())
    assert peer.client_left.wait(patience(10)) and peer.closes == 1


@pytest.mark.parametrize("peer", [execdws.CLOSE_TAKEN_OVER], indirect=True)
def test_async_a_close_from_execd_ends_the_stream_at_once(peer: SilentCloser):
    async def scenario() -> None:
        ws = await execdws.open_async(peer.endpoint(), "/pty/s/ws", {}, **OPEN_LONG)
        with pytest.raises(ConnectionClosed) as closed:  # not TimeoutError
            await asyncio.wait_for(ws.recv(), patience(10))
        assert closed.value.rcvd is not None and closed.value.rcvd.code == execdws.CLOSE_TAKEN_OVER
        await execdws.close_async(ws, execdws.CLOSE_TIMEOUT_SECONDS)

    asyncio.run(scenario())
    assert peer.client_left.wait(patience(10)) and peer.closes == 1


def test_the_connection_attributes_the_watcher_and_the_transport_use(peer: SilentCloser):
    """Pins what execdws and wstransport use of websockets' connections beyond the documented API:
    `protocol` (both), `transport` and `close_timeout` (asyncio), `socket` and `close_socket()` (sync)."""
    ws = execdws.open_sync(peer.endpoint(), "/pty/s/ws", {}, **OPEN)
    assert isinstance(ws.protocol, ClientProtocol) and ws.protocol.state is State.OPEN
    assert isinstance(ws.socket, socket.socket)
    assert [p for p in inspect.signature(ws.close_socket).parameters.values() if p.default is p.empty] == []
    ws.close_socket()
    assert ws.protocol.state is State.CLOSED

    second = SilentCloser()
    try:
        async def scenario() -> None:
            ws = await execdws.open_async(second.endpoint(), "/pty/s/ws", {}, **OPEN)
            assert isinstance(ws.protocol, ClientProtocol) and ws.state is ws.protocol.state is State.OPEN
            assert isinstance(ws.transport, asyncio.Transport) and not ws.transport.is_closing()
            assert ws.close_timeout == execdws.CLOSE_TIMEOUT_SECONDS  # the attribute close_async sets
            await execdws.close_async(ws, execdws.CLOSE_TIMEOUT_SECONDS)

        asyncio.run(scenario())
    finally:
        second.close()
