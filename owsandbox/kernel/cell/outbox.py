"""Where the kernel's IOPub messages leave: each one's box text filtered and counted against its cell.

One door for every output (streams, displays and their updates, results, notes, errors), from the
cell's own thread, the magics' worker threads and `%attach`'s loop alike, so that nothing the box
wrote reaches a client without going through both checks: `box_text.clean` (terminal controls out
of printed text) and the cell's `OutputBudget` (the output limit, for everything it sends). A
command's own streams come filtered and counted already (`output.CellOutput`) and say so. Every
stream is paced (pacing.py): past the rate a Jupyter server lets through, a cell's streams become
one live tail, and its end says what was not streamed.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..display import box_text
from .budget import OutputBudget, Withheld
from .notes import is_note, note_content
from .pacing import FloodTail, StreamPacer, message_size, pieces
from .terminal_text import shown_text

log = logging.getLogger(__name__)

KEEP_BUDGETS = 1000  # cells whose budget is remembered (a cell's %attach view sends after the cell ended)


class Outbox:
    def __init__(self, send: Callable[[dict[str, Any], str, dict[str, Any]], None],
                 limit: Callable[[], int], pacer: StreamPacer | None = None) -> None:
        self._wire = send  # send(parent, msg_type, content) on IOPub
        self._pacer = pacer if pacer is not None else StreamPacer()
        self._floods: dict[str, FloodTail] = {}  # cell → its live tail, once its streams came too fast
        self._limit = limit  # the output limit a new cell's budget gets
        self._budgets: OrderedDict[str, OutputBudget] = OrderedDict()
        self._lock = threading.Lock()
        self._watchers: list[Callable[[dict[str, Any], str, dict[str, Any]], None]] = []

    def watch(self, watcher: Callable[[dict[str, Any], str, dict[str, Any]], None]) -> None:
        """`watcher(parent, msg_type, content)` is shown each message as it went out, filtered and cut
        (a `%record`ing keeps what the notebook showed); what it raises is logged, never the cell's."""
        self._watchers.append(watcher)

    def _send(self, parent: dict[str, Any], msg_type: str, content: dict[str, Any]) -> None:
        if msg_type != "stream":
            self._out(parent, msg_type, content)
            return
        for piece in pieces(str(content.get("text", ""))):  # a long text: its head streams, the rest may be a tail
            if self._paced(parent, piece):
                self._out(parent, msg_type, {**content, "text": piece})

    def _out(self, parent: dict[str, Any], msg_type: str, content: dict[str, Any]) -> None:
        self._wire(parent, msg_type, content)
        for watcher in self._watchers:
            try:
                watcher(parent, msg_type, content)
            except Exception:  # noqa: BLE001 - a watcher's failure is not the cell's
                log.exception("an outbox watcher failed")

    def _paced(self, parent: dict[str, Any], text: str) -> bool:
        """Whether this stream text goes out now; if not, it is in its cell's live tail, redrawn when due."""
        key = _cell_key(parent)
        with self._lock:
            flood = self._floods.get(key)
            if flood is None and self._pacer.admit(message_size(text)):
                return True
            if flood is None:
                flood = self._floods[key] = FloodTail(f"owsandbox-flood-{key}", clock=self._pacer.clock)
            flood.add(text)
            draw = flood.due()
            frame = flood.text() if draw else ""
        if draw:
            self._draw(parent, flood, frame)
        return False

    def _draw(self, parent: dict[str, Any], flood: FloodTail, frame: str) -> None:
        content = {"data": {"text/plain": frame}, "metadata": {"owsandbox": {"flood": True}},
                   "transient": {"display_id": flood.display_id}}
        self._out(parent, "update_display_data" if flood.shown else "display_data", content)
        flood.shown = True

    def budget(self, parent: dict[str, Any]) -> OutputBudget:
        """The budget of the cell that `parent` is the request of (new at its first output)."""
        key = _cell_key(parent)
        with self._lock:
            found = self._budgets.get(key)
            if found is None:
                found = self._budgets[key] = OutputBudget(self._limit())
                while len(self._budgets) > KEEP_BUDGETS:
                    self._budgets.popitem(last=False)
            else:
                self._budgets.move_to_end(key)
            return found

    def send(self, parent: dict[str, Any], msg_type: str, content: dict[str, Any],
             withheld: Withheld | None = None, frame_of: str | None = None, counted: bool = False) -> None:
        """Send `content`, or what of it fits the cell's budget and the note for the rest. `counted`: a
        command's own stream or notice, filtered and counted by CellOutput already. `frame_of`: the
        display id whose previous frame this one replaces in the client (see budget.py)."""
        if counted:
            self._send(parent, msg_type, content)
            return
        content = box_text.clean(msg_type, content)
        budget = self.budget(parent)
        withheld = withheld or Withheld()
        note: str | None = None
        if msg_type == "error" or msg_type == "clear_output":
            pass  # the cell's one error always goes out (its size is bounded where it is made)
        elif is_note(content):
            if not budget.own_words(content):
                return
        elif msg_type == "stream":
            text, note = budget.cut(content.get("text", ""), withheld)
            content = {**content, "text": text}
            if not text:
                content = {}
        else:
            admitted, note = budget.admit(content, withheld, frame_of)
            if not admitted:
                content = {}
        if content:
            self._send(parent, msg_type, content)
        if note is not None:
            self._send(parent, "display_data", note_content(note))

    def note(self, parent: dict[str, Any], text: str, counted: bool = False) -> None:
        """A note of the kernel's own (notes.py): plain and dimmed, not on stderr."""
        if text.strip("\n"):
            self.send(parent, "display_data", note_content(shown_text(text)), counted=counted)

    def page(self, parent: dict[str, Any], text: str, withheld: Withheld) -> str:
        """The part of a pager's text that fits the cell's budget (the rest is said in a note)."""
        shown, note = self.budget(parent).cut(shown_text(text), withheld)
        if note is not None:
            self._send(parent, "display_data", note_content(note))
        return shown

    def end_cell(self, parent: dict[str, Any]) -> None:
        """The cell's last word on the limit, how much was withheld after its first note, and on a flood:
        its live tail as it ended, and what was not streamed."""
        with self._lock:
            flood = self._floods.pop(_cell_key(parent), None)
        if flood is not None:
            self._draw(parent, flood, flood.text(ended=True))
            self._out(parent, "display_data", note_content(flood.note()))
        summary = self.budget(parent).summary()
        if summary is not None:
            self._send(parent, "display_data", note_content(summary))


def _cell_key(parent: dict[str, Any]) -> str:
    return str(parent.get("header", {}).get("msg_id", ""))
