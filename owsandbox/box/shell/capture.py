"""What a shell prints, taken apart: end markers, the live view, and the record.

* `MarkerScanner` finds the end-of-command marker lines that the shell prints after each command,
  holding back only bytes that could still turn out to be the start of one.
* `LiveBatcher` turns output into live `shell.output` frames, batched by time and size. It keeps
  runs of stdout and stderr apart and in order, and it never sends anything for a command that ends
  within the first delay: for a quick command the record says it all.
* `OutputRecord` is the result's `output`: everything in arrival order up to a cap kept in memory
  (head and tail), everything beyond spilled to a log file, with the runs of each stream noted so
  that a client can split the record back into stdout and stderr.
* `WholeLines` keeps one stream's unfinished line from being cut by the other stream's output.
* `ShellChatter` tells bash's own lines on its stderr (job notices, the `exit` echo) from the
  programs' lines, by where and when bash writes them.

Pure classes fed bytes and times; the only I/O is the log file handed to `OutputRecord`.
"""

from __future__ import annotations

import codecs
import re
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from ...protocol.words import noun

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
        notice = f"\n[... {self.omitted} {noun(self.omitted, 'character')} omitted; {kept} ...]\n"
        return "".join(self._parts) + notice + tail


LINE_WAIT_SECONDS = 0.05  # the longest one stream's output waits for the other stream's line to end
Item = tuple[str, str, bytes]  # (stream, kind, data): kind "data", or a line of its own ("display", "note")


# Terminal controls that show nothing: a line holding only these (bracketed paste on, a colour reset
# after the last line break) has not begun.
_CONTROLS = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[ -/]*[0-~]")


def _leaves_line_open(data: bytes) -> bool:
    """Whether `data` ends in the middle of a line that shows something."""
    tail = data[max(data.rfind(b"\n"), data.rfind(b"\r")) + 1 :]
    return bool(tail) and (b"\x1b" not in tail or bool(_CONTROLS.sub(b"", tail)))


def _first_line_end(data: bytes) -> int:
    """Where the first line of `data` ends (after its \\n, \\r or \\r\\n), or -1."""
    newline, ret = data.find(b"\n"), data.find(b"\r")
    if ret < 0 or 0 <= newline < ret:
        return newline + 1 if newline >= 0 else -1
    return ret + 2 if data[ret + 1 : ret + 2] == b"\n" else ret + 1


class WholeLines:
    """Output of two streams, let out so that neither cuts a line of the other in two.

    A program writes a line in pieces (`ls: ` then the message: stderr is unbuffered), and two
    terminals are two queues, so the other stream's line can be read between the pieces: the notebook
    would show half a line, a line of the other stream, then the rest. So once a stream has let out
    an unfinished line, what the other stream brings waits, in order, until that line ends (a line
    break, or a carriage return: a progress line), or for `wait` seconds (a program that takes its time
    over a line must not hold the other stream up), or until `flush` (the command ended, or waits to
    read: its prompt is all it will write). The unfinished line itself goes out at once (a prompt, a
    progress bar). Lines are never reordered otherwise: items come out in the order they came, except
    that the rest of the open line goes before what waited for it.
    """

    def __init__(self, wait: float = LINE_WAIT_SECONDS) -> None:
        self.wait = wait
        self._open: str | None = None  # the stream whose unfinished line is out
        self._held: list[Item] = []  # the other stream's output, waiting for that line to end
        self._since: float | None = None

    def add(self, stream: str, kind: str, data: bytes, now: float) -> list[Item]:
        out: list[Item] = []
        while data:
            if self._open is not None and stream != self._open:
                self._held.append((stream, kind, data))
                if self._since is None:
                    self._since = now
                return out + self.due(now)
            if not self._held:
                self._let_out(stream, kind, data, out)
                return out
            cut = len(data) if kind != "data" else _first_line_end(data)  # a display or note is a line
            if cut < 0:
                out.append((stream, kind, data))
                return out
            out.append((stream, kind, data[:cut]))
            self._release(out)
            data = data[cut:]  # the rest goes after what waited for the line's end
        return out

    @property
    def waiting_for(self) -> str | None:
        """The stream whose line the other stream's output waits for, if any."""
        return self._open if self._held else None

    def deadline(self) -> float | None:
        """When what waits goes out anyway, or None when nothing waits."""
        return None if self._since is None else self._since + self.wait

    def due(self, now: float) -> list[Item]:
        out: list[Item] = []
        if self._since is not None and now >= self._since + self.wait:
            self._release(out)
        return out

    def flush(self) -> list[Item]:
        """Everything that waits, now; the open line counts as ended."""
        out: list[Item] = []
        self._release(out)
        return out

    def _release(self, out: list[Item]) -> None:
        held, self._held, self._since, self._open = self._held, [], None, None
        for stream, kind, data in held:
            self._let_out(stream, kind, data, out)

    def _let_out(self, stream: str, kind: str, data: bytes, out: list[Item]) -> None:
        out.append((stream, kind, data))
        self._open = stream if kind == "data" and _leaves_line_open(data) else None


