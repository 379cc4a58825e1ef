"""The daemon's delivery bookkeeping: the outbox of unacknowledged answers and the request ledger.

An answer is the record of a request; it is kept until the client acknowledges it, so that an
answer produced while the pipe was cut is replayed on `session.resume`. A request id that has been
seen before is never run again. Both are bounded: an outbox that had to drop answers says so
(`gap`), and the ledger forgets the oldest ids first. `Records` is the two together, behind one
lock, as the daemon uses them. Pure bookkeeping, no I/O: whoever asks sends the frames.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from .. import protocol as P

NEW, RUNNING, ANSWERED = "new", "running", "answered"


class Outbox:
    """Answers by sequence number, kept until acknowledged."""

    def __init__(self, max_items: int = 1024, max_bytes: int = 32 * 1024 * 1024) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: OrderedDict[int, tuple[bytes, Any]] = OrderedDict()
        self._bytes = 0
        self._next_seq = 1
        self.acked = 0
        self.dropped_up_to = 0  # the highest seq dropped without an ack

    def add(self, frame_for_seq: Any, request_id: Any) -> tuple[int, bytes]:
        """Assign the next seq; `frame_for_seq(seq)` builds the frame bytes that carry it."""
        seq = self._next_seq
        self._next_seq += 1
        frame: bytes = frame_for_seq(seq)
        self._items[seq] = (frame, request_id)
        self._bytes += len(frame)
        while len(self._items) > 1 and (len(self._items) > self.max_items or self._bytes > self.max_bytes):
            old_seq, (old_frame, _) = self._items.popitem(last=False)
            self._bytes -= len(old_frame)
            self.dropped_up_to = max(self.dropped_up_to, old_seq)
        return seq, frame

    def ack(self, seq: int) -> None:
        self.acked = max(self.acked, seq)
        while self._items:
            first = next(iter(self._items))
            if first > seq:
                break
            frame, _ = self._items.pop(first)
            self._bytes -= len(frame)

    def replay(self, last_seq: int) -> tuple[list[bytes], bool]:
        """Every kept frame after `last_seq`, and whether any answer after it was dropped unseen."""
        frames = [frame for seq, (frame, _) in self._items.items() if seq > last_seq]
        gap = self.dropped_up_to > max(last_seq, self.acked)
        return frames, gap

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    def frame_for(self, seq: int) -> bytes | None:
        item = self._items.get(seq)
        return item[0] if item else None

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)


class RequestLedger:
    """What became of each request id: running, or answered under which seq."""

    def __init__(self, max_ids: int = 16384) -> None:
        self.max_ids = max_ids
        self._ids: OrderedDict[Any, int | None] = OrderedDict()

    @staticmethod
    def _key(request_id: Any) -> Any:
        return (type(request_id).__name__, request_id)

    def begin(self, request_id: Any) -> tuple[str, int | None]:
        """NEW (now marked running), RUNNING, or ANSWERED with the answer's seq."""
        key = self._key(request_id)
        if key in self._ids:
            seq = self._ids[key]
            return (RUNNING, None) if seq is None else (ANSWERED, seq)
        self._ids[key] = None
        while len(self._ids) > self.max_ids:
            self._ids.popitem(last=False)
        return NEW, None

    def answered(self, request_id: Any, seq: int) -> None:
        self._ids[self._key(request_id)] = seq

    def state(self, request_id: Any) -> str | None:
        """RUNNING or ANSWERED for an id seen, None for one never begun (or forgotten)."""
        key = self._key(request_id)
        if key not in self._ids:
            return None
        return RUNNING if self._ids[key] is None else ANSWERED

    def running(self) -> int:
        return sum(1 for seq in self._ids.values() if seq is None)


class Records:
    """The answers to work, kept until acknowledged, and the request ids seen, for a daemon's
    threads at once (answers are made on worker and shell threads, acks and resumes on the
    connection's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outbox = Outbox()
        self.ledger = RequestLedger()

    def begin(self, request_id: Any) -> tuple[str, bytes | None]:
        """NEW (now running), RUNNING, or ANSWERED with the kept answer's frame (None when it is no
        longer kept: answered, and acknowledged or dropped since)."""
        with self._lock:
            state, seq = self.ledger.begin(request_id)
            return state, self.outbox.frame_for(seq) if state == ANSWERED and seq is not None else None

    def state(self, request_id: Any) -> str | None:
        """RUNNING or ANSWERED for a request id seen, None for one never seen (or forgotten)."""
        with self._lock:
            return self.ledger.state(request_id)

    def answer(self, request_id: Any, message: dict[str, Any]) -> bytes:
        """Keep `message` (a result or an error) under the next seq; the frame to send."""
        with self._lock:
            return self._keep(request_id, message)

    def answer_unanswered(self, request_id: Any, message: dict[str, Any]) -> tuple[str | None, bytes | None]:
        """`answer`, only for a request still running: (its state before, the frame or None). For
        an error found after the request may have been answered already: never a second answer."""
        with self._lock:
            state = self.ledger.state(request_id)
            return state, self._keep(request_id, message) if state == RUNNING else None

    def _keep(self, request_id: Any, message: dict[str, Any]) -> bytes:
        def frame_for(seq: int) -> bytes:
            message["seq"] = seq
            return P.encode(message)

        seq, frame = self.outbox.add(frame_for, request_id)
        self.ledger.answered(request_id, seq)
        return frame

    def ack(self, seq: int) -> None:
        with self._lock:
            self.outbox.ack(seq)

    def replay(self, last_seq: int) -> tuple[list[bytes], bool]:
        """The kept frames after `last_seq`, and whether any answer after it was dropped unseen."""
        with self._lock:
            return self.outbox.replay(last_seq)

    @property
    def last_seq(self) -> int:
        """The seq of the latest answer (0 before the first)."""
        with self._lock:
            return self.outbox.last_seq
