"""The box's execd-compatible endpoint, served for real and driven by a real WebSocket client.

Every test starts an `ExecdServer` on a Unix socket in a private folder (and on 127.0.0.1 where the
transport matters), runs real bash processes, and talks to it through `websockets` and raw sockets,
the way the channel and execd's other clients do.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shlex
import shutil
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect, unix_connect

from owsandbox.box.execd import wsframes as ws
from owsandbox.box.execd.endpoint import ExecdServer
from owsandbox.box.execd.ptysessions import ReplayRing

from .released_execd import ReleasedExecd
from .waiting import patience, wait_until

TOKEN = "test-token-5f3a"
STDOUT, STDERR, REPLAY = 0x01, 0x02, 0x03


class Endpoint:
    """One server, reached over one transport ("unix" or "tcp")."""

    def __init__(self, server: ExecdServer, transport: str) -> None:
        self.server = server
        self.transport = transport

    # -- HTTP -------------------------------------------------------------------------------

    def http(self, method: str, path: str, body: Any = None, token: str | None = TOKEN,
             raw_body: bytes | None = None) -> tuple[int, dict[str, Any]]:
        conn = self._http_connection()
        headers = {"X-EXECD-ACCESS-TOKEN": token} if token is not None else {}
        data = raw_body if raw_body is not None else (json.dumps(body).encode() if body is not None else None)
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            assert response.getheader("Content-Type") == "application/json"
            return response.status, json.loads(response.read())
        finally:
            conn.close()

    def _http_connection(self) -> http.client.HTTPConnection:
        if self.transport == "tcp":
            return http.client.HTTPConnection("127.0.0.1", self.server.tcp_port, timeout=patience(10))
        conn = http.client.HTTPConnection("localhost", timeout=patience(10))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(self.server.address()["unix_socket"])
        conn.sock = sock
        return conn

    def create(self, command: str | None = None, cwd: str | None = None) -> str:
        body = {key: value for key, value in (("command", command), ("cwd", cwd)) if value is not None}
        status, answer = self.http("POST", "/pty", body)
        assert status == 201, answer
        return answer["session_id"]

    def status(self, session_id: str) -> dict[str, Any]:
        status, answer = self.http("GET", f"/pty/{session_id}")
        assert status == 200, answer
        return answer

    # -- WebSocket --------------------------------------------------------------------------

    def connect(self, path: str, token: str | None = TOKEN) -> ClientConnection:
        headers = {"X-EXECD-ACCESS-TOKEN": token} if token is not None else {}
        # max_queue=None: a bounded queue stops the client reading, so a close with unread messages
        # queued would wait for its close_timeout instead of seeing the server's Close.
        options: dict[str, Any] = {"additional_headers": headers, "max_size": None, "max_queue": None,
                                   "compression": None, "open_timeout": 10, "close_timeout": 5}
        if self.transport == "tcp":
            return connect(f"ws://127.0.0.1:{self.server.tcp_port}{path}", proxy=None, **options)
        return unix_connect(self.server.address()["unix_socket"], f"ws://localhost{path}", **options)

    @contextmanager
    def attach(self, session_id: str, query: str = "pty=0") -> Iterator[ClientConnection]:
        with self.connect(f"/pty/{session_id}/ws?{query}") as client:
            yield client


@contextmanager
def running_server(cwd: Path, server_class: type[ExecdServer] = ExecdServer, **options: Any) -> Iterator[ExecdServer]:
    folder = tempfile.mkdtemp(prefix="ows-execd-")  # short: a Unix socket path is at most 107 bytes
    os.chmod(folder, 0o700)
    server = server_class(TOKEN, unix_path=os.path.join(folder, "execd.sock"), tcp_host="127.0.0.1",
                          cwd=str(cwd), kill_grace=1.0, **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ExecdServer]:
    with running_server(tmp_path) as running:
        yield running


@pytest.fixture
def box(server: ExecdServer) -> Endpoint:
    return Endpoint(server, "unix")


@pytest.fixture(params=["unix", "tcp"])
def any_box(server: ExecdServer, request: pytest.FixtureRequest) -> Endpoint:
    return Endpoint(server, request.param)


# -- reading what the server sends ----------------------------------------------------------------


def control(message: str | bytes) -> dict[str, Any]:
    assert isinstance(message, str), f"expected a control frame, got {message!r}"
    return json.loads(message)


def read_until(client: ClientConnection, done: Callable[[bytes], bool], timeout: float = 10) -> bytes:
    """Output bytes (STDOUT and STDERR frames) until `done(all so far)`; control frames must not come.
    `timeout` is for a quiet machine (stretched by `patience`)."""
    data = b""
    deadline = time.monotonic() + patience(timeout)
    while not done(data):
        message = client.recv(timeout=max(0.01, deadline - time.monotonic()))
        assert isinstance(message, bytes) and message[0] in (STDOUT, STDERR), message
        data += message[1:]
    return data


def read_to_close(client: ClientConnection, timeout: float = 10) -> tuple[list[str | bytes], int | None, str]:
    """Every message until the server closes: (messages, close code, close reason); `timeout` is
    for a quiet machine (stretched by `patience`)."""
    messages: list[str | bytes] = []
    deadline = time.monotonic() + patience(timeout)
    while True:
        try:
            messages.append(client.recv(timeout=max(0.01, deadline - time.monotonic())))
        except ConnectionClosed as closed:
            rcvd = closed.rcvd
            return messages, rcvd.code if rcvd else None, rcvd.reason if rcvd else ""


def output_of(messages: list[str | bytes]) -> bytes:
    return b"".join(m[1:] for m in messages if isinstance(m, bytes) and m[0] in (STDOUT, STDERR))


def exits(messages: list[str | bytes]) -> list[int]:
    return [control(m)["exit_code"] for m in messages if isinstance(m, str) and control(m)["type"] == "exit"]


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return True
    return state in (b"Z", b"X")


# -- raw sockets ----------------------------------------------------------------------------------


def raw_socket(server: ExecdServer) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(server.address()["unix_socket"])
    return sock


def raw_exchange(server: ExecdServer, data: bytes) -> bytes:
    """Send `data`, read the answer to its end."""
    with raw_socket(server) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def raw_upgrade(server: ExecdServer, path: str) -> tuple[socket.socket, ws.FrameParser, bytes]:
    """A WebSocket opened by hand: (socket, a parser for server frames, bytes after the 101)."""
    sock = raw_socket(server)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nX-EXECD-ACCESS-TOKEN: {TOKEN}\r\n\r\n"
                 .encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    head, rest = head.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 101 "), head
    assert f"Sec-WebSocket-Accept: {ws.accept_key(key)}".encode() in head
    return sock, ws.FrameParser(require_mask=False), rest


def raw_frames_to_eof(sock: socket.socket, parser: ws.FrameParser, rest: bytes) -> list[tuple[int, bytes]]:
    frames = parser.feed(rest)
    while chunk := sock.recv(65536):
        frames += parser.feed(chunk)
    return frames


def masked(opcode: int, payload: bytes) -> bytes:
    return ws.encode_frame(opcode, payload, mask=os.urandom(4))


# -- the replay ring, alone ----------------------------------------------------------------------


@pytest.mark.unit
def test_the_ring_keeps_the_last_bytes_and_says_where_they_start():
    ring = ReplayRing(10)
    assert ring.read_from(0) == (0, b"")
    ring.append(b"abcdef")
    assert (ring.total, ring.read_from(0), ring.read_from(4), ring.read_from(6), ring.read_from(99)) == (
        6, (0, b"abcdef"), (4, b"ef"), (6, b""), (6, b""))
    ring.append(b"ghijkl")
    assert ring.total == 12 and ring.oldest == 2
    assert ring.read_from(0) == (2, b"cdefghijkl")  # offset > since: two bytes are lost
    assert ring.read_from(5) == (5, b"fghijkl")
    ring.append(b"0123456789abc")  # larger than the ring at once
    assert ring.read_from(0) == (15, b"3456789abc") and ring.total == 25


# -- auth and HTTP --------------------------------------------------------------------------------


def test_address_names_the_socket_the_url_and_the_token(server: ExecdServer):
    address = server.address()
    assert address["token"] == TOKEN
    assert address["url"] == f"http://127.0.0.1:{server.tcp_port}" and server.tcp_port > 0
    assert stat.S_IMODE(os.stat(address["unix_socket"]).st_mode) == 0o600


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN + "x", ""])
def test_every_request_needs_the_token(any_box: Endpoint, token: str | None):
    session_id = any_box.create("true")
    unauthorized = {"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}
    for method, path in [("POST", "/pty"), ("GET", "/pty"), ("GET", f"/pty/{session_id}"),
                         ("DELETE", f"/pty/{session_id}"), ("GET", "/nowhere")]:
        assert any_box.http(method, path, {} if method == "POST" else None, token=token) == (401, unauthorized)
    with pytest.raises(InvalidStatus) as refused:
        any_box.connect(f"/pty/{session_id}/ws?pty=0", token=token)
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body) == unauthorized
    assert any_box.status(session_id) == {"session_id": session_id, "running": False, "output_offset": 0,
                                          "exit_code": None}


def test_create_status_list_delete(any_box: Endpoint, tmp_path: Path):
    status, created = any_box.http("POST", "/pty", {"command": "exit 0"})
    assert status == 201 and re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}",
                                          created["session_id"])
    session_id = created["session_id"]
    assert any_box.status(session_id) == {"session_id": session_id, "running": False, "output_offset": 0,
                                          "exit_code": None}  # exit_code: this server's own
    other = any_box.create()  # no body fields at all: an interactive bash in the server's folder
    status, listing = any_box.http("GET", "/pty")
    assert status == 200
    assert {s["session_id"]: (s["command"], s["cwd"], s["running"], s["exit_code"]) for s in listing["sessions"]} == {
        session_id: ("exit 0", str(tmp_path), False, None), other: (None, str(tmp_path), False, None)}
    assert any_box.http("DELETE", f"/pty/{session_id}")[0] == 200
    for method in ("GET", "DELETE"):
        status, answer = any_box.http(method, f"/pty/{session_id}")
        assert status == 404 and answer["code"] == "NOT_FOUND"
    assert [s["session_id"] for s in any_box.http("GET", "/pty")[1]["sessions"]] == [other]


def test_a_session_runs_in_its_cwd_and_a_missing_cwd_is_refused(box: Endpoint, tmp_path: Path):
    (tmp_path / "sub").mkdir()
    with box.attach(box.create("pwd", cwd="sub")) as client:
        messages, code, _ = read_to_close(client)
    assert output_of(messages) == f"{tmp_path / 'sub'}\n".encode() and code == 1000
    status, answer = box.http("POST", "/pty", {"cwd": str(tmp_path / "missing")})
    assert status == 400 and answer["code"] == "INVALID_REQUEST" and str(tmp_path / "missing") in answer["message"]


@pytest.mark.parametrize("raw_body", [b"{not json", b"[1, 2]", b'{"cwd": 5}', b'{"command": ["ls"]}'])
def test_a_bad_create_body_is_a_400(box: Endpoint, raw_body: bytes):
    status, answer = box.http("POST", "/pty", raw_body=raw_body)
    assert status == 400 and answer["code"] == "INVALID_REQUEST" and answer["message"]


def test_unknown_sessions_and_paths_are_404_even_for_the_websocket(box: Endpoint):
    assert box.http("GET", "/pty/no-such-session")[0] == 404
    assert box.http("GET", "/files/info")[0] == 404
    with pytest.raises(InvalidStatus) as refused:
        box.connect("/pty/no-such-session/ws?pty=0")
    assert refused.value.response.status_code == 404
    assert json.loads(refused.value.response.body)["code"] == "NOT_FOUND"


@pytest.mark.parametrize("request_bytes", [
    b"NONSENSE\r\n\r\n",
    b"GET /pty HTTP/1.1\r\nBroken header line\r\n\r\n",
    b"GET /pty HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
    b"POST /pty HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n",
    b"POST /pty HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /pty HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
])
def test_malformed_http_is_a_400(server: ExecdServer, request_bytes: bytes):
    answer = raw_exchange(server, request_bytes)
    assert answer.startswith(b"HTTP/1.1 400 ")
    head, body = answer.split(b"\r\n\r\n", 1)
    assert b"Content-Type: application/json" in head and b"Connection: close" in head
    assert json.loads(body)["code"] == "INVALID_REQUEST"


def test_a_websocket_request_with_a_bad_since_is_a_400(box: Endpoint):
    with pytest.raises(InvalidStatus) as refused:
        box.connect(f"/pty/{box.create('true')}/ws?pty=0&since=-1")
    assert refused.value.response.status_code == 400


# -- the WebSocket --------------------------------------------------------------------------------


def test_output_stdin_and_exit_over_either_transport(any_box: Endpoint):
    session_id = any_box.create("read line; echo \"got $line\"; exit 7")
    with any_box.attach(session_id) as client:
        connected = control(client.recv(timeout=patience(10)))
        assert connected == {"type": "connected", "session_id": session_id, "mode": "pipe"}
        assert any_box.status(session_id)["running"] is True
        client.send(b"\x00hello\n")
        messages, code, reason = read_to_close(client)
    assert output_of(messages) == b"got hello\n"
    assert control(messages[-1]) == {"type": "exit", "exit_code": 7}  # the exit frame, then Close 1000
    assert (code, reason) == (1000, "process exited")
    assert any_box.status(session_id) == {"session_id": session_id, "running": False, "output_offset": 10,
                                          "exit_code": 7}


def test_stdin_by_binary_frame_and_by_control_frame(box: Endpoint):
    with box.attach(box.create("cat")) as client:
        client.recv(timeout=patience(10))
        client.send(b"\x00binary \xff\n")
        assert read_until(client, lambda d: d.endswith(b"\n")) == b"binary \xff\n"
        client.send(json.dumps({"type": "stdin", "data": "text é\n"}))
        assert read_until(client, lambda d: d.endswith(b"\n")) == "text é\n".encode()


def test_a_second_client_is_refused_and_takeover_closes_the_first_with_4001(box: Endpoint):
    session_id = box.create("cat")
    with box.attach(session_id) as first:
        assert control(first.recv(timeout=patience(10)))["type"] == "connected"
        with pytest.raises(InvalidStatus) as refused:
            box.connect(f"/pty/{session_id}/ws?pty=0")
        assert refused.value.response.status_code == 409
        assert json.loads(refused.value.response.body)["code"] == "ALREADY_CONNECTED"
        with box.attach(session_id, "pty=0&takeover=1") as second:
            assert control(second.recv(timeout=patience(10)))["type"] == "connected"
            messages, code, reason = read_to_close(first)
            assert (messages, code, reason) == ([], 4001, "TAKEN_OVER")
            second.send(b"\x00still here\n")
            assert read_until(second, lambda d: d.endswith(b"\n")) == b"still here\n"
        assert box.status(session_id)["running"] is True


def test_the_replay_comes_before_connected_and_since_at_the_end_gets_none(box: Endpoint):
    session_id = box.create("printf 'hello'; printf ' world' >&2; read x")
    with box.attach(session_id) as client:
        client.recv(timeout=patience(10))
        assert read_until(client, lambda d: len(d) == 11) in (b"hello world", b" worldhello")
    with box.attach(session_id, "pty=0&since=0") as client:
        replay = client.recv(timeout=patience(10))
        assert replay[0] == REPLAY and int.from_bytes(replay[1:9], "big") == 0
        assert replay[9:] in (b"hello world", b" worldhello")
        assert control(client.recv(timeout=patience(10)))["type"] == "connected"
    with box.attach(session_id, "pty=0&since=5") as client:
        replay = client.recv(timeout=patience(10))
        assert int.from_bytes(replay[1:9], "big") == 5 and len(replay[9:]) == 6
    for since in (11, 12, 10**12):
        with box.attach(session_id, f"pty=0&since={since}") as client:
            assert control(client.recv(timeout=patience(10)))["type"] == "connected"


def test_stderr_bytes_advance_the_offsets_too(box: Endpoint):
    session_id = box.create("printf out1; read a; printf err22 >&2; read b; printf out333; read c")
    frames = []
    with box.attach(session_id) as client:
        client.recv(timeout=patience(10))
        for _ in range(3):
            frames.append(client.recv(timeout=patience(10)))
            client.send(b"\x00\n")
        messages, code, _ = read_to_close(client)
    assert frames == [b"\x01out1", b"\x02err22", b"\x01out333"]
    assert exits(messages) == [0] and code == 1000
    assert box.status(session_id)["output_offset"] == 4 + 5 + 6
    with box.attach(session_id, "pty=0&since=4") as client:
        replay = client.recv(timeout=patience(10))
    assert replay == b"\x03" + (4).to_bytes(8, "big") + b"err22out333"


def test_resuming_from_since_never_loses_or_repeats_a_byte(box: Endpoint):
    """Detach and reattach again and again while the program prints: replay plus live frames must
    give every byte exactly once, whichever side of the attach each chunk of output fell on."""
    count = 4000
    session_id = box.create(f"for i in $(seq 1 {count}); do echo $i; "
                            "if [ $((i % 40)) = 0 ]; then sleep 0.005; fi; done")
    expected = "".join(f"{i}\n" for i in range(1, count + 1)).encode()
    received = bytearray()
    hops = 0
    finished = False
    while not finished:
        hops += 1
        with box.attach(session_id, f"pty=0&since={len(received)}") as client:
            first = client.recv(timeout=patience(10))
            if isinstance(first, bytes):
                assert first[0] == REPLAY and int.from_bytes(first[1:9], "big") == len(received)
                received += first[9:]
                first = client.recv(timeout=patience(10))
            assert control(first)["type"] == "connected"
            for _ in range(1 + hops % 4):  # a few live frames, then detach in the middle of the output
                message = client.recv(timeout=patience(10))
                if isinstance(message, str):
                    assert control(message)["type"] == "exit"
                    finished = True
                    break
                assert message[0] == STDOUT and len(message) <= 1 + 32 * 1024
                received += message[1:]
        assert expected.startswith(bytes(received)), f"diverged after {len(received)} bytes, hop {hops}"
    assert bytes(received) == expected
    assert hops > 3


# Numbered JSON lines on stdout, each one write, with a line on stderr after every 13th; once all are
# written, "done" into the FIFO named by argv[1]. It starts on a line of stdin.
WHOLE_LINES = r'''
import os, sys
sys.stdin.readline()
for n in range(1, 1501):
    os.write(1, b'{"n":%d,"pad":"%s"}\n' % (n, b"x" * (n % 23)))
    if n % 13 == 0:
        os.write(2, b"warn %d\n" % n)
with open(sys.argv[1], "w") as fifo:
    fifo.write("done")
'''


def test_a_pump_that_fell_behind_keeps_each_line_whole_in_the_ring(box: Endpoint, tmp_path: Path):
    """In pipe mode stdout and stderr share the ring, and a replay cannot tell them apart: a line must
    reach it whole, never with the other stream's bytes in the middle. A pump that a busy machine left
    behind finds both pipes full, and a stdout read of CHUNK_BYTES ends inside a line; the stderr read
    that came next cut the line in two in the ring, and a client resuming from that line's start lost
    the record (found by tests/faults/test_attach_cuts.py under load). Here the pump is held back by
    holding its session's lock while the program writes ~54 kB of lines and a stderr line after every 13th."""
    fifo = tmp_path / "written"
    os.mkfifo(fifo)
    session_id = box.create(shlex.join(["exec", sys.executable, "-c", WHOLE_LINES, str(fifo)]))
    with box.attach(session_id) as client:
        assert control(client.recv(timeout=patience(10)))["type"] == "connected"
        session = box.server.sessions.get(session_id)
        assert session is not None
        with session.lock:  # the pump stops at its first output, as a busy machine would leave it
            client.send(b"\x00go\n")
            assert fifo.read_text() == "done"  # opening blocks until the program has written everything
        messages, _, _ = read_to_close(client)
    assert exits(messages) == [0]
    with box.attach(session_id, "pty=0&since=0") as client:
        replay = client.recv(timeout=patience(10))
    assert replay[0] == REPLAY and int.from_bytes(replay[1:9], "big") == 0
    lines = replay[9:].decode().splitlines()
    cut = [line for line in lines if not re.fullmatch(r'\{"n":\d+,"pad":"x*"\}|warn \d+', line)]
    assert not cut, f"lines cut in the ring: {cut[:4]}"
    assert [json.loads(line)["n"] for line in lines if line.startswith("{")] == list(range(1, 1501))
    assert [line for line in lines if line.startswith("warn")] == [f"warn {n}" for n in range(13, 1501, 13)]


