"""One attached program's conversation: what was sent and received, matched into calls, by lane.

Why a record of its own: the live view, `%records`, Stop's cancel, `%send`'s progress-reset
timeout and `%records --save` all ask the same questions (which request does this answer, which
call does this progress notification belong to, how long has a call been pending), and they must
agree. A `Conversation` is a plain class fed records with their time, sans-I/O, so the matching
is tested without a program.

Lanes, each bounded in count and together in bytes (a chatty program cannot grow the kernel, nor
can a program of a few large records: past KEEP_RECORD_COST, about 64 MiB as Python objects, the
oldest large records keep only their small top-level members, the rest said by size under
`owsandbox:cut`; a line too large to parse at all came cut already, see channel/jsonlines.py; the
whole is in the program's output, at the offsets the cut says): the records both ways in order
(`records`), the calls (a request with its answer, latency, last progress and cancel; kept apart so
that an `initialize` exchange outlives a flood of notifications), the notifications, the
program's stderr in lines, and the stdout lines that were not JSON. A request the program sends
(a server asking its client) is a call too, answered by a response sent with `%send`.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..display.rich import json_depth
from . import jsonrpc as R
from .dialects import PLAIN, Dialect, guess

KEEP_RECORDS = 1000  # per program, for the view and %records
KEEP_CALLS = 1000
KEEP_NOTIFICATIONS = 500
KEEP_STDERR_LINES = 200
KEEP_NOT_JSON = 100
STDERR_LINE_CHARS = 10_000  # a stderr "line" without its line break is cut here; a longer line is cut to it
KEEP_RECORD_COST = 64 * 1024 * 1024  # about this many bytes of Python objects in kept records, together
LARGE_RECORD_COST = 16 * 1024  # records larger than this are cut, oldest first, once the total is past it
CUT_KEY = "owsandbox:cut"  # as channel/jsonlines.py names it: {"bytes": size of the whole, ...}
CUT_MEMBER_CHARS = 1024  # a member of a cut record larger than this is kept as its size
MAX_RECORD_DEPTH = 100  # a member nested deeper is kept as a string saying so (every later json.dumps works)

SENT, RECEIVED, STDERR, STDOUT = "sent", "received", "stderr", "stdout"
ARROWS = {SENT: "→", RECEIVED: "←"}


@dataclass(eq=False, slots=True)
class Call:
    """A request and what became of it. `asked_by` is SENT when the notebook asked the program."""

    asked_by: str
    id: Any
    method: str
    request: Entry
    keys: set[Any] = field(default_factory=set)  # the progress keys its dialect gives it
    answer: Entry | None = None
    progress: Entry | None = None  # the latest progress notification for it
    progress_count: int = 0
    cancel: Entry | None = None  # the cancel the notebook sent for it

    @property
    def pending(self) -> bool:
        return self.answer is None

    def latency(self) -> float | None:
        return None if self.answer is None else max(self.answer.at - self.request.at, 0.0)

    def error(self) -> dict[str, Any] | None:
        return R.error_of(self.answer.record) if self.answer is not None and self.answer.record else None


@dataclass(eq=False, slots=True)
class Entry:
    seq: int
    at: float  # seconds since the epoch
    direction: str  # SENT, RECEIVED, STDERR or STDOUT (a stdout line that is not JSON)
    record: dict[str, Any] | None = None
    text: str | None = None
    offset: int | None = None  # the output offset just past it, for what came from the program
    kind: str | None = None  # jsonrpc.REQUEST, NOTIFICATION or RESPONSE; None for other records
    call: Call | None = None  # the call it asks, answers, advances or cancels
    failed: str | None = None  # a sent record that did not reach the program, and why
    by: str | None = None  # a sent record the notebook wrote by itself: the `--answer` file it came from

    def export(self) -> dict[str, Any]:
        """The entry as a line of a saved conversation (replay.py reads it back)."""
        out: dict[str, Any] = {"at": round(self.at, 6), "dir": self.direction}
        if self.offset is not None:
            out["offset"] = self.offset
        if self.record is not None:
            out["record"] = self.record
        if self.text is not None:
            out["text"] = self.text
        if self.failed is not None:
            out["failed"] = self.failed
        return out


class Conversation:
    def __init__(self, dialect: Dialect | None = None) -> None:
        self.dialect = dialect or PLAIN
        self.dialect_fixed = dialect is not None  # named by --dialect: never guessed over
        self.rpc = False  # a record with "jsonrpc": "2.0" went either way
        self.records: deque[Entry] = deque(maxlen=KEEP_RECORDS)
        self.calls: deque[Call] = deque(maxlen=KEEP_CALLS)
        self.notifications: deque[Entry] = deque(maxlen=KEEP_NOTIFICATIONS)
        self.stderr_lines: deque[Entry] = deque(maxlen=KEEP_STDERR_LINES)
        self.not_json: deque[Entry] = deque(maxlen=KEEP_NOT_JSON)
        self.counts = {SENT: 0, RECEIVED: 0, STDERR: 0, STDOUT: 0, "calls": 0, "notifications": 0}
        self._seq = 0
        self._pending: OrderedDict[tuple[str, tuple[str, Any]], Call] = OrderedDict()  # (asked_by, id) → call
        self._progress: dict[Any, Call] = {}  # progress key → the pending call it belongs to
        self._stderr_partial = ""
        self._stderr_partial_at = 0.0
        self._large: deque[tuple[Entry, int]] = deque()  # kept records larger than LARGE_RECORD_COST
        self.kept_cost = 0  # their estimated size together

    # -- feeding ------------------------------------------------------------------------------

    def sent(self, record: dict[str, Any], at: float) -> Entry:
        """A record the notebook sends (before it is written, so that its answer finds it)."""
        entry = self._entry(SENT, at, record)
        kind = entry.kind
        if kind == R.REQUEST or (kind is None and not R.is_jsonrpc(record) and "id" in record):
            entry.call = self._open_call(SENT, entry)
        elif kind == R.RESPONSE:
            call = self._pending.pop((RECEIVED, R.id_key(record.get("id"))), None)
            if call is not None:
                call.answer, entry.call = entry, call
        elif kind == R.NOTIFICATION:
            self._note(entry)
        return entry

    def received(self, record: dict[str, Any], at: float, offset: int | None = None) -> Entry:
        """A record from the program; `entry.call` is the call it answers or advances, if any."""
        entry = self._entry(RECEIVED, at, record, offset)
        kind = entry.kind
        if kind == R.REQUEST:
            entry.call = self._open_call(RECEIVED, entry)
        elif kind == R.NOTIFICATION:
            self._note(entry)
            key = self.dialect.progress_key(record)
            call = self._progress.get(key) if key is not None else None
            if call is not None:
                call.progress, entry.call = entry, call
                call.progress_count += 1
        elif "id" in record:  # a response, or a record of another protocol that may answer
            call = self._pending.get((SENT, R.id_key(record.get("id"))))
            if call is not None and call.request.record is not None and R.answers(record, call.request.record):
                self._close(call, entry)
        return entry

    def cancelled(self, call: Call, cancel: Entry) -> None:
        """The notebook sent `cancel` (a dialect's cancel notification) for `call`."""
        call.cancel, cancel.call = cancel, call

    def stderr(self, text: str, at: float, offset: int | None = None) -> list[Entry]:
        """stderr text as it came (any cut); whole lines become entries, the rest waits for its end."""
        entries = []
        if not self._stderr_partial:
            self._stderr_partial_at = at
        pending = self._stderr_partial + text
        lines = pending.split("\n")
        self._stderr_partial = lines.pop()
        if len(self._stderr_partial) > STDERR_LINE_CHARS:
            lines.append(self._stderr_partial)
            self._stderr_partial = ""
        for line in lines:
            entry = self._entry(STDERR, self._stderr_partial_at if not entries else at, text=cut_text(line),
                                offset=offset)
            self.stderr_lines.append(entry)
            entries.append(entry)
        if entries:
            self._stderr_partial_at = at
        return entries

    def stdout_text(self, text: str, at: float, offset: int | None = None) -> Entry:
        """A line on stdout that is not a JSON object: most often a log line that went to stdout."""
        entry = self._entry(STDOUT, at, text=cut_text(text.rstrip("\n")), offset=offset)
        self.not_json.append(entry)
        return entry

    # -- asking -------------------------------------------------------------------------------

    def pending_call(self, request_id: Any, asked_by: str = SENT) -> Call | None:
        return self._pending.get((asked_by, R.id_key(request_id)))

    def pending_calls(self) -> list[Call]:
        return list(self._pending.values())

    @property
    def stderr_partial(self) -> str:
        return self._stderr_partial

    @property
    def made(self) -> int:
        """How many entries this conversation has had, kept or not."""
        return self._seq

    def entries(self) -> list[Entry]:
        """Every entry still kept, in the order it happened."""
        found: dict[int, Entry] = {}
        for lane in (self.records, self.notifications, self.stderr_lines, self.not_json):
            for entry in lane:
                found[entry.seq] = entry
        for call in self.calls:
            for entry in (call.request, call.answer, call.progress, call.cancel):
                if entry is not None:
                    found[entry.seq] = entry
        return [found[seq] for seq in sorted(found)]

    def select(self, *, notifications: bool = False, method: str | None = None, request_id: Any = None,
               by_id: bool = False, record_type: str | None = None) -> list[Entry]:
        """The kept records (both ways) that pass every filter given: JSON-RPC notifications only; of
        `method` (a request, its answer, its progress); of the call or record with `request_id`."""
        key = R.id_key(request_id)
        chosen = []
        for entry in self.entries():
            record = entry.record
            if record is None:
                continue
            if notifications and entry.kind != R.NOTIFICATION:
                continue
            if record_type is not None and record.get("type") != record_type:
                continue
            if method is not None and record.get("method") != method \
                    and (entry.call is None or entry.call.method != method):
                continue
            if by_id and not ((entry.call is not None and R.id_key(entry.call.id) == key)
                              or ("id" in record and R.id_key(record.get("id")) == key)):
                continue
            chosen.append(entry)
        return chosen

    # -- inside -------------------------------------------------------------------------------

    def _entry(self, direction: str, at: float, record: dict[str, Any] | None = None, offset: int | None = None,
               text: str | None = None) -> Entry:
        self._seq += 1
        self.counts[direction] += 1
        kind = None
        if record is not None:
            if R.is_jsonrpc(record):
                self.rpc = True
                kind = R.kind_of(record)
            if not self.dialect_fixed and self.dialect is PLAIN:
                self.dialect = guess(record) or PLAIN
        cost = 0
        if record is not None:
            cost, opened = _measured(record)
            if opened > MAX_RECORD_DEPTH and json_depth(record, MAX_RECORD_DEPTH) > MAX_RECORD_DEPTH:
                record = shallow_members(record)
                cost = record_cost(record)
        entry = Entry(self._seq, at, direction, record, text, offset, kind)
        if record is not None:
            self.records.append(entry)
            self._count_cost(entry, cost)
        return entry

    def _count_cost(self, entry: Entry, cost: int) -> None:
        """Keep the records' estimated size under KEEP_RECORD_COST: past it, the oldest large records
        are cut to their small members (the entries stay, in every lane, with their calls)."""
        if cost <= LARGE_RECORD_COST:
            return
        self._large.append((entry, cost))
        self.kept_cost += cost
        while self.kept_cost > KEEP_RECORD_COST and self._large:
            old, old_cost = self._large.popleft()
            self.kept_cost -= old_cost
            if old.record is not None:
                old.record = cut_members(old.record, old_cost)

    def _open_call(self, asked_by: str, entry: Entry) -> Call:
        record = entry.record or {}
        method = record.get("method") if entry.kind == R.REQUEST else record.get("type")
        call = Call(asked_by, record.get("id"), method if isinstance(method, str) else "", entry)
        if asked_by == SENT and entry.kind == R.REQUEST:
            call.keys = self.dialect.progress_keys(record)
            for key in call.keys:
                self._progress[key] = call
        slot = (asked_by, R.id_key(call.id))
        self._pending.pop(slot, None)
        self._pending[slot] = call
        while len(self._pending) > KEEP_CALLS:
            self._forget(self._pending.popitem(last=False)[1])
        self.calls.append(call)
        self.counts["calls"] += 1
        return call

    def _close(self, call: Call, answer: Entry) -> None:
        call.answer, answer.call = answer, call
        self._pending.pop((call.asked_by, R.id_key(call.id)), None)
        self._forget(call)

    def _forget(self, call: Call) -> None:
        for key in call.keys:
            if self._progress.get(key) is call:
                del self._progress[key]

    def _note(self, entry: Entry) -> None:
        self.notifications.append(entry)
        self.counts["notifications"] += 1


_encode = json.JSONEncoder(ensure_ascii=False).encode  # made once: json.dumps with an option makes one a call


def record_cost(record: dict[str, Any] | None) -> int:
    """About how many bytes `record` takes as Python objects (as channel/jsonlines.parse_cost counts
    its text): its JSON's length, a container's size for each object and array, an object's for each
    member and element."""
    return 0 if record is None else _measured(record)[0]


def _measured(record: dict[str, Any]) -> tuple[int, int]:
    """`record_cost`, and how many objects and arrays the record has: the most it can nest, so that
    only a record with more is walked for its depth (one encoding, counted at C speed, for both)."""
    try:
        text = _encode(record)
    except (TypeError, ValueError, RecursionError):
        return KEEP_RECORD_COST, MAX_RECORD_DEPTH + 1  # not one to keep whole; walked for its depth
    opened = text.count("{") + text.count("[")
    return len(text) + 100 * opened + 60 * (text.count(",") + text.count(":")), opened


def cut_members(record: dict[str, Any], cost: int) -> dict[str, Any]:
    """`record` with only its small top-level members (a larger one as a string saying its size), and
    CUT_KEY saying that it was cut."""
    kept: dict[str, Any] = {}
    for key, value in record.items():
        if key == CUT_KEY:
            continue
        try:
            size = len(json.dumps(value, ensure_ascii=False))
        except (TypeError, ValueError, RecursionError):
            size = CUT_MEMBER_CHARS + 1
        kept[key] = value if size <= CUT_MEMBER_CHARS else f"… ({size} characters, not kept)"
    previous = record.get(CUT_KEY)
    kept[CUT_KEY] = previous if isinstance(previous, dict) else {"bytes": cost, "kept": "its small members"}
    return kept


def shallow_members(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with each top-level member nested deeper than MAX_RECORD_DEPTH replaced by a string
    saying so (Python's JSON encoder and the wire's give up near 1,000 levels, at some stack depth)."""
    kept = {key: value if json_depth(value, MAX_RECORD_DEPTH - 1) < MAX_RECORD_DEPTH else
            f"… (nested deeper than {MAX_RECORD_DEPTH} levels, not kept)" for key, value in record.items()}
    kept[CUT_KEY] = record.get(CUT_KEY) if isinstance(record.get(CUT_KEY), dict) else {"deeper_than": MAX_RECORD_DEPTH}
    return kept


def cut_text(text: str) -> str:
    """A line of text as kept: up to STDERR_LINE_CHARS, and how much more there was."""
    if len(text) <= STDERR_LINE_CHARS:
        return text
    return text[:STDERR_LINE_CHARS] + f"… ({len(text) - STDERR_LINE_CHARS} more characters, not kept)"


def latest(entries: Iterable[Entry], count: int) -> tuple[list[Entry], int]:
    """The last `count` of `entries` and how many came before them."""
    kept = list(entries)
    return kept[-count:] if count > 0 else [], max(len(kept) - count, 0)

