"""The host's copy of what a sandbox writes on its stderr, kept to a bounded size.

A daemon whose stderr was the host's log file itself handed that file to the box: bubblewrap's init
and the daemon held it open, and anything in the box that could open `/proc/<pid>/fd/2` appended to
the host's file without bound. Now their stderr is a pipe and the host writes the file: what the box
says lands there (it is the box's own log, shown only as text), the file never grows past twice
`keep`, and nothing in the box holds a host file. A reader that is gone (the kernel ended while its
daemon lingers) costs the daemon nothing but the lines: Python ignores SIGPIPE and logging drops
what it cannot write.

Anything in the box that reaches the pipe (`/proc/1/fd/2`, the daemon's own messages about the box's
shells and files) may write whatever it likes, host messages imitated included. So every line from
the pipe is written marked as the box's (`BOX_MARK` at its start, a carriage return a line break, so
that no line can hide its mark on a terminal): wherever the file is shown (a start-up error quotes its
end, a person reads it), the box's words say whose they are. bubblewrap's own messages share the
pipe and are marked too: the mark says "came through the box's pipe", which is what can be known.
The host's own line (`DROPPED`) is not marked.
"""

from __future__ import annotations

import os
import threading

DEFAULT_KEEP = 1 << 20  # the last MiB is what the error messages and a person need
DROPPED = b"[owsandbox: earlier lines of this log were dropped to keep it small]\n"
BOX_MARK = b"box| "  # the start of every line the box wrote


class BoxLines:
    """Marks the lines of a byte stream as the box's, chunk by chunk (a line may span chunks)."""

    def __init__(self) -> None:
        self._at_line_start = True
        self._after_cr = False  # the chunk before ended with \r: a \n starting this one is its CRLF's

    def mark(self, chunk: bytes) -> bytes:
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._after_cr = chunk.endswith(b"\r")
        if not chunk:
            return b""
        chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        ends = chunk.endswith(b"\n")
        body = chunk[:-1] if ends else chunk
        marked = (BOX_MARK if self._at_line_start else b"") + body.replace(b"\n", b"\n" + BOX_MARK)
        self._at_line_start = ends
        return marked + (b"\n" if ends else b"")


def kept_tail(data: bytes, keep: int) -> bytes:
    """The last `keep` bytes of `data` or fewer, starting at a line, marked as cut when anything went."""
    if len(data) <= keep:
        return data
    tail = data[len(data) - keep:]
    newline = tail.find(b"\n")
    if 0 <= newline < len(tail) - 1:
        tail = tail[newline + 1:]
    return DROPPED + tail


class LogPump:
    """Copies a pipe into the host's log file on a thread of its own until every writer is gone."""

    def __init__(self, read_fd: int, path: str, keep: int = DEFAULT_KEEP) -> None:
        self.read_fd = read_fd
        self.path = path
        self.keep = keep
        self._thread = threading.Thread(target=self._run, name="sandbox-log", daemon=True)

    def start(self) -> LogPump:
        self._thread.start()
        return self

    def settle(self, timeout: float) -> bool:
        """Wait until the pipe's writers are gone and all they wrote is in the file (or `timeout`)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            out = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            out = None  # the state folder is gone: drain the pipe all the same, so no writer blocks
        lines = BoxLines()
        try:
            size = os.fstat(out).st_size if out is not None else 0
            while chunk := os.read(self.read_fd, 65536):
                if out is None:
                    continue
                chunk = lines.mark(chunk)
                os.write(out, chunk)
                size += len(chunk)
                if size > 2 * self.keep:
                    size = self._shrink(out, size)
        except OSError:
            pass
        finally:
            os.close(self.read_fd)
            if out is not None:
                os.close(out)

    def _shrink(self, out: int, size: int) -> int:
        tail = kept_tail(os.pread(out, self.keep + 1, size - self.keep - 1), self.keep)  # size > 2 * keep
        os.ftruncate(out, 0)
        os.write(out, tail)  # O_APPEND: at the new end, which is 0
        return len(tail)


__all__ = ["BOX_MARK", "DEFAULT_KEEP", "BoxLines", "LogPump", "kept_tail"]