def test_an_offset_older_than_the_ring_gets_a_replay_that_shows_the_gap(box: Endpoint):
    total = 1_500_000
    session_id = box.create(f"head -c {total} /dev/zero | tr '\\0' a; read x")
    with box.attach(session_id) as client:
        client.recv(timeout=patience(10))
        data = read_until(client, lambda d: len(d) >= total, timeout=60)
    assert data == b"a" * total
    assert box.status(session_id)["output_offset"] == total
    with box.attach(session_id, "pty=0&since=100") as client:
        replay = client.recv(timeout=patience(10))
        assert control(client.recv(timeout=patience(10)))["type"] == "connected"
    offset = int.from_bytes(replay[1:9], "big")
    assert replay[0] == REPLAY and offset == total - 1024 * 1024 and offset > 100  # the client sees the gap
    assert replay[9:] == b"a" * (1024 * 1024)


def test_sigint_goes_to_the_process_group(box: Endpoint):
    session_id = box.create("echo started; sleep 30; echo after")
    with box.attach(session_id) as client:
        client.recv(timeout=patience(10))
        assert read_until(client, lambda d: d == b"started\n") == b"started\n"
        client.send(json.dumps({"type": "signal", "signal": "SIGINT"}))
        messages, code, _ = read_to_close(client)
    assert b"after" not in output_of(messages)
    assert exits(messages) == [-1] and code == 1000  # ended by a signal: -1, as execd reports it
    status, listing = box.http("GET", "/pty")
    assert [s["exit_code"] for s in listing["sessions"]] == [-1]


