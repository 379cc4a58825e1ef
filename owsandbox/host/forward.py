"""A local door to a Unix socket inside a box that is reached only by running commands in it.

For an `exec` box (ssh, docker exec, kubectl exec), the execd endpoint's socket lives in the box.
No port is opened anywhere: this bridge listens on a Unix socket in a private folder here, and for
each connection runs the box's `forward` relay through the provider's command prefix, copying bytes
both ways. To the channel it is just another Unix socket.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence

from ..box.daemonctl import listen_unix


class ForwardBridge:
    def __init__(self, relay_argv: Callable[[], Sequence[str]]) -> None:
        self._relay_argv = relay_argv
        self._folder = tempfile.mkdtemp(prefix="owsandbox-forward-")
        os.chmod(self._folder, 0o700)
        self.path = os.path.join(self._folder, "execd.sock")
        self._server = listen_unix(self.path, backlog=16)
        self._closed = False
        self._relays: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="forward-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            relay = subprocess.Popen(list(self._relay_argv()), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, bufsize=0, start_new_session=True)
        except OSError:
            conn.close()
            return
        with self._lock:
            self._relays.add(relay)
        assert relay.stdin and relay.stdout

        in_fd = relay.stdin.fileno()

        def upstream() -> None:  # our client → the box
            try:
                while data := conn.recv(65536):
                    view = memoryview(data)
                    while view:
                        view = view[os.write(in_fd, view):]
            except OSError:
                pass
            finally:
                try:
                    relay.stdin.close()  # type: ignore[union-attr]
                except OSError:
                    pass

        threading.Thread(target=upstream, daemon=True).start()
        out_fd = relay.stdout.fileno()
        try:
            while data := os.read(out_fd, 65536):
                conn.sendall(data)
        except OSError:
            pass
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
            relay.kill()
            relay.wait()
            relay.stdout.close()
            with self._lock:
                self._relays.discard(relay)

    def close(self) -> None:
        self._closed = True
        try:
            self._server.close()
        except OSError:
            pass
        with self._lock:
            relays = list(self._relays)
        for relay in relays:
            relay.kill()
        shutil.rmtree(self._folder, ignore_errors=True)
