"""The execd endpoint's port relay (`/ports`, box/execd/portrelay.py), served for real on a Unix socket and
driven through the host's tunnel client (owsandbox/preview/tunnel.py).

Here the server runs in this machine's own network namespace, so "the box's loopback" is this one's:
what the relay reaches in a real box is tested through bubblewrap in tests/test_preview.py. These tests
pin the wire: the token, the upgrade, bytes both ways with half-closes, the refusals and their words,
and `DELETE /ports/{port}` cutting the open relays.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from owsandbox.box.execd.endpoint import TOKEN_HEADER, ExecdServer
from owsandbox.preview.tunnel import TunnelRefused, close_port, open_tunnel

from .waiting import wait_until

TOKEN = "relay-test-token-0123456789"
HEADERS = {TOKEN_HEADER: TOKEN}


@pytest.fixture
def server() -> Iterator[ExecdServer]:
    folder = tempfile.mkdtemp(prefix="owsandbox-relay-")
    os.chmod(folder, 0o700)
    with ExecdServer(TOKEN, unix_path=os.path.join(folder, "execd.sock"), cwd=folder) as running:
        yield running
    os.rmdir(folder)


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that answers each connection with `hello\\n`, then echoes what it reads
    until the client half-closes, then says `bye\\n` and closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    stopping = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.sendall(b"hello\n")
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.sendall(b"bye\n")

    def accept() -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stopping.set()
    listener.close()
    thread.join(5)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"the relay ended after {len(data)} of {size} bytes"
        data += chunk
    return data


def _read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _request(server: ExecdServer, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    from owsandbox.channel.control import UnixHTTPConnection

    conn = UnixHTTPConnection(str(server.unix_path), timeout=10)
    try:
        conn.request(method, path, headers=HEADERS if headers is None else headers)
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def test_bytes_go_both_ways_and_a_half_close_is_passed_on(server: ExecdServer, echo_port: int) -> None:
    payload = os.urandom(3 * 1024 * 1024)  # more than any buffer on the way
    with open_tunnel(str(server.unix_path), HEADERS, echo_port) as sock:
        assert _read_exactly(sock, 6) == b"hello\n"
        writer = threading.Thread(target=lambda: (sock.sendall(payload), sock.shutdown(socket.SHUT_WR)))
        writer.start()
        echoed = _read_to_end(sock)
        writer.join()
    assert echoed == payload + b"bye\n"


def test_a_port_where_nothing_listens_is_a_502_that_says_so(server: ExecdServer) -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    with pytest.raises(TunnelRefused) as refused:
        open_tunnel(str(server.unix_path), HEADERS, port)
    assert refused.value.status == 502 and refused.value.code == "PORT_CLOSED"
    assert f"nothing listens on port {port} in the sandbox" in str(refused.value)


@pytest.mark.parametrize("port", ["0", "65536", "80a", "-1", "080", ""])
def test_a_bad_port_is_a_400_naming_it(server: ExecdServer, port: str) -> None:
    status, body = _request(server, "GET", f"/ports/{port}/tcp", {**HEADERS, "Connection": "Upgrade",
                                                                  "Upgrade": "owsandbox-tcp"})
    assert (status, body["code"]) == (400, "INVALID_REQUEST")
    assert f"'{port}' is not a port" in body["message"]


def test_the_relay_needs_the_token_and_the_upgrade(server: ExecdServer, echo_port: int) -> None:
    with pytest.raises(TunnelRefused) as refused:
        open_tunnel(str(server.unix_path), {TOKEN_HEADER: "wrong-token-0123456789"}, echo_port)
    assert refused.value.status == 401
    status, body = _request(server, "GET", f"/ports/{echo_port}/tcp")
    assert status == 400 and "Upgrade: owsandbox-tcp" in body["message"]
    status, _ = _request(server, "POST", f"/ports/{echo_port}/tcp")
    assert status == 405


def test_delete_cuts_the_open_relays_of_a_port_and_lists_them_before(server: ExecdServer, echo_port: int) -> None:
    first = open_tunnel(str(server.unix_path), HEADERS, echo_port)
    second = open_tunnel(str(server.unix_path), HEADERS, echo_port)
    try:
        for sock in (first, second):
            assert _read_exactly(sock, 6) == b"hello\n"
        assert _request(server, "GET", "/ports") == (200, {"relays": {str(echo_port): 2}})
        assert close_port(str(server.unix_path), HEADERS, echo_port) == 2
        for sock in (first, second):
            sock.settimeout(10)
            assert _read_to_end(sock) == b""  # cut: not even the echo server's goodbye
        wait_until(lambda: _request(server, "GET", "/ports") == (200, {"relays": {}}), 10, "the relays to be gone")
        assert close_port(str(server.unix_path), HEADERS, echo_port) == 0
    finally:
        first.close()
        second.close()


def test_the_tunnel_names_an_endpoint_without_a_relay(tmp_path: Path) -> None:
    """A daemon from before the relay answers 404 NOT_FOUND: the error says to restart the kernel."""
    listener = socket.socket(socket.AF_UNIX)
    path = str(tmp_path / "old.sock")
    listener.bind(path)
    listener.listen(1)

    def old_daemon() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            body = json.dumps({"code": "NOT_FOUND", "message": "no such path: /ports/8000/tcp"}).encode()
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    thread = threading.Thread(target=old_daemon, daemon=True)
    thread.start()
    with pytest.raises(TunnelRefused, match=r"predates %preview\): restart the kernel"):
        open_tunnel(path, HEADERS, 8000)
    thread.join(5)
    listener.close()
