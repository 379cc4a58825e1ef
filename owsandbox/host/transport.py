"""A pipe to the daemon: a relay process whose stdin and stdout carry frames.

Every provider comes down to this: a command that runs `attach` in the box with its stdin and
stdout wired to us. Its stderr is drained into a short tail, so a relay that cannot start says why.
"""

from __future__ import annotations

import math
import os
import select
import subprocess
import threading
from collections import deque
from collections.abc import Sequence


class PipeTransport:
    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, bufsize=0, start_new_session=True,
        )
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self._out_fd = self.proc.stdout.fileno()
        self._in_fd = self.proc.stdin.fileno()
        self._tail: deque[bytes] = deque(maxlen=64)
        self._write_lock = threading.Lock()
        self.closed = False
        self._drain = threading.Thread(target=self._drain_stderr, name="relay-stderr", daemon=True)
        self._drain.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr
        try:
            for line in iter(self.proc.stderr.readline, b""):
                self._tail.append(line)
        except (OSError, ValueError):
            pass

    def stderr_tail(self) -> str:
        return b"".join(self._tail).decode("utf-8", "replace").strip()

    def send(self, data: bytes) -> None:
        """Write all of `data`; raises OSError when the pipe is gone."""
        with self._write_lock:
            view = memoryview(data)
            while view:
                written = os.write(self._in_fd, view)
                view = view[written:]

    def read(self, timeout: float | None = None) -> bytes:
        """The next chunk from the relay; b"" once it has ended. With `timeout`, TimeoutError when
        nothing came in time (the hello is waited for so; the pump reads without one)."""
        if timeout is not None:
            poller = select.poll()  # not select(): a busy kernel's descriptors may be above 1024
            poller.register(self._out_fd, select.POLLIN)
            if not poller.poll(max(0, math.ceil(timeout * 1000))):
                raise TimeoutError(f"nothing from the relay within {timeout:g} s")
        try:
            return os.read(self._out_fd, 1 << 20)
        except OSError:
            return b""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for stream in (self.proc.stdin,):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drain.join(1)
        for stream in (self.proc.stdout, self.proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def kill(self) -> None:
        """Cut the pipe abruptly (as a lost network would)."""
        try:
            self.proc.kill()
        except OSError:
            pass
