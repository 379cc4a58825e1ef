"""What a cell shows: live frames and the final record turned into notebook outputs, in order, once.

The live view can miss frames (a cut pipe); the record cannot. `CellOutput` tracks how much of the
command's combined output the notebook has shown (frames carry character offsets) and, when the
result comes, shows the rest from the record, split back into stdout and stderr by the record's
`segments`. Past the cell's output limit (what the cell's budget has room for, budget.py) it stops
showing and says where the whole output is kept.
`display` records (the shell recognises `owdisplay` lines) become display requests. Pure: fed frames
and results, it returns events.

On a terminal, a command's prompt is the unfinished line it printed before it waits for input. Shown
as it came, that line would appear in the output and again as the notebook's input prompt, so the
unfinished last line is held back until more output finishes it, the command ends, the command asks
for input (the line becomes the prompt instead: `input_wanted`), or it has waited `HOLD_SECONDS`
(a progress line without a line break still shows). Held text never lets the other stream overtake
it: output is shown in the order it was written. With `terminal=True` both streams also go through
`TerminalText`, which keeps colours and drops the cursor movement a notebook cannot show.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...protocol import messages as M
from ...protocol.messages import display_requests
from ...protocol.words import noun
from .budget import OutputBudget
from .terminal_text import TerminalText, plain

DEFAULT_OUTPUT_LIMIT = 4_000_000  # characters shown per cell
TAIL_CHARS = 4096  # of a cut output, this much of its end is shown after the notice
HOLD_SECONDS = 0.25  # an unfinished last line waits this long for its end (or for the command to ask)
_LINE_TAIL = 4096  # characters of a stream's unfinished line remembered, to recognize a prompt


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


@dataclass
class InputWanted:
    """The command waits for a line typed at its terminal; `prompt` is plain text (no colours)."""

    prompt: str
    password: bool


Event = Stream | Display | Notice | InputWanted


class CellOutput:
    """Thread-safe: frames come from the runner's pump thread, events are taken by the cell's loop."""

    def __init__(self, limit: int = DEFAULT_OUTPUT_LIMIT, terminal: bool = False,
                 clock: Callable[[], float] = time.monotonic, hold_seconds: float = HOLD_SECONDS,
                 budget: OutputBudget | None = None) -> None:
        # The cell's budget (budget.py): what the cell showed before the command, and the displays the
        # command asks for, leave less room for its text.
        self.budget = budget if budget is not None else OutputBudget(limit)
        self.limit = self.budget.limit
        self.shown = 0  # characters of the combined output accounted for, from the start
        self.displayed = 0  # characters of it actually sent to the notebook
        self.withheld = 0  # characters of it not sent, past the limit
        self.gap = False
        self.limited = False
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._clock = clock
        self.hold_seconds = hold_seconds
        self._filters = {"stdout": TerminalText(), "stderr": TerminalText()} if terminal else None
        self._held: Stream | None = None  # the latest stream's unfinished last line, not shown yet
        self._held_since = 0.0
        self._lines = {"stdout": "", "stderr": ""}  # each stream's unfinished line so far (shown or held)
        self._expected = ""  # a prompt announced before its text arrived: not shown when it comes

    # -- input ------------------------------------------------------------------------------

    def live(self, frame: M.OutputFrame) -> None:
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
            if self.limited and not result.get("truncated"):
                self._finish_withheld(output)
            self._release()
            self._expected = ""
            if self._filters is not None:
                for text_filter in self._filters.values():
                    text_filter.end()

    def input_wanted(self, frame: M.InputWanted) -> None:
        """The command waits for input (`shell.input_wanted`): its unfinished line becomes the
        prompt of an `InputWanted` event instead of output, so it is not shown twice."""
        with self._lock:
            prompt = TerminalText().feed(str(frame.get("prompt") or "")[-_LINE_TAIL:])  # the box's: bounded
            prompt = prompt[max(prompt.rfind("\n"), prompt.rfind("\r")) + 1 :]
            held = self._held
            self._expected = ""
            if held is not None and not prompt:
                prompt, self._held = held.text, None  # the line before the cursor is what the user sees
            elif held is not None and held.text.endswith(prompt):
                self._held = None
                self._append(Stream(held.name, held.text[: len(held.text) - len(prompt)]))
            else:
                self._release()
                if prompt and not any(line.endswith(prompt) for line in self._lines.values()):
                    self._expected = prompt  # announced before its text came: drop it when it does
            self._events.append(InputWanted(plain(prompt), bool(frame.get("password"))))

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
        self._release()
        self._events.append(Notice(f"[all {total} {noun(total, 'character')} are in {log}; "
                                   f"page them with %read {log} --lines 1:200]\n"))
        # What was shown is the output up to `displayed`; the end comes from the record's tail.
        tail = min(total - max(self.displayed, total - TAIL_CHARS), kept_tail)
        if tail > 0:
            self._events.append(Notice(f"[the last {tail} {noun(tail, 'character')}:]\n"))
            text = output[len(output) - tail :]
            self._events.append(Stream("stdout", TerminalText().feed(text) if self._filters is not None else text))
        self.shown = total

    def _finish_withheld(self, output: str) -> None:
        """Cut at the limit though the sandbox kept every character (the cell's other outputs took the
        room): no log holds the rest, so say so, and show the end as a cut output does."""
        self._release()
        self._events.append(Notice(f"[{self.withheld} {noun(self.withheld, 'character')} of this command's output "
                                   f"{noun(self.withheld, 'was', 'were')} not shown: the "
                                   "cell's outputs reached its limit; raise %output limit, or send the output "
                                   "to a file]\n"))
        tail = min(self.withheld, TAIL_CHARS, len(output))
        if tail > 0:
            self._events.append(Notice(f"[the last {tail} {noun(tail, 'character')}:]\n"))
            text = output[len(output) - tail :]
            self._events.append(Stream("stdout", TerminalText().feed(text) if self._filters is not None else text))

    # -- showing ----------------------------------------------------------------------------

    def _show(self, stream: str, text: str) -> None:
        if self.limited or not text:
            self.withheld += len(text)
            return
        room = self.budget.room()
        if len(text) > room:
            self._emit(stream, text[:room])
            self.withheld += len(text) - room
            self._stop_at_limit()
            return
        self._emit(stream, text)

    def _stop_at_limit(self) -> None:
        self.limited = True
        self._release()
        self._events.append(Notice(f"\n[output limit of {self.limit} {noun(self.limit, 'character')} reached "
                                   "(%output limit); "
                                   "where the rest is follows when the command ends]\n"))

    def _emit(self, stream: str, text: str) -> None:
        self.displayed += len(text)
        self.budget.charge(len(text))
        if stream == "note":  # the runner's own words (see box/shell/delivery.py `note`), not the program's
            self._release()
            self._events.append(Notice(text))
            return
        if stream == "display":  # an `owdisplay` request, recognised by the shell (see box/shell/reader.py)
            self._release()
            for request in display_requests(text):
                self._events.append(Display(request.path, request.mime, request.display_id))
            return
        self._text(stream, text)

    def _text(self, stream: str, text: str) -> None:
        """Stream text, reduced for the notebook; its unfinished last line is held (see the module)."""
        if self._filters is not None:
            text = self._filters[stream].feed(text)
        if self._expected:
            text = self._drop_expected(text)
        if not text:
            return
        held = self._held
        if held is not None and held.name != stream:
            self._release()  # the other stream's unfinished line was written first: it goes first
            held = None
        joined = held.text + text if held is not None else text
        cut = max(joined.rfind("\n"), joined.rfind("\r")) + 1
        if cut:
            self._append(Stream(stream, joined[:cut]))
            self._lines[stream] = ""
        rest = joined[cut:]
        self._lines[stream] = (self._lines[stream] + (rest if held is None or cut else text))[-_LINE_TAIL:]
        if not rest or len(rest) > _LINE_TAIL:  # a line that long is no prompt: show it as it comes
            self._held = None
            self._append(Stream(stream, rest))
            return
        if held is None or cut:
            self._held_since = self._clock()
        self._held = Stream(stream, rest)

    def _drop_expected(self, text: str) -> str:
        """Drop the start of `text` that is the prompt announced before it arrived."""
        expected = self._expected
        if text.startswith(expected):
            self._expected = ""
            return text[len(expected) :]
        if expected.startswith(text):
            self._expected = expected[len(text) :]
            return ""
        self._expected = ""  # something else came: the prompt is not coming as output after all
        return text

    def _release(self) -> None:
        """Show the held unfinished line now."""
        held, self._held = self._held, None
        if held is not None:
            self._append(held)

    def _append(self, event: Stream) -> None:
        if not event.text:
            return
        last = self._events[-1] if self._events else None
        if isinstance(last, Stream) and last.name == event.name:
            last.text += event.text
        else:
            self._events.append(event)

    # -- output -----------------------------------------------------------------------------

    def take(self) -> list[Event]:
        """The events to show now; an unfinished line held `hold_seconds` is among them."""
        with self._lock:
            if self._held is not None and self._clock() - self._held_since >= self.hold_seconds:
                self._release()
            events, self._events = self._events, []
            return events

    def hold_deadline(self) -> float | None:
        """When (on the clock) the held unfinished line is due to show, if one is held."""
        with self._lock:
            return self._held_since + self.hold_seconds if self._held is not None else None
