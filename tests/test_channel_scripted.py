"""The channel against a scripted execd: a real socket server speaking hand-made HTTP and WebSocket frames.

The peer behaves the way execd does where it matters to a client: it answers a Close with its own
and then leaves the TCP connection open (or, when told, never answers at all), keeps every output
byte in a ring with one counter for stdout and stderr, replays from `since` before `connected`,
refuses a second client without `takeover=1` and closes the old one with 4001 when asked to take
over, and sends `exit` then Close when the program ends. The program behind it is scripted by each
test: it writes records, stderr, echoes what it reads, and exits when told.

pytest-asyncio is not used: each test is a coroutine run by `run()` with a hard time limit.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import os
import tempfile
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from owsandbox.channel import channel as channel_module
from owsandbox.channel.channel import ExecdJsonLineChannel
from owsandbox.channel.control import ExecdControl
from owsandbox.channel.endpoint import TOKEN_HEADER, ExecdEndpoint
from owsandbox.channel.errors import (
    BadRecord,
    ChannelDetached,
    ChannelTakenOver,
    ExecdAlreadyConnected,
    ExecdError,
    ExecdNotFound,
    ExecdServerError,
    ExecdUnauthorized,
    ExecdUnreachable,
    ExecdUnsupported,
    ProgramExited,
    ReplayGap,
)

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x1, 0x2, 0x8, 0x9, 0xA


def run(test: Coroutine[Any, Any, None], limit: float = 30.0) -> None:
    asyncio.run(asyncio.wait_for(test, limit))


def ws_frame(opcode: int, payload: bytes) -> bytes:
    """A server frame: final, unmasked."""
    size = len(payload)
    if size < 126:
        head = bytes([0x80 | opcode, size])
    elif size < 1 << 16:
        head = bytes([0x80 | opcode, 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 127]) + size.to_bytes(8, "big")
    return head + payload


def close_frame(code: int, reason: str = "") -> bytes:
    return ws_frame(OP_CLOSE, code.to_bytes(2, "big") + reason.encode())


async def read_ws_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    first, second = await reader.readexactly(2)
    size = second & 0x7F
    if size == 126:
        size = int.from_bytes(await reader.readexactly(2), "big")
    elif size == 127:
        size = int.from_bytes(await reader.readexactly(8), "big")
    mask = await reader.readexactly(4) if second & 0x80 else b"\0\0\0\0"
    payload = await reader.readexactly(size)
    return first & 0x0F, bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))


# ── the scripted execd ─────────────────────────────────────────────────────────────────────────


class Program:
    """One session's program, driven by the test. Output goes to the ring and to the attached client."""

    def __init__(self, session_id: str, ring_bytes: int) -> None:
        self.session_id = session_id
        self.ring_bytes = ring_bytes
        self.output = bytearray()  # everything ever written; the ring is its last ring_bytes
        self.client: PeerConnection | None = None
        self.started = False
        self.exit_code: int | None = None
        self.echo = True
        self.stdin = bytearray()
        self.signals: list[str] = []
        self.changed = asyncio.Event()
        self.counter = itertools.count(1)

    @property
    def total(self) -> int:
        return len(self.output)

    @property
    def oldest(self) -> int:
        return max(0, self.total - self.ring_bytes)

    def write(self, kind: int, data: bytes) -> None:
        self.output += data
        self.changed.set()
        if self.client is not None:
            self.client.send(ws_frame(OP_BINARY, bytes([kind]) + data))

    def record(self, value: dict[str, Any]) -> None:
        self.write(0x01, json.dumps(value).encode() + b"\n")

    def exit(self, code: int) -> None:
        self.exit_code = code
        if self.client is not None:
            self.client.send(ws_frame(OP_TEXT, json.dumps({"type": "exit", "exit_code": code}).encode()))
            self.client.send(close_frame(1000, "process exited"))

    async def produce(self, every: float = 0.01) -> None:
        """Like a long-running program: a record every `every` seconds, attached or not."""
        while self.exit_code is None:
            self.record({"n": next(self.counter)})
            await asyncio.sleep(every)

    def on_stdin(self, data: bytes) -> None:
        self.stdin += data
        while self.echo and b"\n" in self.stdin:
            text, _, rest = bytes(self.stdin).partition(b"\n")
            self.stdin[:] = rest
            self.record({"echo": json.loads(text)})
        self.changed.set()