def test_a_client_connecting_after_the_exit_gets_replay_connected_exit_and_close(box: Endpoint):
    session_id = box.create("echo bye; exit 3")
    with box.attach(session_id) as client:
        read_to_close(client)
    with box.attach(session_id, "pty=1") as client:  # the mode was fixed by the first connection
        messages, code, reason = read_to_close(client)
    assert messages[0] == b"\x03" + bytes(8) + b"bye\n"
    assert control(messages[1]) == {"type": "connected", "session_id": session_id, "mode": "pipe"}
    assert control(messages[2]) == {"type": "exit", "exit_code": 3}
    assert (len(messages), code, reason) == (3, 1000, "process exited")


def test_a_session_whose_folder_vanished_before_the_connect_reports_start_failed(box: Endpoint, tmp_path: Path):
    (tmp_path / "doomed").mkdir()
    session_id = box.create("true", cwd="doomed")
    (tmp_path / "doomed").rmdir()
    with box.attach(session_id) as client:
        messages, code, reason = read_to_close(client)
    assert [control(m)["code"] for m in messages] == ["START_FAILED"] and (code, reason) == (1011, "START_FAILED")
    assert box.status(session_id)["running"] is False


def test_unknown_control_frames_are_errors_and_text_that_is_not_json_is_ignored(box: Endpoint):
    with box.attach(box.create("cat")) as client:
        client.recv(timeout=patience(10))
        for frame in ({"type": "bogus"}, [1, 2], {"type": "signal", "signal": "SIGUSR1"},
                      {"type": "stdin", "data": 5}, {"type": "resize", "cols": 0, "rows": 10}):
            client.send(json.dumps(frame))
            error = control(client.recv(timeout=patience(10)))
            assert error["type"] == "error" and error["code"] == "INVALID_FRAME" and error["error"]
        client.send(b"\x07not stdin")
        assert control(client.recv(timeout=patience(10)))["code"] == "INVALID_FRAME"
        client.send("not json at all")
        client.send(json.dumps({"type": "ping"}))
        assert control(client.recv(timeout=patience(10))) == {"type": "pong"}  # nothing came for the text before it
        client.ping(b"ws-level").wait(10)  # a WebSocket ping gets its pong
        client.send(json.dumps({"type": "resize", "cols": 100, "rows": 40}))  # ignored in pipe mode
        client.send(json.dumps({"type": "ping"}))
        assert control(client.recv(timeout=patience(10))) == {"type": "pong"}


