"""A TCP relay to a port on the box's own loopback, served by the execd endpoint (`%preview`).

A web app started in a cell listens on a port in the box, which has no network the host can reach. The
Jupyter server reaches it through the execd endpoint the host already has (its Unix socket, with the
execd token): the connection to the port is made here, inside the box's network namespace, so only the
box's own ports answer and the host's loopback is out of reach by construction. The API, in the style of
the endpoint's PTY calls (same token header, one request per connection, JSON errors):

* `GET /ports/{port}/tcp` with `Connection: Upgrade` and `Upgrade: owsandbox-tcp`: connects to
  127.0.0.1:{port} (then [::1]:{port}) in the box; `101 Switching Protocols` and from then on the
  connection carries the port's bytes both ways, half-closes passed on. Bytes the client sent after
  its request head are delivered to the port first. `502 PORT_CLOSED` when nothing listens there,
  `504 PORT_TIMEOUT` when the connection is not made in time, `400` for a port that is not 1..65535.
* `DELETE /ports/{port}`: closes every open relay to that port (`{"port": N, "closed": count}`); the
  program listening there is not touched.
* `GET /ports`: the open relays, by port (`{"relays": {"8000": 2}}`).

Each relay copies with two threads and a 64 KiB buffer each, so memory is bounded whatever flows.
"""

from __future__ import annotations

import re
import socket
import threading
from typing import Any

from .http import HttpError, Request, bad_request

UPGRADE = "owsandbox-tcp"
CONNECT_TIMEOUT_SECONDS = 5.0
CHUNK_BYTES = 65536
_PATH = re.compile(r"/ports(?:/([^/]*)(/tcp)?)?")
LOOPBACKS = (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6))


def matches(path: str) -> bool:
    """Whether `path` is one of this module's."""
    return _PATH.fullmatch(path) is not None


def parse_port(text: str) -> int:
    """A port number 1..65535 from a path's part; a 400 naming it otherwise."""
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536 or text != str(int(text)):
        raise bad_request(f"'{text}' is not a port (a whole number 1..65535)")
    return int(text)


def connect_loopback(port: int, timeout: float = CONNECT_TIMEOUT_SECONDS) -> socket.socket:
    """A connection to `port` on this network namespace's loopback (IPv4, then IPv6); HttpError naming
    why not."""
    refused = []
    for host, family in LOOPBACKS:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:  # no IPv6 in this namespace
            refused.append(f"{host}: {exc.strerror or exc}")
            continue
        sock.settimeout(timeout)
        try:
            sock.connect((host, port))
        except TimeoutError:
            sock.close()
            raise HttpError(504, "PORT_TIMEOUT", f"port {port} in the sandbox did not accept a connection "
                                                 f"within {timeout:g} s") from None
        except OSError as exc:
            sock.close()
            refused.append(f"{host}: {exc.strerror or exc}")
            continue
        sock.settimeout(None)
        return sock
    raise HttpError(502, "PORT_CLOSED", f"nothing listens on port {port} in the sandbox ({'; '.join(refused)})")


class PortRelays:
    """The open relays, by port, so that `DELETE /ports/{port}` can close them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, set[tuple[socket.socket, socket.socket]]] = {}

    def dispatch(self, sock: socket.socket, request: Request, rest: bytes) -> tuple[bool, int, dict[str, Any]]:
        """Answer a `/ports` request: (True, 0, {}) when it became a relay (run to its end, both
        sockets closed), else (False, status, body) to answer."""
        match = _PATH.fullmatch(request.path)
        assert match is not None
        port_text, tcp = match.group(1), match.group(2)
        if port_text is None:
            _require(request, "GET")
            with self._lock:
                return False, 200, {"relays": {str(port): len(pairs) for port, pairs in self._open.items() if pairs}}
        port = parse_port(port_text)
        if not tcp:
            _require(request, "DELETE")
            return False, 200, {"port": port, "closed": self.close_port(port)}
        _require(request, "GET")
        _check_upgrade(request)
        target = connect_loopback(port)
        pair = (sock, target)
        with self._lock:
            self._open.setdefault(port, set()).add(pair)
        try:
            sock.sendall(f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: {UPGRADE}\r\nConnection: Upgrade\r\n\r\n"
                         .encode("ascii"))
            if rest:
                target.sendall(rest)
            relay(sock, target)
        finally:
            with self._lock:
                self._open.get(port, set()).discard(pair)
            target.close()
            sock.close()
        return True, 0, {}

    def close_port(self, port: int) -> int:
        """Cut every open relay to `port`; how many there were."""
        with self._lock:
            pairs = list(self._open.pop(port, set()))
        for pair in pairs:
            for end in pair:
                _shutdown(end, socket.SHUT_RDWR)
        return len(pairs)


def relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both directions have ended (an end's EOF is passed on as a
    half-close; an error ends both)."""
    other = threading.Thread(target=_copy, args=(b, a), name="port-relay", daemon=True)
    other.start()
    _copy(a, b)
    other.join()


def _copy(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(CHUNK_BYTES):
            sink.sendall(data)
    except OSError:
        _shutdown(source, socket.SHUT_RDWR)  # an error ends the relay both ways
        _shutdown(sink, socket.SHUT_RDWR)
        return
    _shutdown(sink, socket.SHUT_WR)


def _shutdown(sock: socket.socket, how: int) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass


def _require(request: Request, *methods: str) -> None:
    if request.method not in methods:
        raise HttpError(405, "METHOD_NOT_ALLOWED", f"{request.method} is not allowed on {request.path}")


def _check_upgrade(request: Request) -> None:
    upgrade = (request.header("upgrade") or "").lower()
    connection = {token.strip().lower() for token in (request.header("connection") or "").split(",")}
    if upgrade != UPGRADE or "upgrade" not in connection:
        raise bad_request(f"this path relays a TCP connection: send Upgrade: {UPGRADE} and Connection: Upgrade")
