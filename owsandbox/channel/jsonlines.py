"""The sans-I/O core of the channel: execd's binary frames in, JSON-lines records and offsets out.

A program on the far side of the channel speaks one JSON object per line on stdout. execd cuts its
output into frames of arbitrary size, so a record may span frames and a frame may hold many
records; this module turns frames back into records, knows the resume offset of each, and fails
loudly when the stream cannot be trusted. It does no I/O and knows nothing about WebSockets (the
frame layout is `execdws`'s), which is what lets the tests feed it every possible split of a stream.

Rules, each one a defect made impossible:

* Records end at the LF byte and nowhere else. Bytes are split on b"\\n" first and decoded as UTF-8
  afterwards, so U+2028 / U+2029 (legal raw inside a JSON string) stay inside their record.
* A record split across frames is delivered once and whole; blank lines are skipped.
* Offsets are positions in execd's output counter, which counts stdout **and stderr** bytes (in pipe
  mode both streams share one counter). A record's offset is the position just past its LF: pass
  it as `since` to a later connection and the replay starts right after that record.
* A REPLAY frame (8-byte big-endian offset, then bytes) rebases the position to its offset. An
  offset greater than the requested one means execd's ring dropped bytes: `ReplayGap`, never a
  silent skip. An earlier one is taken as given (execd replays exactly from `since`; a server that
  starts earlier re-delivers what it repeats, with the true offsets).
* Replayed bytes mix stdout and stderr with nothing marking which is which, so a replayed line
  that is not a JSON object is taken as stderr text, not as an error; only a live STDOUT line that
  is not a JSON object raises (`BadRecord`, naming the offset just past that line, like a record's,
  and where the line starts), or, for a decoder made with `flag_non_json`, becomes a `NotJsonLine`
  event (the kernel shows it flagged and reads on: a program's log line on stdout is a bug to show,
  not a reason to stop listening). When the replay ends inside a line that live stdout
  then finishes, and only the live part is a JSON object, the replayed head was stderr: it becomes
  text and the live part a record. A program whose records must survive a reattach exactly must
  still keep its stderr apart (`2>file`): a stderr write that lands in the middle of a stdout line
  splits that record in the replayed bytes, and a stderr line that is a JSON object is read back as
  a record.
* Memory is bounded: a line longer than `max_line_bytes` (8 MiB) raises `LineTooLong`, and only the
  last 8 KiB of stderr are kept (for the error that reports an exit). A line whose parsed value
  would be large (`parse_cost`: its bytes plus about a hundred bytes for each object, array and
  member in it; 16 MiB) is never parsed: `{"a": [{},{},…]}` of 7 MiB is 180 MB as Python objects.
  Such a line that looks like an object is delivered as a `Record` of its top-level members found
  in its first 64 KiB (a member larger than 4 KiB as a string saying its size, the id sniffed from
  the line's end when it is last), with `CUT_KEY` saying how large the line was and where it is in
  the output; any other such line is text that is not a record.

Use `push(frame)` then `next_event()` until it returns None (the channel does, so that the records
before a bad line are still delivered), or `feed(frame)` for the list at once. After an error the
decoder keeps raising it until `reset()`.
"""

from __future__ import annotations

import codecs
import json
import re
from collections import deque
from dataclasses import dataclass
from typing import Any, NoReturn

from .errors import BadFrame, BadRecord, JsonLineError, LineTooLong, ReplayGap
from .execdws import REPLAY, STDERR, decode_frame
from .execdws import STDIN as STDIN  # the frame kinds are execdws's, all four still named here
from .execdws import STDOUT as STDOUT

DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
DEFAULT_STDERR_TAIL_BYTES = 8 * 1024
DEFAULT_PARSE_COST = 16 * 1024 * 1024
CUT_KEY = "owsandbox:cut"  # the member a record cut to its head carries: {"bytes", "start", "end"}
CUT_HEAD_BYTES = 64 * 1024  # of a line not parsed, where its top-level members are looked for
CUT_MEMBER_BYTES = 4 * 1024  # a member larger is kept as a string that says its size
_JSON_WHITESPACE = b" \t\r"

# The sentence for a README or a user-facing note about reattaching.
STDERR_ADVICE = ("Records survive a reattach exactly only when the program's stderr is kept apart (for example "
                 "`2>file`): execd replays stdout and stderr as one mixed stream, so stderr bytes written in the "
                 "middle of a record cannot be told apart from it.")