def test_a_stdin_write_that_fails_is_reported(box: Endpoint):
    with box.attach(box.create("exec 0<&-; echo closed; sleep 30")) as client:
        client.recv(timeout=patience(10))
        read_until(client, lambda d: d == b"closed\n")
        client.send(b"\x00" + b"x" * 100)
        error = control(client.recv(timeout=patience(10)))
    assert error["type"] == "error" and error["code"] == "STDIN_WRITE_FAILED"


def test_pty_mode_has_a_terminal_that_resizes(box: Endpoint):
    session_id = box.create("tty; stty size; read x; stty size")
    with box.attach(session_id, "pty=1") as client:
        assert control(client.recv(timeout=patience(10)))["mode"] == "pty"
        head = read_until(client, lambda d: d.count(b"\n") >= 2)
        assert re.match(rb"/dev/pts/\d+\r\n24 80\r\n", head), head
        client.send(json.dumps({"type": "resize", "cols": 100, "rows": 30}))
        client.send(json.dumps({"type": "stdin", "data": "\n"}))
        messages, code, _ = read_to_close(client)
    assert output_of(messages).endswith(b"30 100\r\n") and exits(messages) == [0] and code == 1000


def test_pty_mode_is_an_interactive_shell_with_job_control(box: Endpoint):
    with box.attach(box.create(), "pty=1") as client:
        client.recv(timeout=patience(10))
        client.send(b"\x00echo flags=$-\n")
        seen = read_until(client, lambda d: re.search(rb"flags=(\w+)\r\n", d) is not None)
        flags = re.search(rb"flags=(\w+)\r\n", seen).group(1)
        assert b"i" in flags and b"m" in flags  # interactive, with job control: the terminal is its own
        assert b"no job control" not in seen
        client.send(b"\x00exit 4\n")
        messages, _, _ = read_to_close(client)
    assert exits(messages) == [4]


