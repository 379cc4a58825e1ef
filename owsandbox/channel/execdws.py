"""execd's PTY WebSocket, written once: its frames, its control messages, how to connect, how to close.

Two clients speak it: the `%attach` channel (`channel.py`, asyncio) and the runner's pipe to the
daemon (`runner/wstransport.py`, threads). Following python-websockets' own layering, what they
share lives here and they keep only their I/O style:

* a sans-I/O core that never touches a socket, so tests feed it bytes: the binary frame kinds and
  their encoding (`encode_frame`, `stdin_frames`) and decoding (`decode_frame`), the JSON control
  messages (`parse_control`, `signal_message`), the mapping of a refused handshake to our errors
  (`handshake_error`), and the rule that ends a connection (`close_handshake_done`);
* two thin openers over websockets, `open_async` (asyncio) and `open_sync` (threads), with the same
  options (no proxy, no compression, keepalive pings, websockets 17's `legacy` flag) and the same
  workaround for execd's way of closing; and `close_async`, the bounded closing handshake.

The wire, as OpenSandbox's execd defines it (`components/execd`, `GET /pty/{id}/ws`):

* binary frames start with a kind byte: 0x00 STDIN (client to execd) then data; 0x01 STDOUT and
  0x02 STDERR then data; 0x03 REPLAY, an 8-byte big-endian output offset, then the buffered bytes
  (stdout and stderr mixed, from that offset on);
* text frames are JSON objects: from execd `connected` (with `mode`, "pipe" or "pty"), `exit`
  (with `exit_code`), `error` (with `code` and `error`), `pong`; to execd `signal`, `resize`,
  `stdin`, `ping`. Text that is not a JSON object is ignored, by execd and by us.

The box serves the same API from inside the sandbox (`box/execd/endpoint.py`). It may import nothing
but the standard library, so it keeps its own copy of the kind bytes (`box/execd/ptysessions.py`);
tests/test_channel_execdws.py holds the two sides equal.

The close quirk: RFC 6455 lets a client wait for the server to close TCP after the closing
handshake, and websockets does; execd answers a Close but never closes TCP, and websockets, as a
client, only notices the peer's Close once TCP is gone (`recv()` keeps waiting). So each opener
starts a watcher that closes the connection as soon as both Close frames have crossed, whichever
side spoke first: an exit, a takeover (4001) or a detach is then seen at once instead of after a
timeout. websockets offers no event for "the peer's Close arrived", and overriding its connection
classes' hooks would tie us to its private methods, so the watcher polls the state: every
`IDLE_POLL_SECONDS` while open, every `CLOSE_POLL_SECONDS` once our Close is out. What it reads of
websockets beyond the documented API is listed above `close_handshake_done`, and
tests/test_channel_execdws.py fails when websockets changes any of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.asyncio.client import connect as async_connect
from websockets.asyncio.client import unix_connect as async_unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.protocol import Protocol, State
from websockets.sync.client import ClientConnection as SyncConnection
from websockets.sync.client import connect as sync_connect
from websockets.sync.client import unix_connect as sync_unix_connect

from .control import http_error
from .endpoint import ExecdEndpoint
from .errors import BadFrame, ExecdError, ExecdHTTPError, ExecdUnreachable

# ── the frames ───────────────────────────────────────────────────────────────────────────────────

STDIN = 0x00
STDOUT = 0x01
STDERR = 0x02
REPLAY = 0x03
REPLAY_HEADER_BYTES = 1 + 8  # the kind, then the offset

CLOSE_TAKEN_OVER = 4001  # execd's close code for a connection another client took over
CLOSE_POLICY_VIOLATION = 1008  # how OpenSandbox's server proxy reports a WebSocket that execd refused
SIGNALS = frozenset({"SIGINT", "SIGTERM", "SIGKILL", "SIGQUIT", "SIGHUP"})

# WebSocket pings from our side; execd also pings every 30 s and drops a client silent for 60 s.
KEEPALIVE_SECONDS = 20.0
# How long a Close waits for execd's answer before the connection is cut.
CLOSE_TIMEOUT_SECONDS = 2.0
# How often the close watcher looks whether both Close frames have crossed.
CLOSE_POLL_SECONDS = 0.02  # once our Close is out: the closing handshake is short
IDLE_POLL_SECONDS = 0.2  # before: a peer's Close (exit, takeover) is seen within this; an idle
                         # attached program costs the kernel 5 wake-ups a second, not 50


@dataclass(frozen=True, slots=True)
class Frame:
    """One binary message from execd: `kind`, `offset` (REPLAY only, else None), and its data.

    The data is `message[start:]`; a decoder that reads in place uses `message` and `start` instead
    of `data`, which copies."""

    kind: int
    offset: int | None
    message: bytes
    start: int

    @property
    def data(self) -> bytes:
        return self.message[self.start:]

    @property
    def size(self) -> int:
        """How many output bytes the frame carries (what execd's offset counter advanced by)."""
        return len(self.message) - self.start


def decode_frame(message: bytes) -> Frame:
    """A binary message from execd as a `Frame`; `BadFrame` for what execd never sends to a client
    (an empty message, a REPLAY too short for its offset, any other kind, STDIN included)."""
    if not message:
        raise BadFrame("execd sent an empty binary frame")
    kind = message[0]
    if kind in (STDOUT, STDERR):
        return Frame(kind, None, message, 1)
    if kind == REPLAY:
        if len(message) < REPLAY_HEADER_BYTES:
            raise BadFrame(f"a REPLAY frame of {len(message)} bytes has no room for its 8-byte offset")
        return Frame(REPLAY, int.from_bytes(message[1:REPLAY_HEADER_BYTES], "big"), message, REPLAY_HEADER_BYTES)
    raise BadFrame(f"a binary frame of kind 0x{kind:02x}, which execd never sends to a client "
                   "(1 stdout, 2 stderr, 3 replay)")


def encode_frame(kind: int, data: bytes | bytearray | memoryview = b"", *, offset: int | None = None) -> bytes:
    """The binary message for `kind` and `data`; a REPLAY takes the output `offset` of its first byte."""
    if kind == REPLAY:
        if offset is None or not 0 <= offset < 1 << 64:
            raise ValueError(f"a REPLAY frame needs an offset from 0 to 2**64-1, not {offset!r}")
        return bytes([REPLAY]) + offset.to_bytes(8, "big") + data
    if kind not in (STDIN, STDOUT, STDERR):
        raise ValueError(f"no frame kind 0x{kind:02x}: 0 stdin, 1 stdout, 2 stderr, 3 replay")
    if offset is not None:
        raise ValueError("only a REPLAY frame has an offset")
    return bytes([kind]) + data


def stdin_frames(data: bytes | bytearray | memoryview, chunk_bytes: int) -> Iterator[bytes]:
    """`data` for the program's stdin as STDIN frames of at most `chunk_bytes` data each (none for b"")."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
    view = memoryview(data)
    for start in range(0, len(view), chunk_bytes):
        yield encode_frame(STDIN, view[start:start + chunk_bytes])


# ── the control messages ─────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Connected:
    """execd started (or found) the program and attached this connection; `mode` is "pipe" or "pty"
    (None when execd did not say)."""

    mode: str | None


@dataclass(frozen=True, slots=True)
class Exited:
    """The program ended; `exit_code` is -1 when execd gave none (killed by a signal)."""

    exit_code: int


@dataclass(frozen=True, slots=True)
class ServerError:
    """An `error` message: `code` (SESSION_GONE, START_FAILED, TAKEN_OVER, ...) and its text."""

    code: str
    message: str


Control = Connected | Exited | ServerError


def control_frame(text: str) -> dict[str, Any] | None:
    """execd's text frame as a JSON object, or None: text that is not one is ignored, as execd does."""
    try:
        frame = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return frame if isinstance(frame, dict) else None


def parse_control(text: str) -> Control | None:
    """The control message in a text frame; None for text that is not one and for messages that need
    nothing from a client (`pong`, and types added later)."""
    frame = control_frame(text)
    if frame is None:
        return None
    kind = frame.get("type")
    if kind == "connected":
        mode = frame.get("mode")
        return Connected(mode if isinstance(mode, str) else None)
    if kind == "exit":
        code = frame.get("exit_code")
        return Exited(code if isinstance(code, int) else -1)
    if kind == "error":
        return ServerError(str(frame.get("code") or "RUNTIME_ERROR"),
                           str(frame.get("error") or frame.get("message") or ""))
    return None


def start_line(command: str) -> bytes:
    """The first stdin bytes of a session that runs `command`: `exec bash --norc --noprofile -c CMD`.

    Every released execd (v1.0.10 to v1.0.18, `model/pty.go`) decodes only `cwd` from `POST /pty`:
    the session is a bare `bash --norc --noprofile` that reads its commands from stdin. bash reads
    a pipe one byte at a time, so it takes this one line, replaces itself with the program, and the
    rest of stdin is the program's. `bash -c` runs the command as execd's main branch would (its
    `command` field) and as the box's own endpoint does; the quoting keeps a command with newlines
    or quotes one line."""
    if not command.strip():
        raise ValueError("a session needs a command to start")
    return f"exec bash --norc --noprofile -c {shlex.quote(command)}\n".encode()


def signal_message(name: str) -> str:
    """The text frame that signals the program's process group (`INT` or `SIGINT`, any case)."""
    signal = name.upper()
    signal = signal if signal.startswith("SIG") else "SIG" + signal
    if signal not in SIGNALS:
        raise ValueError(f"execd sends only {', '.join(sorted(SIGNALS))}, not {name!r}")
    return json.dumps({"type": "signal", "signal": signal})


# ── connecting ───────────────────────────────────────────────────────────────────────────────────

# What may go wrong while opening: nothing answered, or not as a WebSocket server (InvalidStatus, an
# InvalidHandshake, is an HTTP answer: `handshake_error` turns it into ours).
HANDSHAKE_FAILURES = (OSError, asyncio.TimeoutError, InvalidHandshake, InvalidURI)


def connect_options(connect: Callable[..., Any], endpoint: ExecdEndpoint, *, open_timeout: float,
                    close_timeout: float, keepalive: float | None, max_size: int | None) -> dict[str, Any]:
    """The keyword arguments for websockets' `connect` (asyncio or sync), whichever websockets ≥ 13 is
    installed: options it does not know are left out."""
    wanted: dict[str, Any] = {
        "additional_headers": dict(endpoint.headers), "compression": None, "open_timeout": open_timeout,
        "close_timeout": close_timeout, "max_size": max_size, "ping_interval": keepalive, "ping_timeout": keepalive,
        "proxy": None,  # websockets ≥ 15 would go through HTTP(S)_PROXY; the HTTP control calls never do
        "legacy": True,  # sync, websockets ≥ 17.1: a connection, not a reconnecting iterator, and no warning
    }
    known = inspect.signature(connect).parameters
    return {name: value for name, value in wanted.items() if name in known}


def handshake_error(endpoint: ExecdEndpoint, path: str, exc: BaseException) -> ExecdError:
    """Our error for a failed opening handshake: the `ExecdHTTPError` kind for execd's HTTP status
    (401, 404, 409, ...), with its body; `ExecdUnreachable` for anything else."""
    if isinstance(exc, InvalidStatus):
        response = exc.response
        return http_error("GET", path, response.status_code, response.body or b"", has_token=endpoint.has_token)
    return ExecdUnreachable(f"cannot open the WebSocket to execd at {endpoint.describe()} for {path}: "
                            f"{type(exc).__name__}: {exc}")


async def open_async(endpoint: ExecdEndpoint, path: str, query: Mapping[str, str], *, open_timeout: float,
                     keepalive: float | None, max_size: int | None,
                     close_timeout: float = CLOSE_TIMEOUT_SECONDS) -> AsyncConnection:
    """The asyncio WebSocket to `path?query`, with its close watcher running until `close_async`.

    Raises `ExecdHTTPError` kinds when execd refuses and `ExecdUnreachable` when nothing answers."""
    uri = endpoint.websocket_uri(f"{path}?{urlencode(query)}")
    options = connect_options(async_connect, endpoint, open_timeout=open_timeout, close_timeout=close_timeout,
                              keepalive=keepalive, max_size=max_size)
    try:
        if endpoint.unix_socket is not None:
            ws = await async_unix_connect(endpoint.unix_socket, uri, **options)
        else:
            ws = await async_connect(uri, **options)
    except HANDSHAKE_FAILURES as exc:
        error = handshake_error(endpoint, path, exc)
        raise error from (None if isinstance(error, ExecdHTTPError) else exc)  # a refusal says it all
    watcher = asyncio.get_running_loop().create_task(_watch_async(ws), name="execd close watcher")
    _async_watchers[ws] = watcher
    watcher.add_done_callback(lambda _: _async_watchers.pop(ws, None))
    return ws


def open_sync(endpoint: ExecdEndpoint, path: str, query: Mapping[str, str], *, open_timeout: float,
              keepalive: float | None, max_size: int | None,
              close_timeout: float = CLOSE_TIMEOUT_SECONDS) -> SyncConnection:
    """The threaded WebSocket to `path?query`, with its close watcher (a thread that ends with the
    connection). Raises like `open_async`."""
    uri = endpoint.websocket_uri(f"{path}?{urlencode(query)}")
    options = connect_options(sync_connect, endpoint, open_timeout=open_timeout, close_timeout=close_timeout,
                              keepalive=keepalive, max_size=max_size)
    try:
        if endpoint.unix_socket is not None:
            ws = sync_unix_connect(endpoint.unix_socket, uri, **options)
        else:
            ws = sync_connect(uri, **options)
    except HANDSHAKE_FAILURES as exc:
        error = handshake_error(endpoint, path, exc)
        raise error from (None if isinstance(error, ExecdHTTPError) else exc)  # a refusal says it all
    threading.Thread(target=_watch_sync, args=(ws,), name="execd-close-watcher", daemon=True).start()
    return ws


# ── closing ──────────────────────────────────────────────────────────────────────────────────────

# What of websockets is used beyond its documented API (each is held in place by a test in
# tests/test_channel_execdws.py, which fails when websockets changes it):
# * `Connection.protocol` (asyncio and sync): the sans-I/O protocol the connection was built with;
# * `Protocol.close_sent` / `Protocol.close_rcvd`: the Close frames sent and received, None before;
# * asyncio `Connection.transport`: closed (which flushes our Close answer first) or aborted;
# * asyncio `Connection.close_timeout`: set again at each close, so that the value of the moment counts;
# * sync `Connection.socket`: waited on for room to write (wstransport) and shut down by a kill;
# * sync `Connection.close_socket()`: closes the socket and ends websockets' reading thread.


def close_handshake_done(protocol: Protocol) -> bool:
    """Both Close frames have crossed, in either order: the WebSocket is over and only TCP is left,
    which execd never closes, so the client must."""
    return protocol.close_sent is not None and protocol.close_rcvd is not None


def _poll_interval(protocol: Protocol) -> float:
    return CLOSE_POLL_SECONDS if protocol.close_sent is not None else IDLE_POLL_SECONDS


async def _watch_async(ws: AsyncConnection) -> None:
    while ws.state is not State.CLOSED:
        if close_handshake_done(ws.protocol):
            # Within one callback websockets noted the peer's Close and wrote our answer; close()
            # sends what is buffered before it closes.
            ws.transport.close()
            return
        await asyncio.sleep(_poll_interval(ws.protocol))


_async_watchers: dict[AsyncConnection, asyncio.Task[None]] = {}


def _watch_sync(ws: SyncConnection) -> None:
    seen = False
    while ws.protocol.state is not State.CLOSED:  # the sync connection has `state` from websockets 14.2 on
        if close_handshake_done(ws.protocol):
            if seen:
                ws.close_socket()
                return
            # websockets' reading thread notes the peer's Close and writes our answer while holding
            # its lock; one more poll lets that write finish before the socket goes.
            seen = True
        time.sleep(CLOSE_POLL_SECONDS if seen else _poll_interval(ws.protocol))


async def close_async(ws: AsyncConnection, timeout: float) -> None:
    """The closing handshake, without waiting for a FIN that execd never sends; bounded for a silent
    peer, which is cut off after `timeout`.

    Frames still arriving are read and dropped meanwhile (a reader's cursor does not count them, so
    a later connection replays them), or websockets' flow control would stop reading before the
    Close answer."""
    ws.close_timeout = timeout  # read now, so that a value patched by a test counts
    drain = asyncio.create_task(_discard(ws))
    try:
        await asyncio.wait_for(ws.close(), timeout + 1.0)
    except (asyncio.TimeoutError, OSError):
        pass
    finally:
        if ws.state is not State.CLOSED:
            ws.transport.abort()
        drain.cancel()
        await asyncio.wait({drain})
        watcher = _async_watchers.pop(ws, None)
        if watcher is not None:
            watcher.cancel()


async def _discard(ws: AsyncConnection) -> None:
    with contextlib.suppress(ConnectionClosed):
        while True:
            await ws.recv()