@dataclass(frozen=True, slots=True)
class Record:
    """One JSON object from stdout; `offset` is the output position just past its LF."""

    value: dict[str, Any]
    offset: int


@dataclass(frozen=True, slots=True)
class StderrText:
    """Text that is not a record: live stderr, or a replayed (or terminal) line that is not a JSON object.

    `offset` is the output position just past these bytes."""

    text: str
    offset: int


@dataclass(frozen=True, slots=True)
class NotJsonLine:
    """A live stdout line that is not a JSON object, from a decoder made with `flag_non_json`: most
    often a log line the program printed on stdout. `offset` is the position just past its LF,
    `start` where it begins; `what` says "non-JSON stdout" or "JSON record is not an object"."""

    text: str
    offset: int
    start: int
    what: str


Event = Record | StderrText | NotJsonLine


_NOT_JSON = object()
_TOO_LARGE = object()  # a line whose parsed value would be too large, and not an object


def parse_cost(text: bytes) -> int:
    """About how many bytes `text`'s JSON value takes as Python objects, counted at C speed: its length,
    plus a container's size for each `{` and `[`, plus an object's for each `,` and `:` (a member, an
    element). An over-estimate for text in long strings, near the truth for `[{},{},…]`."""
    return (len(text) + 100 * (text.count(b"{") + text.count(b"["))
            + 60 * (text.count(b",") + text.count(b":")))


def _json_object(line: bytes, max_cost: int = DEFAULT_PARSE_COST, start: int = 0, end: int = 0) -> Any:
    """The JSON value of `line` (UTF-8, surrounding JSON whitespace allowed), or _NOT_JSON; a line too
    large to parse is its head (`cut_record`) when it looks like an object, else _TOO_LARGE."""
    body = line.strip(_JSON_WHITESPACE)
    if not body:
        return _NOT_JSON
    # parse_cost is at most 101 a byte (a `{`): a line short enough cannot be past the bound, uncounted
    if len(body) * 101 > max_cost and parse_cost(body) > max_cost:
        if body.startswith(b"{") and body.endswith(b"}"):
            return cut_record(body, start, end)
        return _TOO_LARGE
    try:
        return json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return _NOT_JSON


_SPACE = re.compile(rb"[ \t\r\n]*")
_SCALAR = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null")
_BRACKETS = re.compile(rb'[\[\]{}"]')
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_ID_AT_END = re.compile(rb'"id"[ \t\r\n]*:[ \t\r\n]*("(?:[^"\\]|\\.){0,200}"|-?[0-9]{1,20})[ \t\r\n]*}$')


def cut_record(body: bytes, start: int = 0, end: int = 0) -> dict[str, Any]:
    """The record a line too large to parse stands for: the top-level members in its first
    CUT_HEAD_BYTES (a member larger than CUT_MEMBER_BYTES as a string saying its size), `id` sniffed
    from its end when it is the last member, and CUT_KEY: {"bytes", "start", "end"} (where the whole
    line is in the output). Bounded work: only the head is scanned."""
    head = body[:CUT_HEAD_BYTES]
    found: dict[str, Any] = {}
    at = 1
    while True:
        at = _SPACE.match(head, at).end()
        key = _STRING.match(head, at)
        if key is None:
            break
        at = _SPACE.match(head, key.end()).end()
        if head[at:at + 1] != b":":
            break
        at = _SPACE.match(head, at + 1).end()
        value_end = _value_end(head, at)
        if value_end is None:  # the value goes on past the head
            try:
                found[json.loads(key.group())] = f"… ({len(body) - at} bytes or fewer, not kept)"
            except ValueError:
                pass
            break
        try:
            name = json.loads(key.group())
            if value_end - at > CUT_MEMBER_BYTES:
                found[name] = f"… ({value_end - at} bytes, not kept)"
            else:
                found[name] = json.loads(head[at:value_end])
        except (ValueError, RecursionError):
            break
        at = _SPACE.match(head, value_end).end()
        if head[at:at + 1] != b",":
            break
        at += 1
    if "id" not in found:
        sniffed = _ID_AT_END.search(body[-512:])
        if sniffed is not None:
            try:
                found["id"] = json.loads(sniffed.group(1))
            except ValueError:
                pass
    found[CUT_KEY] = {"bytes": len(body), "start": start, "end": end}
    return found