def test_a_detached_process_keeps_running_and_since_picks_up_where_the_cursor_was(box: Endpoint, tmp_path: Path):
    session_id = box.create("echo start; while [ ! -e go ]; do sleep 0.02; done; echo after-detach; read x")
    with box.attach(session_id) as client:
        client.recv(timeout=patience(10))
        cursor = len(read_until(client, lambda d: d == b"start\n"))
    assert box.status(session_id) == {"session_id": session_id, "running": True, "output_offset": cursor,
                                      "exit_code": None}
    (tmp_path / "go").touch()
    wait_until(lambda: box.status(session_id)["output_offset"] > cursor, patience(10), "output while detached")
    with box.attach(session_id, f"pty=0&since={cursor}") as client:
        assert client.recv(timeout=patience(10)) == b"\x03" + cursor.to_bytes(8, "big") + b"after-detach\n"
        assert control(client.recv(timeout=patience(10)))["type"] == "connected"
        client.send(b"\x00\n")
        messages, code, _ = read_to_close(client)
    assert exits(messages) == [0] and code == 1000


def test_delete_kills_the_process_group_and_a_grandchild(box: Endpoint):
    session_id = box.create("sleep 300 & echo $$ $!; sleep 301")
    with box.attach(session_id) as client:
        client.recv(timeout=patience(10))
        bash_pid, grandchild = map(int, read_until(client, lambda d: d.endswith(b"\n")).split())
        assert box.http("DELETE", f"/pty/{session_id}")[0] == 200
        messages, code, _ = read_to_close(client)
    assert exits(messages) == [-1] and code == 1000
    wait_until(lambda: gone(bash_pid) and gone(grandchild), patience(10), "the session's processes to end")
    assert box.http("GET", f"/pty/{session_id}")[0] == 404


