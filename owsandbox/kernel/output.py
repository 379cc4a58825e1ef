"""What a cell shows: live frames and the final record turned into notebook outputs, in order, once.

The live view can miss frames (a cut pipe); the record cannot. `CellOutput` tracks how much of the
command's combined output the notebook has shown (frames carry character offsets) and, when the
result comes, shows the rest from the record, split back into stdout and stderr by the record's
`segments`. Past the cell's output limit it stops showing and says where the whole output is kept.
`owdisplay` lines on stdout become display requests. Pure: fed frames and results, it returns events.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..runner.box.output import MarkerScanner
from ..runner.box.shells import DISPLAY_START

DEFAULT_OUTPUT_LIMIT = 4_000_000  # characters shown per cell
TAIL_CHARS = 4096  # of a cut output, this much of its end is shown after the notice


@dataclass
class Stream:
    name: str
    text: str


@dataclass
class Display:
    path: str
    mime: str
    display_id: str


@dataclass
class Notice:
    text: str


Event = Stream | Display | Notice


class CellOutput:
    """Thread-safe: frames come from the runner's pump thread, events are taken by the cell's loop."""

    def __init__(self, limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
        self.limit = limit
        self.shown = 0  # characters of the combined output accounted for, from the start
        self.displayed = 0  # characters actually sent to the notebook
        self.gap = False
        self.limited = False
        self._events: list[Event] = []
        self._scanner = MarkerScanner(DISPLAY_START)
        self._lock = threading.Lock()

    # -- input ------------------------------------------------------------------------------

    def live(self, frame: dict[str, Any]) -> None:
        text = frame.get("text") or ""
        with self._lock:
            if self.gap or frame.get("offset") != self.shown:
                self.gap = True  # frames were lost; the record fills in from `shown` at the end
                return
            self.shown += len(text)
            self._show(frame.get("stream") or "stdout", text)

    def finish(self, result: dict[str, Any]) -> None:
        """Show from the record whatever the live view did not."""
        with self._lock:
            output = result.get("output") or ""
            segments = result.get("segments")
            if result.get("truncated"):
                self._finish_truncated(result)
            elif segments:
                position = 0
                for stream, length in segments:
                    start, end = max(position, self.shown), position + length
                    if end > start:
                        self._show(stream, output[start:end])
                    position += length
                self.shown = max(self.shown, position)
            elif len(output) > self.shown:
                self._show("stdout", output[self.shown :])
                self.shown = len(output)
            self._show_held()

    def _finish_truncated(self, result: dict[str, Any]) -> None:
        """The record holds only a head and a tail (`tail_chars` long); the log holds everything."""
        total = int(result.get("output_chars") or 0)
        log = result.get("log_path") or "a log in the sandbox"
        output = result.get("output") or ""
        kept_tail = min(int(result.get("tail_chars") or 0), len(output))
        missing = total - self.shown
        if not self.limited and not self.gap and 0 <= missing <= kept_tail:
            # The live view stopped short only by its last batch, which the record's tail holds.
            if missing:
                self._show("stdout", output[len(output) - missing :])
            self.shown = total
            if not self.limited:
                return
        if not self.limited:
            self._stop_at_limit()
        self._events.append(Notice(f"[all {total} characters are in {log}; "
                                   f"page them with %read {log} --lines 1:200]\n"))
        # What was shown is the output up to `displayed`; the end comes from the record's tail.
        tail = min(total - max(self.displayed, total - TAIL_CHARS), kept_tail)
        if tail > 0:
            self._events.append(Notice(f"[the last {tail} characters:]\n"))
            self._events.append(Stream("stdout", output[len(output) - tail :]))
        self.shown = total

    # -- showing ----------------------------------------------------------------------------

    def _show(self, stream: str, text: str) -> None:
        if self.limited or not text:
            return
        room = self.limit - self.displayed
        if len(text) > room:
            self._emit(stream, text[:room])
            self._stop_at_limit()
            return
        self._emit(stream, text)

    def _stop_at_limit(self) -> None:
        self.limited = True
        self._show_held()
        self._events.append(Notice(f"\n[output limit of {self.limit} characters reached (%output limit); "
                                   "the rest is kept in a log in the sandbox, named when the command ends]\n"))

    def _emit(self, stream: str, text: str) -> None:
        self.displayed += len(text)
        if stream != "stdout":
            self._events.append(Stream(stream, text))
            return
        for kind, chunk in self._scanner.feed(text):
            if kind == "data":
                self._append(Stream("stdout", chunk))
            else:
                mime, display_id, path = (chunk.split("\t", 2) + ["", ""])[:3]
                self._events.append(Display(path, mime, display_id))

    def _show_held(self) -> None:
        held = self._scanner.flush()
        if held:
            self._append(Stream("stdout", held))

    def _append(self, event: Stream) -> None:
        last = self._events[-1] if self._events else None
        if isinstance(last, Stream) and last.name == event.name:
            last.text += event.text
        else:
            self._events.append(event)

    # -- output -----------------------------------------------------------------------------

    def take(self) -> list[Event]:
        with self._lock:
            events, self._events = self._events, []
            return events