def _value_end(text: bytes, at: int) -> int | None:
    """Where the JSON value starting at `at` in `text` ends, or None when it does not end in `text`
    (or is not a value). Nesting is counted without recursion."""
    if text[at:at + 1] == b'"':
        found = _STRING.match(text, at)
        return found.end() if found is not None else None
    if text[at:at + 1] not in (b"{", b"["):
        found = _SCALAR.match(text, at)
        return found.end() if found is not None and found.end() < len(text) else None
    depth = 0
    position = at
    while True:
        found = _BRACKETS.search(text, position)
        if found is None:
            return None
        if found.group() == b'"':
            string = _STRING.match(text, found.start())
            if string is None:
                return None
            position = string.end()
            continue
        depth += 1 if found.group() in (b"{", b"[") else -1
        position = found.end()
        if depth == 0:
            return position


class _Chunk:
    """A frame's payload waiting to be turned into events."""

    __slots__ = ("kind", "data", "index", "replay_offset")

    def __init__(self, kind: int, data: bytes, index: int, replay_offset: int | None = None) -> None:
        self.kind = kind
        self.data = data
        self.index = index
        self.replay_offset = replay_offset  # set for REPLAY until the rebase is done


class JsonLineDecoder:
    """Frames to events for one output stream, resuming at `since`.

    `lenient_stdout=True` treats every line that is not a JSON object as text, for a PTY, where the
    terminal echoes input and programs print freely. `flag_non_json=True` makes such a live stdout
    line a `NotJsonLine` event instead of `BadRecord`, for a caller that shows it and reads on.
    """

    def __init__(self, since: int = 0, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                 stderr_tail_bytes: int = DEFAULT_STDERR_TAIL_BYTES, lenient_stdout: bool = False,
                 flag_non_json: bool = False, max_parse_cost: int = DEFAULT_PARSE_COST) -> None:
        if max_line_bytes < 1 or stderr_tail_bytes < 0:
            raise ValueError("max_line_bytes must be positive and stderr_tail_bytes not negative")
        self.max_line_bytes = max_line_bytes
        self.max_parse_cost = max_parse_cost
        self.stderr_tail_bytes = stderr_tail_bytes
        self.lenient_stdout = lenient_stdout
        self.flag_non_json = flag_non_json
        self._tail = bytearray()
        self.reset(since)

    def reset(self, since: int) -> None:
        """Start over for a new connection that asked for `since`. The stderr tail is kept."""
        if since < 0:
            raise ValueError(f"since must not be negative, not {since}")
        self._requested = since
        self._expected = since  # the offset the pushed frames lead up to
        self._position = since  # the offset just past the last byte turned into events
        self._partial = bytearray()
        self._partial_start = since
        self._partial_replayed = False
        self._partial_live_from: int | None = None  # where live bytes follow a replayed head in _partial
        self._queue: deque[_Chunk] = deque()
        self._ready: deque[Event] = deque()  # decided, not yet handed out
        self._stderr_text = codecs.getincrementaldecoder("utf-8")("replace")
        self._failure: JsonLineError | None = None

    # ── what the caller reads ────────────────────────────────────────────────────────────────────

    @property
    def requested_since(self) -> int:
        return self._requested

    @property
    def position(self) -> int:
        """Every output byte (stdout and stderr) turned into events so far, as an execd offset."""
        return self._position

    @property
    def resume_offset(self) -> int:
        """Where a new connection must start (`since`) to lose nothing not yet delivered: the start of
        an unfinished stdout line if there is one, else `position`."""
        return self._partial_start if self._partial else self._position

    @property
    def stderr_tail(self) -> str:
        """The last `stderr_tail_bytes` of stderr (and of replayed non-record lines), as text."""
        tail = bytes(self._tail)
        cut = 0
        while cut < min(3, len(tail)) and 0x80 <= tail[cut] <= 0xBF:  # a character cut by the bound
            cut += 1
        return tail[cut:].decode("utf-8", "replace")

    # ── frames in, events out ────────────────────────────────────────────────────────────────────

    def feed(self, frame: bytes | bytearray | memoryview) -> list[Event]:
        """`push(frame)` and every event it yields. An error loses the events before it: the channel
        uses `push` and `next_event` instead."""
        self.push(frame)
        events: list[Event] = []
        while (event := self.next_event()) is not None:
            events.append(event)
        return events

    def push(self, frame: bytes | bytearray | memoryview) -> None:
        """Take one binary frame from execd. Raises `ReplayGap` and `BadFrame` at once."""
        self._raise_if_failed()
        try:
            decoded = decode_frame(bytes(frame))
        except BadFrame as error:
            self._fail(error)
        if decoded.offset is not None:  # REPLAY
            if decoded.offset > self._expected:
                self._fail(ReplayGap(requested=self._expected, available=decoded.offset))
            self._expected = decoded.offset + decoded.size
            self._queue.append(_Chunk(REPLAY, decoded.message, decoded.start, decoded.offset))
        else:
            self._expected += decoded.size
            if decoded.size:
                self._queue.append(_Chunk(decoded.kind, decoded.message, decoded.start))

    def next_event(self) -> Event | None:
        """The next event from the frames pushed so far, or None when they are used up."""
        self._raise_if_failed()
        if self._ready:
            return self._ready.popleft()
        queue = self._queue
        while queue:
            chunk = queue[0]
            if chunk.kind == STDERR:
                queue.popleft()
                data = chunk.data[chunk.index:]
                self._position += len(data)
                self._keep_tail(data)
                text = self._stderr_text.decode(data)
                if text:
                    return StderrText(text, self._position)
                continue
            if chunk.replay_offset is not None:
                self._rebase(chunk.replay_offset)
                chunk.replay_offset = None
            replayed = chunk.kind == REPLAY
            newline = chunk.data.find(b"\n", chunk.index)
            if newline < 0:
                queue.popleft()
                self._hold(chunk.data[chunk.index:], replayed)
                continue
            piece = chunk.data[chunk.index:newline]
            chunk.index = newline + 1
            if chunk.index >= len(chunk.data):
                queue.popleft()
            live_from = None
            if self._partial:
                start, line = self._partial_start, bytes(self._partial) + piece
                if self._partial_replayed and not replayed:
                    live_from = len(self._partial) if self._partial_live_from is None else self._partial_live_from
                replayed = replayed or self._partial_replayed
                self._partial.clear()
            else:
                start, line = self._position, piece
            self._position += len(piece) + 1
            if len(line) > self.max_line_bytes:
                self._fail(LineTooLong(start, self.max_line_bytes))
            event = self._line(line, start, replayed, live_from)
            if event is not None:
                return event
        return None

    # ── inside ───────────────────────────────────────────────────────────────────────────────────

    def _rebase(self, offset: int) -> None:
        if offset != self._position:  # not a continuation of what came before: an unfinished line is void
            self._partial.clear()
            self._position = offset

    def _hold(self, piece: bytes, replayed: bool) -> None:
        if not self._partial:
            self._partial_start = self._position
            self._partial_replayed = False
            self._partial_live_from = None
        if len(self._partial) + len(piece) > self.max_line_bytes:
            self._fail(LineTooLong(self._partial_start, self.max_line_bytes))
        if self._partial_replayed and not replayed and self._partial_live_from is None:
            self._partial_live_from = len(self._partial)
        self._partial += piece
        self._partial_replayed = self._partial_replayed or replayed
        self._position += len(piece)

    def _line(self, line: bytes, start: int, replayed: bool, live_from: int | None = None) -> Event | None:
        """The event for one complete line. `live_from`: where live stdout bytes follow replayed ones."""
        if not line.strip(_JSON_WHITESPACE):
            return None
        end = self._position
        value = _json_object(line, self.max_parse_cost, start, end)
        if isinstance(value, dict):
            return Record(value, end)
        if live_from is not None:
            # The replay ended inside a line and live stdout finished it. If the live part alone is a
            # record, the replayed head was the start of a stderr line: both are kept, record first.
            live = _json_object(line[live_from:], self.max_parse_cost, start + live_from, end)
            if isinstance(live, dict):
                self._ready.append(self._text(line[:live_from]))
                return Record(live, end)
        if replayed or self.lenient_stdout:
            return self._text(line + b"\n")
        what = ("non-JSON stdout" if value is _NOT_JSON else "a line too large to parse, not a JSON object"
                if value is _TOO_LARGE else "JSON record is not an object")
        if self.flag_non_json:
            return NotJsonLine(line.decode("utf-8", "replace"), end, start, what)
        self._fail(BadRecord(what, start=start, end=end, line=line))

    def _text(self, data: bytes) -> StderrText:
        self._keep_tail(data)
        return StderrText(data.decode("utf-8", "replace"), self._position)

    def _keep_tail(self, data: bytes) -> None:
        if self.stderr_tail_bytes == 0:
            return
        self._tail += data[-self.stderr_tail_bytes:]
        excess = len(self._tail) - self.stderr_tail_bytes
        if excess > 0:
            del self._tail[:excess]

    def _fail(self, error: JsonLineError) -> NoReturn:
        self._failure = error
        raise error

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure
