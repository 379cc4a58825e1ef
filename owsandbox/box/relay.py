"""The `attach` relay: the only process a provider has to run per pipe.

It copies bytes between its stdin/stdout and the daemon's Unix socket and never parses them. A
provider may leave it running after the client's end of the pipe is gone, so it leaves by itself
when the client has been silent for `silence_seconds`. Its real stdout is kept for frames alone:
anything printed by mistake goes to stderr.

It idles for the whole life of its kernel, so it imports little: `_socket`, the C module under
`socket` (the same socket object without the enums and file wrappers, whose imports were a sixth
of an idle relay's private memory), and the daemon's modules only to start a daemon (`--start`).
"""

from __future__ import annotations

import _socket
import os
import select
import sys
import time

CANNOT_CONNECT = 2


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def attach(socket_path: str, silence_seconds: float = 0, half_close: bool = False,
           start_args: list[str] | None = None) -> int:
    """Relay until either side ends. With `half_close` (for `forward`, one request per connection),
    the end of stdin only ends our sending; the answer is still relayed until the socket closes.
    With `start_args`, a daemon that is not there is started first (`serve` with those arguments)."""
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints can no longer reach the client's stream
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(socket_path)
    except OSError as exc:
        if start_args is None:
            sys.stderr.write(f"owsandbox relay: cannot connect to the runner at {socket_path}: {exc}\n")
            return CANNOT_CONNECT
        # A box reached only through commands has nobody else to notice that its daemon died; the
        # next relay starts a new one (the layout of the providers: STATE/run/runner.sock), and the
        # client sees a new instance.
        from . import daemonctl

        try:
            daemonctl.start(os.path.dirname(os.path.dirname(socket_path)), start_args)
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            sock.connect(socket_path)
        except daemonctl.DaemonError as exc:
            sys.stderr.write(f"owsandbox relay: cannot start a runner at {socket_path}: {exc}\n")
            return CANNOT_CONNECT
        except OSError as again:
            sys.stderr.write(f"owsandbox relay: started a runner at {socket_path}, but cannot connect: {again}\n")
            return CANNOT_CONNECT
    in_fd = 0
    sock_fd = sock.fileno()
    last_heard = time.monotonic()
    watching = [in_fd, sock_fd]
    while True:
        timeout = None
        if silence_seconds > 0:
            timeout = max(0.0, last_heard + silence_seconds - time.monotonic())
        ready, _, _ = select.select(watching, [], [], timeout)
        if not ready:
            sys.stderr.write(f"owsandbox relay: the client was silent for {silence_seconds:g} s; leaving\n")
            return 0
        if sock_fd in ready:
            data = sock.recv(262144)
            if not data:
                return 0  # the daemon closed: a newer connection won, or it stopped
            try:
                _write_all(out_fd, data)
            except OSError:
                return 0  # nobody reads us any more
        if in_fd in ready:
            data = os.read(in_fd, 262144)
            if not data:
                if not half_close:
                    return 0
                sock.shutdown(_socket.SHUT_WR)
                watching = [sock_fd]
                continue
            last_heard = time.monotonic()
            try:
                sock.sendall(data)
            except OSError:
                return 0
