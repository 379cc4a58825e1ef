"""What a shell prints, taken apart: end markers, the live view, and the record.

* `MarkerScanner` finds the end-of-command marker lines that the shell prints after each command,
  holding back only bytes that could still turn out to be the start of one.
* `LiveBatcher` turns output into live `shell.output` frames, batched by time and size. It keeps
  runs of stdout and stderr apart and in order, and it never sends anything for a command that ends
  within the first delay: for a quick command the record says it all.
* `OutputRecord` is the result's `output`: everything in arrival order up to a cap kept in memory
  (head and tail), everything beyond spilled to a log file, with the runs of each stream noted so
  that a client can split the record back into stdout and stderr.

Pure classes fed bytes and times; the only I/O is the log file handed to `OutputRecord`.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Callable
from typing import IO, Any

MARKER_START = b"\x1f\x1eOWS:"
_MAX_MARKER = 16384  # a marker line carries a token, a status and a folder


class MarkerScanner:
    """Splits one stream into ("data", chunk) and ("marker", payload) events, in order.

    A marker is `start` + payload + newline. Works on bytes (the shell's end markers) and on text
    (the kernel's display requests) alike.
    """

    def __init__(self, start: Any = MARKER_START) -> None:
        self.start = start
        self._held = start[:0]

    def feed(self, data: Any) -> list[tuple[str, Any]]:
        start_seq = self.start
        newline = "\n" if isinstance(start_seq, str) else b"\n"
        buf = self._held + data if self._held else data
        self._held = start_seq[:0]
        events: list[tuple[str, Any]] = []
        pos = 0
        while True:
            start = buf.find(start_seq, pos)
            if start < 0:
                keep = _partial_start(buf, pos, start_seq)
                self._push(events, buf[pos:keep])
                self._held = buf[keep:]
                return events
            end = buf.find(newline, start)
            if end < 0:
                if len(buf) - start > _MAX_MARKER:  # not one of ours: let it through
                    self._push(events, buf[pos : start + 1])
                    pos = start + 1
                    continue
                self._push(events, buf[pos:start])
                self._held = buf[start:]
                return events
            self._push(events, buf[pos:start])
            events.append(("marker", buf[start + len(start_seq) : end]))
            pos = end + 1

    def flush(self) -> Any:
        """Whatever was held back, for a stream that has ended."""
        held, self._held = self._held, self.start[:0]
        return held

    @staticmethod
    def _push(events: list[tuple[str, Any]], chunk: Any) -> None:
        if chunk:
            events.append(("data", chunk))


def _partial_start(buf: Any, pos: int, start_seq: Any) -> int:
    """Where a trailing proper prefix of `start_seq` begins, or len(buf) if there is none."""
    first = start_seq[:1]
    idx = buf.find(first, max(pos, len(buf) - len(start_seq) + 1))
    while idx >= 0:
        if start_seq.startswith(buf[idx:]):
            return idx
        idx = buf.find(first, idx + 1)
    return len(buf)


class StreamDecoder:
    """UTF-8 decoding of one stream across reads; bytes that are not UTF-8 become U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, data: bytes, final: bool = False) -> str:
        return self._decoder.decode(data, final)


class LiveBatcher:
    """Live frames for one command. `offset` counts characters of the combined output."""

    def __init__(self, delay: float = 0.003, max_chars: int = 64 * 1024, max_runs: int = 64) -> None:
        self.delay = delay
        self.max_chars = max_chars
        self.max_runs = max_runs
        self._runs: list[list[Any]] = []  # [stream, [texts], offset]
        self._pending_chars = 0
        self._first_at: float | None = None
        self.offset = 0  # characters handed to the batcher so far

    def add(self, stream: str, text: str, now: float) -> list[dict[str, Any]]:
        if not text:
            return []
        if self._runs and self._runs[-1][0] == stream:
            self._runs[-1][1].append(text)
        else:
            self._runs.append([stream, [text], self.offset])
        self.offset += len(text)
        self._pending_chars += len(text)
        if self._first_at is None:
            self._first_at = now
        if self._pending_chars >= self.max_chars or len(self._runs) >= self.max_runs:
            return self.flush()
        return self.due(now)

    def deadline(self) -> float | None:
        """When the pending output must go out, or None when nothing is pending."""
        return None if self._first_at is None else self._first_at + self.delay

    def due(self, now: float) -> list[dict[str, Any]]:
        if self._first_at is not None and now >= self._first_at + self.delay:
            return self.flush()
        return []

    def flush(self) -> list[dict[str, Any]]:
        frames = [{"stream": s, "text": "".join(texts), "offset": off} for s, texts, off in self._runs]
        self.discard()
        return frames

    def discard(self) -> None:
        self._runs = []
        self._pending_chars = 0
        self._first_at = None


class OutputRecord:
    """The command's output as kept for its result, with memory bounded by `limit` characters.

    Up to `limit` characters everything is kept. Past it, the first and last `limit // 2` are kept,
    and the whole output (raw bytes) goes to a log file opened by `open_log()`. The log's folder has a
    size (the box's /run): when it is full the log stops there, the record says so, and the command and
    its shell go on.
    """

    MAX_SEGMENTS = 4096

    def __init__(self, limit: int, open_log: Callable[[], tuple[str, IO[bytes]]]) -> None:
        self.limit = max(limit, 2)
        self._open_log = open_log
        self._parts: list[str] = []
        self._chars = 0
        self.total_chars = 0
        self._raw: list[bytes] | None = []  # raw bytes, until spilled
        self.output_bytes = 0
        self.segments: list[list[Any]] | None = []
        self.log_path: str | None = None
        self._log: IO[bytes] | None = None
        self._tail: deque[str] = deque()
        self._tail_chars = 0
        self.omitted = 0
        self.tail_chars = 0  # of a truncated record: how much of its end is the output's last characters
        self.log_error: str | None = None  # why the log stopped before the output's end

    @property
    def truncated(self) -> bool:
        return self._log is not None or self.log_path is not None

    def add(self, stream: str, raw: bytes, text: str) -> None:
        self.output_bytes += len(raw)
        self.total_chars += len(text)
        if self._log is not None:
            self._write_log(raw)
            self._keep_tail(text)
            return
        if self.log_path is not None:  # the log stopped (full): only the tail is kept now
            self._keep_tail(text)
            return
        assert self._raw is not None
        self._raw.append(raw)
        if self._chars + len(text) <= self.limit:
            self._parts.append(text)
            self._chars += len(text)
            self._note_segment(stream, len(text))
            return
        self._spill()
        head_room = self.limit // 2 - self._chars
        if head_room < 0:  # the head was already longer than half: cut it back
            joined = "".join(self._parts)
            self._parts = [joined[: self.limit // 2]]
            self._keep_tail(joined[self.limit // 2 :])
            self._chars = self.limit // 2
            head_room = 0
        self._parts.append(text[:head_room])
        self._chars += len(text[:head_room])
        self._keep_tail(text[head_room:])

    def _note_segment(self, stream: str, length: int) -> None:
        if self.segments is None or not length:
            return
        if self.segments and self.segments[-1][0] == stream:
            self.segments[-1][1] += length
        elif len(self.segments) < self.MAX_SEGMENTS:
            self.segments.append([stream, length])
        else:
            self.segments = None  # too finely interleaved to describe; the client falls back to one stream

    def _spill(self) -> None:
        self.log_path, self._log = self._open_log()
        assert self._raw is not None
        raw, self._raw = self._raw, None
        self.segments = None
        for chunk in raw:
            self._write_log(chunk)

    def _write_log(self, raw: bytes) -> None:
        if self._log is None:
            return
        try:
            self._log.write(raw)
        except OSError as exc:
            self.log_error = exc.strerror or str(exc)
            try:
                self._log.close()
            except OSError:
                pass
            self._log = None

    def _keep_tail(self, text: str) -> None:
        if not text:
            return
        self._tail.append(text)
        self._tail_chars += len(text)
        half = self.limit // 2
        while self._tail_chars - len(self._tail[0]) >= half:
            dropped = self._tail.popleft()
            self._tail_chars -= len(dropped)
            self.omitted += len(dropped)

    def finish(self) -> str:
        """The record's text; closes the log."""
        if self._log is not None:
            try:
                self._log.close()
            except OSError as exc:
                self.log_error = exc.strerror or str(exc)
            self._log = None
        if self.log_path is None:
            return "".join(self._parts)
        tail = "".join(self._tail)
        half = self.limit // 2
        if len(tail) > half:
            self.omitted += len(tail) - half
            tail = tail[len(tail) - half :]
        self.tail_chars = len(tail)
        kept = (f"the whole output is in {self.log_path}" if self.log_error is None else
                f"{self.log_path} holds the output only up to where writing it failed ({self.log_error})")
        notice = f"\n[... {self.omitted} characters omitted; {kept} ...]\n"
        return "".join(self._parts) + notice + tail
