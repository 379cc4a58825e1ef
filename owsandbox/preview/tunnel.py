"""A byte tunnel to a port in a box, through the box's execd endpoint (`GET /ports/{port}/tcp`).

The host opens it on the execd Unix socket the host itself made, with the token from the host's own
record of the sandbox (`terminal.locate`), never from anything the box wrote. The box makes the TCP
connection inside its own network namespace (`box/execd/portrelay.py`), so a port of the host cannot
be reached this way. `upgrade_request` and `read_answer` are the wire format; `open_tunnel` (blocking,
for the kernel's probe, `probe_port`, and the benchmark) and `open_tunnel_stream` (tornado, for the server's proxy)
use them, and `close_port` asks the box to cut every open relay to a port. A container's endpoint is
reached through a relay command the host recorded (`open_command_stream`), with the same handshake.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

UPGRADE = "owsandbox-tcp"  # as box/execd/portrelay.py answers it
MAX_HEAD_BYTES = 64 * 1024
CONNECT_TIMEOUT_SECONDS = 10.0
STREAM_BUFFER_BYTES = 4 * 1024 * 1024
RELAY_STDERR_BYTES = 1000  # of a relay command's stderr, kept for its error
PROBE_SETTLE_SECONDS = 2.0  # how long a probe waits for the server in the box to close after it
RELAY_END_SECONDS = 5.0  # how long a relay that closed is waited for, for its words


class TunnelRefused(RuntimeError):
    """The box would not relay to the port: `status` (502: nothing listens there) and its message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def upgrade_request(port: int, headers: Mapping[str, str]) -> bytes:
    """The request that turns an execd connection into a tunnel to `port` (headers: the token's)."""
    lines = [f"GET /ports/{int(port)}/tcp HTTP/1.1", "Host: localhost", "Connection: Upgrade", f"Upgrade: {UPGRADE}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def read_answer(head: bytes, body: bytes = b"") -> None:
    """Nothing when `head` (up to its blank line) is the box's 101; TunnelRefused with the box's words
    (its JSON `code` and `message`) otherwise."""
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise TunnelRefused(502, "BAD_ANSWER", f"the sandbox's execd endpoint answered {status_line[:80]!r}, not HTTP")
    status = int(parts[1])
    if status == 101:
        return
    code, message = "ERROR", body.decode("utf-8", "replace")[:500] or status_line
    try:
        said: Any = json.loads(body)
        if isinstance(said, dict):
            code, message = str(said.get("code", code)), str(said.get("message") or said.get("error") or message)
    except ValueError:
        pass
    if status == 404 and code == "NOT_FOUND":
        message = ("the sandbox's daemon has no port relay (it predates %preview): restart the kernel "
                   f"to start a daemon that has one ({message})")
    raise TunnelRefused(status, code, message)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return min(int(value.strip()), MAX_HEAD_BYTES)
    return 0


def open_tunnel(unix_socket: str, headers: Mapping[str, str], port: int,
                timeout: float = CONNECT_TIMEOUT_SECONDS) -> socket.socket:
    """A connected socket whose bytes are `port`'s in the box (blocking); TunnelRefused, or OSError
    when the endpoint cannot be reached."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(unix_socket)
        sock.sendall(upgrade_request(port, headers))
        data = b""
        while not data.endswith(b"\r\n\r\n"):  # byte by byte: nothing of the port's is read here
            chunk = sock.recv(1)
            if not chunk:
                raise TunnelRefused(502, "BAD_ANSWER", "the sandbox's execd endpoint closed without answering")
            data += chunk
            if len(data) > MAX_HEAD_BYTES:
                raise TunnelRefused(502, "BAD_ANSWER", "the sandbox's execd endpoint answered an oversized head")
        head = data[:-4]
        if not head.startswith(b"HTTP/1.1 101"):
            length, rest = _content_length(head), b""
            while len(rest) < length and (chunk := sock.recv(4096)):
                rest += chunk
            read_answer(head, rest)
        sock.settimeout(None)
        return sock
    except BaseException:
        sock.close()
        raise


def probe_port(unix_socket: str, headers: Mapping[str, str], port: int,
               settle: float = PROBE_SETTLE_SECONDS) -> None:
    """Whether something listens on `port` in the box (TunnelRefused, or OSError, if not), by a relay
    that is ended before this returns: the probe's end is passed on, and the server's close waited
    for (up to `settle` seconds, for a server that never closes), so that a `%preview stop` soon
    after counts only the connections of others, not a probe whose relay was still ending."""
    sock = open_tunnel(unix_socket, headers, port)
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + settle
        while (left := deadline - time.monotonic()) > 0:  # a server that talks on is not read for ever
            sock.settimeout(left)
            if not sock.recv(4096):
                break
    except OSError:
        pass  # the server is there; how its connection ends does not matter here
    finally:
        sock.close()


def close_port(unix_socket: str, headers: Mapping[str, str], port: int,
               timeout: float = CONNECT_TIMEOUT_SECONDS) -> int:
    """Ask the box to cut every open relay to `port`; how many it cut."""
    from ..channel.control import UnixHTTPConnection

    conn = UnixHTTPConnection(unix_socket, timeout=timeout)
    try:
        conn.request("DELETE", f"/ports/{int(port)}", headers=dict(headers))
        answer = conn.getresponse()
        body = answer.read(MAX_HEAD_BYTES)
    finally:
        conn.close()
    if answer.status != 200:
        read_answer(f"HTTP/1.1 {answer.status} -".encode(), body)
    return int(json.loads(body).get("closed", 0))


async def open_tunnel_stream(unix_socket: str, headers: Mapping[str, str], port: int) -> Any:
    """A tornado IOStream whose bytes are `port`'s in the box; TunnelRefused, or OSError when the
    endpoint cannot be reached."""
    from tornado.iostream import IOStream

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stream = IOStream(sock, max_buffer_size=STREAM_BUFFER_BYTES)
    return await _upgraded(stream, headers, port, stream.connect(unix_socket))


async def open_command_stream(argv: Sequence[str], env: Mapping[str, str], headers: Mapping[str, str],
                              port: int) -> Any:
    """The same through a relay command (a container's `ENGINE exec -i NAME ... forward`, whose stdin and
    stdout are the endpoint's bytes): it runs on one end of a socket pair, the IOStream is the other end.
    The command is killed when the stream closes, and reaped; its own end comes when the box closes the
    connection. A relay that ends without the box's answer (the container is gone, the engine refused)
    is a TunnelRefused with the last of what it said on stderr (at most RELAY_STDERR_BYTES are kept)."""
    import asyncio

    from tornado.iostream import IOStream

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = await asyncio.create_subprocess_exec(*argv, stdin=theirs, stdout=theirs,
                                                        stderr=asyncio.subprocess.PIPE, env=dict(env),
                                                        start_new_session=True)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    said = bytearray()
    reading = _keep(asyncio.ensure_future(_stderr_tail(process.stderr, said)))
    stream = IOStream(ours, max_buffer_size=STREAM_BUFFER_BYTES)

    def _end() -> None:
        if process.returncode is None:
            try:
                process.kill()
            except ProcessLookupError:
                pass
        _keep(asyncio.ensure_future(process.wait()))  # reaped, whenever it ends

    stream.set_close_callback(_end)
    try:
        return await _upgraded(stream, headers, port, None)
    except TunnelRefused as exc:
        if exc.code != "UNREACHABLE":
            raise
        try:  # its end and all it said
            status = await asyncio.wait_for(process.wait(), RELAY_END_SECONDS)
            await asyncio.wait_for(asyncio.shield(reading), RELAY_END_SECONDS)
        except asyncio.TimeoutError:
            status = process.returncode
        words = bytes(said).decode("utf-8", "replace").strip() or f"exit status {status}"
        raise TunnelRefused(502, "UNREACHABLE", f"the relay into the container ended without the box's answer "
                                                f"({words})") from None


_TASKS: set[Any] = set()  # the relays' stderr readers and reapers, held until done


def _keep(task: Any) -> Any:
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    return task


async def _stderr_tail(pipe: Any, said: bytearray) -> None:
    """Read the relay's stderr to its end (so it never blocks on it), keeping only its last bytes."""
    while chunk := await pipe.read(4096):
        said += chunk
        del said[:-RELAY_STDERR_BYTES]


async def _upgraded(stream: Any, headers: Mapping[str, str], port: int, connecting: Any) -> Any:
    """`stream`, once connected (`connecting`, if it is not yet) and turned into the port's bytes."""
    from tornado.iostream import StreamClosedError

    try:
        if connecting is not None:
            await connecting
        await stream.write(upgrade_request(port, headers))
        head = await stream.read_until(b"\r\n\r\n", max_bytes=MAX_HEAD_BYTES)
        if not head.startswith(b"HTTP/1.1 101"):
            length = _content_length(head)
            body = await stream.read_bytes(length) if length else b""
            read_answer(head[:-4], body)
        return stream
    except StreamClosedError as exc:
        stream.close()
        raise TunnelRefused(502, "UNREACHABLE", f"the sandbox's execd endpoint closed: {exc.real_error or exc}") \
            from None
    except BaseException:
        stream.close()
        raise