def test_delete_in_pty_mode_kills_background_jobs_in_their_own_groups(box: Endpoint):
    session_id = box.create()
    with box.attach(session_id, "pty=1") as client:
        client.recv(timeout=patience(10))
        client.send(b"\x00sleep 300 & echo PIDS=$$:$!\n")
        seen = read_until(client, lambda d: re.search(rb"PIDS=(\d+):(\d+)", d) is not None)
        bash_pid, job = map(int, re.search(rb"PIDS=(\d+):(\d+)", seen).groups())
        assert os.getpgid(job) != bash_pid  # job control put the job in a group of its own
        assert box.http("DELETE", f"/pty/{session_id}")[0] == 200
        read_to_close(client)
    wait_until(lambda: gone(bash_pid) and gone(job), patience(10), "the shell and its job to end")


def test_stopping_the_server_kills_every_session(tmp_path: Path):
    with running_server(tmp_path) as server:
        box = Endpoint(server, "unix")
        with box.attach(box.create("echo $$; sleep 300")) as client:
            client.recv(timeout=patience(10))
            pid = int(read_until(client, lambda d: d.endswith(b"\n")))
    wait_until(lambda: gone(pid), patience(10), "the session's process to end")


# -- closing --------------------------------------------------------------------------------------


def test_a_client_close_is_answered_then_the_server_closes_tcp_and_the_process_runs_on(box: Endpoint):
    session_id = box.create("cat")
    sock, parser, rest = raw_upgrade(box.server, f"/pty/{session_id}/ws?pty=0")
    with sock:
        sock.sendall(masked(ws.OP_CLOSE, ws.close_payload(1000, "bye")))
        frames = raw_frames_to_eof(sock, parser, rest)  # returns only once the server closed TCP
    assert frames[0][0] == ws.OP_TEXT and json.loads(frames[0][1])["type"] == "connected"
    assert frames[-1] == (ws.OP_CLOSE, ws.close_payload(1000, ""))
    assert box.status(session_id)["running"] is True