_PID_NOTICE = re.compile(rb"\[(\d+)\] (\d+)\n")  # bash, starting a job in the background: `[1] 4242`
_JOB_REPORT = re.compile(rb"\[(\d+)\][+\- ]  \S[^\n]*\n")  # bash, reporting one: `[1]+  Done   sleep 1`
_EXIT_ECHO = b"exit\n"  # an interactive bash, running `exit`
EXIT_WAIT_SECONDS = 1.0  # how long an `exit` line waits to see whether the shell ends


class ShellChatter:
    """bash's own lines on the channel its stderr goes to, told from what the programs wrote there.

    An interactive bash (what keeps Stop from killing the shell) writes to its stderr what a terminal
    user is used to and a notebook shows otherwise: `[1] 4242` when a job starts in the background,
    `[1]+  Done ...` when one ends (with `set -m` or `set -b`: each time bash reads a line, the lines of
    a cell included), and `exit` before it exits. Each is told apart by what it is about and when it
    comes, the text only confirming:

    * `[N] PID` names a process the shell has just started (`is_job`, answered from /proc): bash writes
      it the moment it starts the job, and a program printing those words about any other pid keeps them.
    * `[N]+  Done ...` reports on job N only as bash announced it (`[N] PID` here before), once its
      process has ended or stopped (`job_over`).
    * `exit` is bash's when the shell ends right after it (`shell_exited`): until then it waits, up to
      `exit_wait` seconds, or until more output comes after it here, or the command's end.

    Bash writes each with one write, at the start of a line; `feed` returns ("data" | "note", bytes)
    pieces in order. Channels that are not bash's stderr (`active` false) pass through untouched.
    """

    def __init__(self, is_job: Callable[[int], bool], job_over: Callable[[int], bool],
                 exit_wait: float = EXIT_WAIT_SECONDS) -> None:
        self._is_job = is_job
        self._job_over = job_over
        self.exit_wait = exit_wait
        self.jobs: dict[bytes, int] = {}  # job number -> pid, as bash announced them
        self._at_line_start = True
        self._held: bytes | None = None
        self._held_since = 0.0

    def feed(self, data: bytes, now: float, active: bool = True) -> list[tuple[str, bytes]]:
        out = self.release()
        if not data:
            return out
        if not active or (b"[" not in data and _EXIT_ECHO not in data):
            self._at_line_start = data[-1:] in (b"\n", b"\r")
            out.append(("data", data))
            return out
        plain_from = pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            end = len(data) if end < 0 else end + 1
            line, at_start = data[pos:end], self._at_line_start
            self._at_line_start = line[-1:] in (b"\n", b"\r")
            kind = self._kind(line) if at_start else None
            if kind is not None:
                if pos > plain_from:
                    out.append(("data", data[plain_from:pos]))
                plain_from = end
                if kind == "exit" and end == len(data):
                    self._held, self._held_since = line, now
                else:
                    out.append(("note" if kind == "note" else "data", line))
            pos = end
        if plain_from < len(data):
            out.append(("data", data[plain_from:]))
        return out

    def _kind(self, line: bytes) -> str | None:
        if line == _EXIT_ECHO:
            return "exit"
        started = _PID_NOTICE.fullmatch(line)
        if started is not None:
            pid = int(started.group(2))
            if not self._is_job(pid):
                return None
            self.jobs[started.group(1)] = pid
            return "note"
        report = _JOB_REPORT.fullmatch(line)
        if report is not None:
            pid = self.jobs.get(report.group(1))
            if pid is not None and self._job_over(pid):
                return "note"
        return None

    def fresh_line(self) -> list[tuple[str, bytes]]:
        """What comes next starts a line: after a line that does not pass through here (an `owdisplay`
        request), and in the next command's output (a cell of its own)."""
        self._at_line_start = True
        return self.release()

    def release(self) -> list[tuple[str, bytes]]:
        """A held `exit` line, as the program's output after all."""
        held, self._held = self._held, None
        return [("data", held)] if held is not None else []

    @property
    def holding(self) -> bool:
        return self._held is not None

    def deadline(self) -> float | None:
        return self._held_since + self.exit_wait if self._held is not None else None

    def due(self, now: float) -> list[tuple[str, bytes]]:
        return self.release() if self._held is not None and now >= self._held_since + self.exit_wait else []

    def shell_exited(self) -> None:
        """The shell ended: a held `exit` was bash's, and only repeats what the notebook says."""
        self._held = None
