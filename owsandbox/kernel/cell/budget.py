"""A cell's output budget: everything the kernel sends for a cell counts against the cell's output limit.

Why: the limit keeps a box that prints or shows without end from filling the browser's memory, the
saved notebook and a console's scrollback. It used to count a command's streams only, so eight
`owdisplay` of a 1 MB file reached the client whole under `%output limit 100000`, and so did `%read`,
`%page` and `owdisplay --id` updates. Now streams, displays and their updates, results, the pager and
what the magics print all count, in characters (a display by the size of its content).

Past the limit what would go over is not sent: text is cut where the limit falls, a display is
withheld whole, and the first of them is replaced by one note saying what was withheld and how to
see it; the cell's end says how much more was withheld after that note. The kernel's own words
(its notes, the cell's error) still go out past the limit on a small allowance of their own, so
the notes that say what happened are not lost to the output they are about.

A display that replaces itself on a schedule of the kernel's (`%attach`'s live view, updated at
most a few times a second) counts as the one display the client keeps: each frame's size takes
the place of the frame before. An `owdisplay --id` update counts every time: the box decides how
often it comes. Thread-safe: a command's output is counted on the runner's pump thread, displays
on the kernel's.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ...protocol.words import noun

ALLOWANCE = 16_384  # characters of the kernel's own notes past the limit


@dataclass
class Withheld:
    """What an output is and how else to see it, for the note that replaces it past the limit."""

    what: str = "an output"
    how: str = "raise %output limit, or show less in one cell"


class OutputBudget:
    def __init__(self, limit: int, allowance: int = ALLOWANCE) -> None:
        self.limit = limit
        self.allowance = allowance
        self.used = 0  # characters sent within the limit
        self.beyond = 0  # characters of the kernel's own words sent past it
        self.noted = False  # the note for the first output withheld went out
        self.withheld_after_note = 0  # outputs withheld after it, and their characters
        self.withheld_chars = 0
        self._frames: dict[str, int] = {}  # display id → the size of its frame the client keeps
        self._lock = threading.Lock()

    def room(self) -> int:
        with self._lock:
            return max(self.limit - self.used, 0)

    def charge(self, chars: int) -> None:
        """Count text its sender already cut to `room()` (a command's output, see output.CellOutput)."""
        with self._lock:
            self.used += chars

    def cut(self, text: str, withheld: Withheld) -> tuple[str, str | None]:
        """The part of `text` that fits, and the note for the rest when some does not (else None)."""
        with self._lock:
            room = max(self.limit - self.used, 0)
            if len(text) <= room:
                self.used += len(text)
                return text, None
            self.used += room
            rest = len(text) - room
            if room or not self.noted:
                return text[:room], self._first_note(f"{rest} more characters of {withheld.what} are not shown",
                                                     withheld, rest)
            self._count_withheld(rest)
            return "", None

    def admit(self, content: dict[str, Any], withheld: Withheld,
              frame_of: str | None = None) -> tuple[bool, str | None]:
        """Whether a whole output (a display, a result) goes out, and the note that replaces it when not.
        `frame_of`: the display id whose earlier frame this one replaces (see the module)."""
        size = size_of(content)
        with self._lock:
            charge = size - self._frames.get(frame_of, 0) if frame_of is not None else size
            if self.used + charge <= self.limit:
                self.used += charge
                if frame_of is not None:
                    self._frames[frame_of] = size
                return True, None
            return False, self._first_note(f"{withheld.what} ({size} characters) is not shown", withheld, size)

    def own_words(self, content: dict[str, Any]) -> bool:
        """Whether a note of the kernel's goes out: within the limit as any output, past it on the allowance."""
        size = size_of(content)
        with self._lock:
            if self.used + size <= self.limit:
                self.used += size
                return True
            if self.beyond + size <= self.allowance:
                self.beyond += size
                return True
            self._count_withheld(size)
            return False

    def summary(self) -> str | None:
        """The cell's last note: what was withheld after the first note (or without one: the kernel's
        own notes past their allowance), if anything was."""
        with self._lock:
            if not self.withheld_after_note:
                return None
            count, chars = self.withheld_after_note, self.withheld_chars
            self.withheld_after_note = self.withheld_chars = 0
        outputs = ("more " if self.noted else "") + ("output" if count == 1 else "outputs")
        return (f"[past the output limit, {count} {outputs} ({chars} {noun(chars, 'character')}) "
                f"{noun(count, 'was', 'were')} not shown]")

    def _first_note(self, said: str, withheld: Withheld, size: int) -> str | None:
        if self.noted:
            self._count_withheld(size)
            return None
        self.noted = True
        return (f"[output limit of {self.limit} {noun(self.limit, 'character')} reached (%output limit): {said}; "
                f"{withheld.how}]")

    def _count_withheld(self, size: int) -> None:
        self.withheld_after_note += 1
        self.withheld_chars += size


def size_of(value: Any) -> int:
    """About the characters `value` takes as JSON: its strings, numbers and punctuation. Iterative: the
    box chooses how deeply a JSON file nests."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 2 + 2 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            total += 2 + len(item)
            stack.extend(item)
        else:
            total += len(str(item))
    return total
