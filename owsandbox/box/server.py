"""The daemon's socket: one Unix socket in a private folder, one client at a time.

The newest connection wins: a reconnecting client replaces a pipe that died without telling anyone,
and the older connection is closed. Each connection is read on a thread of its own; its lines are
decoded and handed to `on_message` in order, on that thread. A frame over the size limit is
answered here (nothing in it is run); what a message means is the dispatcher's business.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from .. import protocol as P
from .daemonctl import AlreadyServing, listen_unix
from .log import getLogger

log = getLogger(__name__)


class Connection:
    """One client pipe. Sends are serialised; a failed send closes the connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.closed = False

    def send(self, frame: bytes) -> bool:
        with self.lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(frame)
                return True
            except OSError:
                self._close_locked()
                return False

    def close(self) -> None:
        with self.lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()


class SocketServer:
    def __init__(self, socket_path: str, on_message: Callable[[Connection, dict[str, Any]], None],
                 max_frame_bytes: int = P.DEFAULT_MAX_FRAME_BYTES, listen_fd: int | None = None) -> None:
        self.socket_path = socket_path
        self.max_frame_bytes = max_frame_bytes
        self._on_message = on_message
        self._lock = threading.Lock()  # the current connection
        self._conn: Connection | None = None
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        # A socket made by whoever started the box: it connects to a file the box cannot replace.
        self._given_listener = socket.socket(fileno=listen_fd) if listen_fd is not None else None

    def listen(self) -> None:
        """Make the socket's folder private and listen (on the given socket, if there is one)."""
        folder = os.path.dirname(self.socket_path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        if self._given_listener is not None:
            self._listener = self._given_listener
            return
        try:
            self._listener = listen_unix(self.socket_path, backlog=16)
        except AlreadyServing:
            raise SystemExit(f"a runner daemon is already serving {self.socket_path}") from None

    @property
    def has_client(self) -> bool:
        return self._conn is not None

    def send_live(self, frame: bytes) -> None:
        """Send to the current client, if there is one (what it misses is its loss, or the outbox's)."""
        conn = self._conn
        if conn is not None:
            conn.send(frame)

    def serve_forever(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                raise
            conn = Connection(sock)
            with self._lock:
                old, self._conn = self._conn, conn
            log.debug("a client connected%s", "; the older connection is closed" if old is not None else "")
            if old is not None:
                old.close()  # the newest connection wins
            threading.Thread(target=self._read_connection, args=(conn,), daemon=True).start()

    def close(self) -> None:
        """Stop accepting, remove the socket file (unless it was given) and close the client's pipe."""
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        if self._given_listener is None:
            try:
                os.unlink(self.socket_path)
            except OSError:
                pass
        with self._lock:
            conn = self._conn
        if conn is not None:
            conn.close()

    def _read_connection(self, conn: Connection) -> None:
        splitter = P.LineSplitter(self.max_frame_bytes)
        while not conn.closed:
            try:
                data = conn.sock.recv(262144)
            except OSError:
                break
            if not data:
                break
            for line in splitter.feed(data):
                if isinstance(line, P.Oversize):
                    self._reject_oversize(conn, line)
                    continue
                message = P.decode(line)
                if message is not None:
                    self._on_message(conn, message)
        with self._lock:
            if self._conn is conn:
                self._conn = None
        conn.close()

    def _reject_oversize(self, conn: Connection, line: P.Oversize) -> None:
        request_id = P.sniff_id(line.head)
        conn.send(P.encode(P.error(request_id, P.INVALID_REQUEST,
                                   f"frame of {line.size} bytes is larger than the limit of "
                                   f"{self.max_frame_bytes} bytes; nothing was run")))