def test_an_unmasked_client_frame_fails_the_connection_with_1002(box: Endpoint):
    sock, parser, rest = raw_upgrade(box.server, f"/pty/{box.create('cat')}/ws?pty=0")
    with sock:
        sock.sendall(ws.encode_frame(ws.OP_TEXT, b'{"type": "ping"}'))
        frames = raw_frames_to_eof(sock, parser, rest)
    assert frames[-1][0] == ws.OP_CLOSE and ws.parse_close(frames[-1][1])[0] == 1002


def test_a_silent_client_is_pinged_then_dropped_and_a_live_one_is_not(tmp_path: Path):
    with running_server(tmp_path, ping_interval=0.2, idle_timeout=0.8) as server:
        box = Endpoint(server, "unix")
        session_id = box.create("cat")
        sock, parser, rest = raw_upgrade(server, f"/pty/{session_id}/ws?pty=0")
        started = time.monotonic()
        with sock:
            frames = raw_frames_to_eof(sock, parser, rest)  # never answers a ping
        assert 0.7 < time.monotonic() - started < patience(5)
        assert [op for op, _ in frames].count(ws.OP_PING) >= 2
        assert frames[-1][0] == ws.OP_CLOSE and ws.parse_close(frames[-1][1])[0] == 1001
        with box.attach(session_id) as client:  # `websockets` answers pings: it stays
            client.recv(timeout=patience(10))
            with pytest.raises(TimeoutError):
                client.recv(timeout=2)
            client.send(b"\x00alive\n")
            assert read_until(client, lambda d: d == b"alive\n") == b"alive\n"


