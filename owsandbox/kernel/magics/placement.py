"""A cell magic below a cell's first line is a mistake the kernel names, instead of handing it to bash.

Why: `cd data` then `%%write hello.txt` on line 2 reads as one magic to the writer, but only a first
line is read as a cell magic, so bash got `%%write` as a command and answered `fg: no job control`
or `command not found`, which says nothing of what went wrong. A line that starts with `%%` inside
a here-document or a quoted string is the shell's own text, though, so only a line bash would read
as a command (`completeness.line_starts`) and that is exactly a known cell magic's invocation counts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..editing.completeness import line_starts
from ..errors import UsageError

_CELL_MAGIC_LINE = re.compile(r"[ \t]*%%([A-Za-z0-9_.-]+)(?:[ \t][^\n]*)?(?=\n|\Z)")


def refuse_misplaced_cell_magic(code: str, cell_magics: Iterable[str], first_line: int = 1) -> None:
    """A UsageError naming the first cell magic that `code` (the cell's shell text from its line
    `first_line` on) has below the cell's first line; nothing when it has none."""
    names = set(cell_magics)
    if "%%" not in code or not names:
        return
    for start in line_starts(code):
        found = _CELL_MAGIC_LINE.match(code, start)
        if found is None or found.group(1) not in names:
            continue
        line = first_line + code.count("\n", 0, start)
        if line == 1:
            continue  # the cell's own first line is read as its magic (never here: the kernel took it)
        spelled = found.group().strip()
        raise UsageError(
            f"%%{found.group(1)} is a cell magic, and cell magics must be on the first line of the cell; here it is "
            f"on line {line} ({spelled!r}), so bash would have run it as a command. Put it at the top of a cell "
            "of its own, with the lines above it in the cell before")