class PeerConnection:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.closes_received = 0
        self.ended = asyncio.Event()  # the client closed TCP (or reset it)

    def send(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)


class ScriptedExecd:
    def __init__(self, *, token: str | None = None, answer_close: bool = True, ring_bytes: int = 1 << 20) -> None:
        self.token = token
        self.answer_close = answer_close
        self.ring_bytes = ring_bytes
        self.programs: dict[str, Program] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.connections: list[PeerConnection] = []
        self._ids = itertools.count(1)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._folder: str | None = None

    async def start(self, *, unix: bool = False) -> ExecdEndpoint:
        headers = {TOKEN_HEADER: self.token} if self.token else {}
        if unix:
            self._folder = tempfile.mkdtemp(prefix="execd-peer-")
            path = os.path.join(self._folder, "execd.sock")
            self._server = await asyncio.start_unix_server(self._serve, path)
            return ExecdEndpoint(unix_socket=path, headers=headers)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return ExecdEndpoint(origin=f"http://127.0.0.1:{port}", headers=headers)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for connection in self.connections:
            connection.writer.close()
        assert self._server is not None
        self._server.close()
        if self._folder is not None:
            for name in os.listdir(self._folder):
                os.unlink(os.path.join(self._folder, name))
            os.rmdir(self._folder)

    def program(self, *, producing: bool = False) -> Program:
        session_id = f"pty-{next(self._ids)}"
        program = self.programs[session_id] = Program(session_id, self.ring_bytes)
        if producing:
            self.spawn(program.produce())
        return program

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # HTTP, one request per connection, or an upgrade

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _ = request_line.split(" ")
        headers = {name.strip().lower(): value.strip() for name, _, value in
                   (line.partition(":") for line in header_lines if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append((method, target, headers))
        parts = urlsplit(target)
        query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        if self.token is not None and headers.get(TOKEN_HEADER.lower()) != self.token:
            return self._answer(writer, 401, {"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"})
        pieces = parts.path.strip("/").split("/")
        if pieces == ["pty"] and method == "POST":
            program = self.program()
            program.created_with = json.loads(body or b"{}")  # type: ignore[attr-defined]
            return self._answer(writer, 201, {"session_id": program.session_id})
        if pieces == ["pty"]:
            return self._answer(writer, 405, {"code": "METHOD_NOT_ALLOWED", "message": "like OpenSandbox's execd"})
        program = self.programs.get(pieces[1]) if len(pieces) >= 2 and pieces[0] == "pty" else None
        if program is None:
            return self._answer(writer, 404, {"code": "NOT_FOUND", "message": f"no session {parts.path}"})
        if len(pieces) == 2 and method == "GET":
            return self._answer(writer, 200, {"session_id": program.session_id, "running": program.exit_code is None,
                                              "output_offset": program.total})
        if len(pieces) == 2 and method == "DELETE":
            del self.programs[program.session_id]
            program.exit_code = -1
            return self._answer(writer, 200, {})
        if pieces[2:] == ["ws"]:
            return await self._websocket(program, query, headers, reader, writer)
        return self._answer(writer, 404, {"code": "NOT_FOUND", "message": parts.path})

    def _answer(self, writer: asyncio.StreamWriter, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + data)
        writer.close()

    async def _websocket(self, program: Program, query: dict[str, str], headers: dict[str, str],
                         reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if program.client is not None and query.get("takeover") != "1":
            return self._answer(writer, 409, {"code": "ALREADY_CONNECTED", "message": "someone is attached"})
        accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + WS_GUID).digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        connection = PeerConnection(writer)
        self.connections.append(connection)
        since = int(query.get("since", "0"))
        if since < program.total:  # REPLAY comes before `connected`, as execd sends it
            start = max(since, program.oldest)
            connection.send(ws_frame(OP_BINARY, b"\x03" + start.to_bytes(8, "big") + bytes(program.output[start:])))
        mode = "pipe" if query.get("pty") == "0" else "pty"
        connection.send(ws_frame(OP_TEXT, json.dumps({"type": "connected", "session_id": program.session_id,
                                                      "mode": mode}).encode()))
        old, program.client, program.started = program.client, connection, True
        if old is not None:
            old.send(close_frame(4001, "TAKEN_OVER"))
        try:
            while True:
                opcode, payload = await read_ws_frame(reader)
                if opcode == OP_CLOSE:
                    connection.closes_received += 1
                    if program.client is connection:
                        program.client = None
                    if self.answer_close:
                        connection.send(ws_frame(OP_CLOSE, payload))  # and, like execd, TCP stays open
                elif opcode == OP_PING:
                    connection.send(ws_frame(OP_PONG, payload))
                elif opcode == OP_BINARY and payload[:1] == b"\x00":
                    program.on_stdin(payload[1:])
                elif opcode == OP_TEXT:
                    message = json.loads(payload)
                    if message.get("type") == "signal":
                        program.signals.append(message["signal"])
                        program.changed.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if program.client is connection:
                program.client = None
            connection.ended.set()
            writer.close()


# ── what the adapter sees ──────────────────────────────────────────────────────────────────────


class Adapter:
    """The records, stderr and failures an adapter would get, with awaitable conditions on them."""

    def __init__(self) -> None:
        self.records: list[tuple[dict[str, Any], int]] = []
        self.stderr: list[str] = []
        self.failures: list[BaseException] = []
        self._changed = asyncio.Condition()

    async def on_record(self, value: dict[str, Any], offset: int) -> None:
        self.records.append((value, offset))
        await self._notify()

    async def on_stderr(self, text: str) -> None:
        self.stderr.append(text)
        await self._notify()

    async def on_failure(self, exc: BaseException) -> None:
        self.failures.append(exc)
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    def values(self) -> list[dict[str, Any]]:
        return [value for value, _ in self.records]

    def channel(self, endpoint: ExecdEndpoint, session_id: str, **options: Any) -> ExecdJsonLineChannel:
        return ExecdJsonLineChannel(endpoint, session_id=session_id, on_record=self.on_record,
                                    on_failure=self.on_failure, on_stderr=self.on_stderr, label="tool", **options)


def with_peer(test: Callable[..., Awaitable[None]], **options: Any) -> Callable[[], None]:
    """A sync test that runs `test(peer, endpoint)` against a fresh scripted execd."""
    unix = options.pop("unix", False)

    def wrapper() -> None:
        async def body() -> None:
            peer = ScriptedExecd(**options)
            endpoint = await peer.start(unix=unix)
            try:
                await test(peer, endpoint)
            finally:
                await peer.stop()
        run(body())

    wrapper.__name__ = test.__name__
    return wrapper


# ── reading ────────────────────────────────────────────────────────────────────────────────────


async def _records_flow_with_offsets(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program()
    adapter = Adapter()
    channel = adapter.channel(endpoint, program.session_id)
    await channel.connect()
    assert channel.is_connected and channel.mode == "pipe"
    program.record({"n": 1})
    program.write(0x02, b"a warning\n")
    program.record({"n": 2})
    await adapter.until(lambda: len(adapter.records) == 2)
    assert adapter.records == [({"n": 1}, 9), ({"n": 2}, 9 + 10 + 9)]
    assert adapter.stderr == ["a warning\n"] and channel.stderr_tail == "a warning\n"
    assert channel.cursor == program.total == 28
    method, target, headers = peer.requests[-1]
    assert (method, urlsplit(target).path) == ("GET", f"/pty/{program.session_id}/ws")
    assert parse_qs(urlsplit(target).query) == {"pty": ["0"], "since": ["0"], "takeover": ["1"]}
    assert headers[TOKEN_HEADER.lower()] == "sesame"
    await channel.detach()


test_records_flow_with_offsets_that_count_stderr = with_peer(_records_flow_with_offsets, token="sesame")


async def _replay_comes_before_connect_returns(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program()
    for n in range(5):
        program.record({"n": n})
    adapter = Adapter()
    channel = adapter.channel(endpoint, program.session_id)
    await channel.connect(since=9)
    assert adapter.values() == [{"n": n} for n in range(1, 5)]
    assert adapter.records[0][1] == 18 and channel.cursor == program.total
    await channel.detach()


test_a_replay_before_connected_is_delivered_before_connect_returns = with_peer(_replay_comes_before_connect_returns)


async def _lost_window_is_loud(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program()
    for n in range(20):
        program.record({"n": n})  # 9-10 bytes each, far more than the 64-byte ring
    adapter = Adapter()
    channel = adapter.channel(endpoint, program.session_id)
    with pytest.raises(ReplayGap, match=f"requested=0 available={program.oldest}"):
        await channel.connect(since=0)
    assert adapter.records == []
    assert len(adapter.failures) == 1 and isinstance(adapter.failures[0], ReplayGap)
    assert isinstance(channel.fatal, ReplayGap) and not channel.is_connected
    with pytest.raises(ChannelDetached, match="has failed"):
        await channel.connect(since=program.oldest)


test_a_lost_replay_window_fails_the_connect_loudly = with_peer(_lost_window_is_loud, ring_bytes=64)


async def _bad_stdout_fails_after_the_good_records(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program()
    adapter = Adapter()
    channel = adapter.channel(endpoint, program.session_id)
    waiting = None
    await channel.connect()
    waiting = channel.register_request(7)
    program.write(0x01, b'{"n": 1}\nSegmentation fault\n{"n": 2}\n')
    await adapter.until(lambda: bool(adapter.failures))
    assert adapter.values() == [{"n": 1}]
    assert isinstance(adapter.failures[0], BadRecord) and "non-JSON stdout at offset 28" in str(adapter.failures[0])
    with pytest.raises(BadRecord):
        await waiting
    assert not channel.is_connected


test_non_json_stdout_fails_after_delivering_the_records_before_it = with_peer(_bad_stdout_fails_after_the_good_records)


# ── detaching and reattaching ──────────────────────────────────────────────────────────────────


async def _detach_is_prompt_and_reattach_continues(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program(producing=True)
    adapter = Adapter()
    channel = adapter.channel(endpoint, program.session_id)
    await channel.connect()
    await adapter.until(lambda: len(adapter.records) >= 3)
    waiting = channel.register_request("still-open")

    loop = asyncio.get_running_loop()
    started = loop.time()
    await channel.detach()
    assert loop.time() - started < 1.0, "detach waited for a TCP close that execd never sends"
    first = peer.connections[0]
    assert first.closes_received == 1, "the closing handshake was skipped"
    await asyncio.wait_for(first.ended.wait(), 2.0)  # we closed TCP ourselves
    assert not channel.is_connected and channel.fatal is None and adapter.failures == []
    assert not waiting.done(), "a detach is not a failure: the program may still answer"

    seen, cursor = len(adapter.records), channel.cursor
    assert cursor == adapter.records[-1][1]
    produced = program.total
    await asyncio.wait_for(_until_output_grows(program, produced), 2.0)  # it runs on, detached

    await channel.connect(since=cursor)
    await adapter.until(lambda: len(adapter.records) >= seen + 3)
    numbers = [value["n"] for value in adapter.values()]
    assert numbers == list(range(1, len(numbers) + 1)), "records were lost or repeated across the reattach"
    await channel.detach()
    waiting.cancel()


async def _until_output_grows(program: Program, size: int) -> None:
    while program.total <= size:
        program.changed.clear()
        await program.changed.wait()


test_detach_returns_once_close_is_answered_and_reattach_loses_nothing = with_peer(
    _detach_is_prompt_and_reattach_continues)


async def _fresh_channel_reattach(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program(producing=True)
    before = Adapter()
    first = before.channel(endpoint, program.session_id)
    await first.connect()
    await before.until(lambda: len(before.records) >= 2)
    await first.detach()
    after = Adapter()
    second = after.channel(endpoint, program.session_id)
    await second.connect(since=first.cursor)
    await after.until(lambda: len(after.records) >= 2)
    assert after.values()[0]["n"] == before.values()[-1]["n"] + 1
    assert after.records[0][1] == first.cursor + len(json.dumps(after.values()[0])) + 1
    await second.detach()


test_a_new_channel_resumes_at_the_old_ones_cursor = with_peer(_fresh_channel_reattach)


async def _detach_in_the_middle_of_a_callback(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    """The adapter has taken record 2 and awaits something else when the detach comes: a channel that
    resumes at the cursor must not hand record 2 over again, and the first callback still finishes."""
    program = peer.program()
    taken: list[int] = []
    inside, gate, finished, last = asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def taking(value: dict[str, Any], offset: int) -> None:
        taken.append(value["n"])  # shown first, then a wait (a reply sent, a lock taken)
        if value["n"] == 2:
            inside.set()
            await gate.wait()
            finished.set()
        if value["n"] == 6:
            last.set()

    async def failed(exc: BaseException) -> None:
        raise AssertionError(f"no failure expected: {exc!r}")

    first = ExecdJsonLineChannel(endpoint, session_id=program.session_id, on_record=taking, on_failure=failed)
    await first.connect()
    for n in range(1, 6):
        program.record({"n": n})
    await asyncio.wait_for(inside.wait(), 5.0)
    await first.detach()
    second = ExecdJsonLineChannel(endpoint, session_id=program.session_id, on_record=taking, on_failure=failed)
    await second.connect(since=first.cursor)
    gate.set()
    await asyncio.wait_for(finished.wait(), 5.0)
    program.record({"n": 6})
    await asyncio.wait_for(last.wait(), 5.0)
    assert taken == [1, 2, 3, 4, 5, 6], "a record whose callback a detach interrupted was handed over again"
    await second.detach()


test_a_detach_during_a_callback_hands_its_record_over_only_once = with_peer(_detach_in_the_middle_of_a_callback)


async def _busy_adapter_detach(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program()
    stuck, release = asyncio.Event(), asyncio.Event()
    seen: list[int] = []

    async def slow(value: dict[str, Any], offset: int) -> None:
        seen.append(value["n"])
        if value["n"] == 3:
            stuck.set()
            await release.wait()  # an adapter busy for good: frames pile up behind it

    async def failed(exc: BaseException) -> None:
        raise AssertionError(f"no failure expected: {exc!r}")

    channel = ExecdJsonLineChannel(endpoint, session_id=program.session_id, on_record=slow, on_failure=failed)
    await channel.connect()
    for n in range(1, 301):
        program.record({"n": n})  # one WebSocket frame each: far beyond the client's receive queue
    await asyncio.wait_for(stuck.wait(), 5.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await channel.detach()
    assert loop.time() - started < 1.0, "the Close answer was stuck behind unread frames"
    assert peer.connections[0].closes_received == 1
    assert channel.cursor == 3 * 9, "the record handed to the busy callback counts as delivered"

    seen.clear()
    release.set()
    await channel.connect(since=channel.cursor)
    assert seen == list(range(4, 301)), "the replay resumes after the record the busy callback was handed"
    await channel.detach()


test_a_detach_while_the_adapter_is_busy_and_output_piles_up_is_prompt = with_peer(_busy_adapter_detach)


async def _silent_peer_is_waited_for(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program(producing=True)
    adapter = Adapter()
    channel = adapter.channel(endpoint, program.session_id)
    await channel.connect()
    await adapter.until(lambda: len(adapter.records) >= 1)
    detaching = asyncio.create_task(channel.detach())
    done, _ = await asyncio.wait({detaching}, timeout=0.5)
    assert not done, "the connection was dropped before the peer had a chance to answer Close"
    assert not peer.connections[0].ended.is_set()
    await asyncio.wait_for(detaching, 3.0)
    assert peer.connections[0].closes_received == 1
    await asyncio.wait_for(peer.connections[0].ended.wait(), 2.0)
    assert not channel.is_connected


def test_a_peer_that_never_answers_close_gets_a_bounded_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel_module, "CLOSE_TIMEOUT_SECONDS", 1.0)
    with_peer(_silent_peer_is_waited_for, answer_close=False)()


# ── the end of a conversation ──────────────────────────────────────────────────────────────────


async def _exit_reports_the_stderr_tail(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program()
    adapter = Adapter()
    channel = adapter.channel(endpoint, program.session_id)
    await channel.connect()
    first, second = channel.register_request("a"), channel.register_request("b")
    program.write(0x02, b"ENOENT: tool not installed\n")
    program.exit(127)
    await adapter.until(lambda: bool(adapter.failures))
    failure = adapter.failures[0]
    assert isinstance(failure, ProgramExited) and failure.exit_code == 127
    assert "tool exited with code 127" in str(failure) and "ENOENT: tool not installed" in str(failure)
    for waiting in (first, second):
        with pytest.raises(ProgramExited):
            await waiting
    assert not channel.is_connected and channel.fatal is failure
    with pytest.raises(ChannelDetached, match="not connected"):
        await channel.send({"too": "late"})
    await asyncio.wait_for(peer.connections[0].ended.wait(), 2.0)
    assert len(adapter.failures) == 1


test_an_exit_fails_the_channel_with_the_stderr_tail = with_peer(_exit_reports_the_stderr_tail)


async def _takeover(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program(producing=True)
    old_adapter, new_adapter = Adapter(), Adapter()
    old = old_adapter.channel(endpoint, program.session_id)
    await old.connect()
    await old_adapter.until(lambda: len(old_adapter.records) >= 1)
    waiting = old.register_request("q")

    with pytest.raises(ExecdAlreadyConnected, match="HTTP 409"):
        await new_adapter.channel(endpoint, program.session_id).connect(since=old.cursor, takeover=False)
    assert old.is_connected

    new = new_adapter.channel(endpoint, program.session_id)
    await new.connect(since=old.cursor)
    await old_adapter.until(lambda: bool(old_adapter.failures))
    assert isinstance(old_adapter.failures[0], ChannelTakenOver)
    assert "took the tool session over" in str(old_adapter.failures[0])
    with pytest.raises(ChannelTakenOver):
        await waiting
    await new_adapter.until(lambda: len(new_adapter.records) >= 3)
    assert new.is_connected and not old.is_connected
    await asyncio.wait_for(peer.connections[0].ended.wait(), 2.0)  # the old connection was closed by us
    await new.detach()


test_a_takeover_fails_the_old_channel_and_the_new_one_reads_on = with_peer(_takeover)


async def _server_error_frame(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program()
    adapter = Adapter()
    channel = adapter.channel(endpoint, program.session_id)
    await channel.connect()
    assert program.client is not None
    program.client.send(ws_frame(OP_TEXT, b'{"type": "pong"}'))
    program.client.send(ws_frame(OP_TEXT, b"not json at all"))
    program.client.send(ws_frame(OP_TEXT, b'{"type": "error", "code": "SESSION_GONE", "error": "it is gone"}'))
    await adapter.until(lambda: bool(adapter.failures))
    assert isinstance(adapter.failures[0], ExecdServerError) and adapter.failures[0].code == "SESSION_GONE"
    assert "it is gone" in str(adapter.failures[0])


test_an_error_frame_fails_the_channel_with_its_code = with_peer(_server_error_frame)


async def _record_callback_bug(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program()
    failures: list[BaseException] = []
    reported = asyncio.Event()

    async def broken(value: dict[str, Any], offset: int) -> None:
        raise KeyError("adapter bug")

    async def failed(exc: BaseException) -> None:
        failures.append(exc)
        reported.set()

    channel = ExecdJsonLineChannel(endpoint, session_id=program.session_id, on_record=broken, on_failure=failed)
    await channel.connect()
    program.record({"n": 1})
    await asyncio.wait_for(reported.wait(), 5.0)
    assert isinstance(channel.fatal, ChannelDetached) and isinstance(channel.fatal.__cause__, KeyError)
    assert failures == [channel.fatal]


test_an_exception_in_on_record_fails_the_channel_as_detached = with_peer(_record_callback_bug)


# ── writing and requests ───────────────────────────────────────────────────────────────────────


async def _send_and_settle(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program()
    adapter = Adapter()
    channel = adapter.channel(endpoint, program.session_id)
    await channel.connect()
    answer = channel.register_request("r1")
    await channel.send({"id": "r1", "text": "line\u2028separator ✓"})
    await adapter.until(lambda: len(adapter.records) == 1)
    assert adapter.values() == [{"echo": {"id": "r1", "text": "line\u2028separator ✓"}}]
    assert not answer.done(), "the channel settled a request by itself"
    assert channel.complete_request("r1", adapter.values()[0]) is True
    assert (await answer)["echo"]["id"] == "r1"
    assert channel.complete_request("r1", {}) is False

    program.echo = False
    program.stdin.clear()
    await channel.send({"id": 2})
    await asyncio.wait_for(_until_stdin(program), 5.0)
    assert bytes(program.stdin) == b'{"id": 2}\n'  # one ASCII line: no reader can split it

    await channel.send_signal("int")
    await channel.send_signal("SIGTERM")
    await asyncio.wait_for(_until_signals(program, 2), 5.0)
    assert program.signals == ["SIGINT", "SIGTERM"]
    with pytest.raises(ValueError, match="SIGINT"):
        await channel.send_signal("SIGUSR1")
    with pytest.raises(TypeError):
        await channel.send(["not", "a", "record"])  # type: ignore[arg-type]

    await channel.detach()
    with pytest.raises(ChannelDetached, match="not connected"):
        await channel.send({"id": 3})


async def _until_stdin(program: Program) -> None:
    while not program.stdin:
        program.changed.clear()
        await program.changed.wait()


async def _until_signals(program: Program, count: int) -> None:
    while len(program.signals) < count:
        program.changed.clear()
        await program.changed.wait()


test_send_writes_one_line_and_only_the_adapter_settles_requests = with_peer(_send_and_settle)


def test_requests_and_failures_without_a_connection() -> None:
    async def body() -> None:
        adapter = Adapter()
        channel = adapter.channel(ExecdEndpoint(origin="http://127.0.0.1:9"), "pty-x")
        with pytest.raises(ChannelDetached, match="not connected"):
            await channel.send({"type": "prompt"})
        first, second = channel.register_request("a"), channel.register_request("b")
        with pytest.raises(ValueError, match="already has a request registered"):
            channel.register_request("a")
        assert channel.complete_request("nobody", {}) is False

        gave_up = channel.register_request("c")
        gave_up.cancel()
        await asyncio.sleep(0)  # let the done callback run
        assert channel.complete_request("c", {}) is False
        channel.register_request("c").cancel()  # the id is free again

        await channel.fail(RuntimeError("pipe died"))
        await channel.fail(RuntimeError("and again"))
        assert [str(exc) for exc in adapter.failures] == ["pipe died"], "a consequence overwrote the cause"
        for waiting in (first, second):
            with pytest.raises(RuntimeError, match="pipe died"):
                await waiting
        assert str(channel.fatal) == "pipe died"
        with pytest.raises(ChannelDetached, match="has failed"):
            channel.register_request("d")

        odd = Adapter().channel(ExecdEndpoint(origin="http://127.0.0.1:9"), "pty-y")
        await odd.fail(ValueError("something odd"))
        assert isinstance(odd.fatal, ChannelDetached) and isinstance(odd.fatal.__cause__, ValueError)

    run(body())


# ── HTTP control ───────────────────────────────────────────────────────────────────────────────


async def _delete_twice(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program(producing=True)
    adapter = Adapter()
    channel = adapter.channel(endpoint, program.session_id)
    await channel.connect()
    await adapter.until(lambda: len(adapter.records) >= 1)
    waiting = channel.register_request("r")
    assert await channel.delete() is True
    assert [(method, target) for method, target, _ in peer.requests if method == "DELETE"] == [
        ("DELETE", f"/pty/{program.session_id}")]
    assert channel.session_id is None and not channel.is_connected
    with pytest.raises(ChannelDetached, match="deleted"):
        await waiting
    assert adapter.failures == [], "a delete the caller asked for is not reported as a failure"
    assert await channel.delete() is False
    with pytest.raises(ChannelDetached):
        await channel.connect()


test_delete_is_true_once_then_false = with_peer(_delete_twice)


async def _control_calls(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    control = ExecdControl(endpoint)
    session_id = await asyncio.to_thread(control.create, "/work", "exec tool --rpc")
    assert peer.programs[session_id].created_with == {"cwd": "/work", "command": "exec tool --rpc"}  # type: ignore
    assert await asyncio.to_thread(control.status, session_id) == {
        "session_id": session_id, "running": True, "output_offset": 0}
    with pytest.raises(ExecdNotFound, match=r"GET /pty/nope with HTTP 404") as caught:
        await asyncio.to_thread(control.status, "nope")
    assert caught.value.status == 404 and "no session" in caught.value.body
    with pytest.raises(ExecdUnsupported, match="cannot list") as unsupported:
        await asyncio.to_thread(control.list_sessions)
    assert isinstance(unsupported.value, NotImplementedError)
    assert await asyncio.to_thread(control.delete, session_id) is True
    assert await asyncio.to_thread(control.delete, session_id) is False
    assert await asyncio.to_thread(control.delete, "a/../b") is False  # quoted: never another path
    assert peer.requests[-1][1] == "/pty/a%2F..%2Fb"


test_control_create_status_delete_and_missing_list = with_peer(_control_calls, token="t0ken")
test_control_over_a_unix_socket = with_peer(_control_calls, token="t0ken", unix=True)


async def _channel_over_unix(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    await _records_flow_with_offsets(peer, endpoint)
    program = peer.program(producing=True)
    adapter = Adapter()
    channel = adapter.channel(endpoint, program.session_id)
    await channel.connect()
    await adapter.until(lambda: len(adapter.records) >= 2)
    await channel.detach()
    assert peer.connections[-1].closes_received == 1


test_the_channel_over_a_unix_socket = with_peer(_channel_over_unix, token="sesame", unix=True)


async def _refusals(peer: ScriptedExecd, endpoint: ExecdEndpoint) -> None:
    program = peer.program()
    for headers, word in (({}, "missing"), ({TOKEN_HEADER: "wrong"}, "wrong")):
        bad = ExecdEndpoint(origin=endpoint.origin, headers=headers)
        with pytest.raises(ExecdUnauthorized, match=f"token is {word}"):
            await asyncio.to_thread(ExecdControl(bad).status, program.session_id)
        channel = Adapter().channel(bad, program.session_id)
        with pytest.raises(ExecdUnauthorized, match=f"HTTP 401.*token is {word}"):
            await channel.connect()
        assert channel.fatal is None
    unknown = Adapter().channel(endpoint, "no-such-session")
    with pytest.raises(ExecdNotFound):
        await unknown.connect()
    assert unknown.fatal is None and not unknown.is_connected


test_refusals_name_their_cause_and_leave_the_channel_usable = with_peer(_refusals, token="right")


def test_an_address_where_nothing_listens_is_unreachable() -> None:
    async def body() -> None:
        with pytest.raises(ExecdUnreachable, match="cannot open the WebSocket"):
            await Adapter().channel(ExecdEndpoint(unix_socket="/nonexistent/execd.sock"), "pty-1").connect()
        with pytest.raises(ExecdUnreachable, match="cannot reach execd"):
            await asyncio.to_thread(ExecdControl(ExecdEndpoint(unix_socket="/nonexistent/execd.sock")).status, "x")

    run(body())


# ── endpoints ──────────────────────────────────────────────────────────────────────────────────


@pytest.mark.unit
def test_endpoint_from_the_environment() -> None:
    tcp = ExecdEndpoint.from_env({"OWSANDBOX_EXECD_URL": "http://10.0.0.5:44772/", "OWSANDBOX_EXECD_TOKEN": "s3cret"})
    assert tcp.origin == "http://10.0.0.5:44772" and tcp.headers == {"X-EXECD-ACCESS-TOKEN": "s3cret"}
    assert tcp.websocket_uri("/pty/a/ws?pty=0") == "ws://10.0.0.5:44772/pty/a/ws?pty=0"
    assert "s3cret" not in repr(tcp)
    unix = ExecdEndpoint.from_env({"OWSANDBOX_EXECD_URL": "unix:///run/execd.sock"})
    assert unix.unix_socket == "/run/execd.sock" and unix.headers == {}
    assert unix.websocket_uri("/pty/a/ws") == "ws://localhost/pty/a/ws"
    proxied = ExecdEndpoint(origin="https://gw.example/sandboxes/s1/port/44772")
    assert proxied.http_path("/pty") == "/sandboxes/s1/port/44772/pty"
    assert proxied.websocket_uri("/pty/a/ws") == "wss://gw.example/sandboxes/s1/port/44772/pty/a/ws"
    with pytest.raises(ExecdError, match="OWSANDBOX_EXECD_URL is not set"):
        ExecdEndpoint.from_env({})
    for bad in ({"origin": "ftp://x"}, {}, {"origin": "http://x:1", "unix_socket": "/s"}):
        with pytest.raises(ExecdError):
            ExecdEndpoint(**bad)