# -- release mode: the quirks of a released OpenSandbox execd (docker/execd v1.0.10 to v1.0.18) ------


@pytest.fixture
def release_box(tmp_path: Path) -> Iterator[Endpoint]:
    with running_server(tmp_path, server_class=ReleasedExecd) as running:
        yield Endpoint(running, "unix")


def _connected(client: ClientConnection) -> None:
    assert control(client.recv(timeout=patience(10)))["type"] == "connected"


def test_release_mode_ignores_command_and_knows_no_list_no_takeover(release_box: Endpoint):
    session_id = release_box.create("echo never-run")  # model/pty.go: `cwd` only
    with release_box.attach(session_id, "pty=0&takeover=1") as client:
        _connected(client)
        client.send(b"\x00echo from-stdin\n")  # a bare bash reads its commands from stdin
        assert read_until(client, lambda data: data.endswith(b"from-stdin\n")) == b"from-stdin\n"
        with pytest.raises(InvalidStatus) as held:  # controller/pty_ws.go: LockWS or 409, whatever takeover says
            release_box.connect(f"/pty/{session_id}/ws?pty=0&takeover=1")
        assert held.value.response.status_code == 409
    assert release_box.http("GET", "/pty")[0] == 404  # pkg/web/router.go: no list route
    assert set(release_box.status(session_id)) == {"session_id", "running", "output_offset"}


def test_release_mode_restarts_an_ended_program_and_sends_exit_before_the_tail(release_box: Endpoint):
    session_id = release_box.create()
    # Read by hand: websockets' sync client drops the frames that come with a Close it cannot answer
    # (the peer already closed TCP), which is what a release does right after its Close.
    sock, parser, rest = raw_upgrade(release_box.server, f"/pty/{session_id}/ws?pty=0")
    with sock:
        sock.sendall(masked(ws.OP_BINARY, b"\x00printf err >&2; printf tail; exit 3\n"))
        frames = raw_frames_to_eof(sock, parser, rest)  # the server closes TCP without waiting for our Close
    texts = [json.loads(p)["type"] if op == ws.OP_TEXT else p[:1] for op, p in frames]
    assert texts == ["connected", "exit", b"\x01", b"\x02", b"\x03"], frames  # exit overtook the output
    assert frames[-1] == (ws.OP_CLOSE, ws.close_payload(1000, "process exited"))
    assert release_box.status(session_id)["running"] is False
    with release_box.attach(session_id, "pty=0&since=0") as client:  # a new bash, in the same session
        replay = client.recv(timeout=patience(10))
        # The ring holds both, in the order the session's pump read them: two pipes, both ready at once
        # when the pump wakes late (two runs at once met `tailerr`), have no order of their own.
        assert replay[0] == REPLAY and replay[9:] in (b"errtail", b"tailerr")
        _connected(client)
        assert release_box.status(session_id)["running"] is True
        client.send(b"\x00echo again\n")
        assert read_until(client, lambda data: data.endswith(b"again\n")) == b"again\n"


def test_release_mode_lets_live_stderr_fall_behind_stdout(tmp_path: Path):
    # stdout waits `lag`, stderr twice that: o, printed after e and a `sleep 0.01`, overtakes e when it
    # is read less than `lag` after e. The stand-in's 0.05 s was outlasted by the fork of `sleep` under
    # two test runs at once, so the lag here is stretched by the load.
    with running_server(tmp_path, server_class=ReleasedExecd, lag=patience(0.5)) as running:
        release_box = Endpoint(running, "unix")
        session_id = release_box.create()
        with release_box.attach(session_id) as client:
            _connected(client)
            client.send(b"\x00printf 'e\\n' >&2; sleep 0.01; printf 'o\\n'; read x\n")
            frames = [client.recv(timeout=patience(10)), client.recv(timeout=patience(10))]
        assert frames == [b"\x01o\n", b"\x02e\n"]  # live: stdout first; the ring holds e then o
        with release_box.attach(session_id, "pty=0&since=0") as client:
            assert client.recv(timeout=patience(10)) == b"\x03" + (0).to_bytes(8, "big") + b"e\no\n"
