"""Tab inside a `%send` line (or a `%%send` cell's records): method names the session has seen, and
inside a `tools/call`, the tool names the program's `tools/list` gave (tools.py).

Why here and not from the sandbox: the names are the attached program's, known to the kernel only;
nothing is asked of the box, so completion in a `%send` is instant even while a shell is busy.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# What comes before the word at the cursor: the opening quote of a "method" or a "name" value.
_METHOD_VALUE = re.compile(r'"method"\s*:\s*"$')
_NAME_VALUE = re.compile(r'"name"\s*:\s*"$')
_SEND_NUMBER = re.compile(r"^%send\s+(\d+)\b")
_CELL_NUMBER = re.compile(r"^%%send\s+(\d+)\b")

# (methods, tools) of the attached program numbered N (None: the latest)
Words = Callable[[int | None], tuple[list[str], list[str]]]


def send_matches(code: str, line_start: int, start: int, typed: str, words: Words) -> list[str] | None:
    """The names for the word `typed` (at `start`, in the line that starts at `line_start`) when the
    cursor is in a "method" or a tools/call's "name" value of a `%send` record; None elsewhere (the
    other completions take it)."""
    line = code[line_start:]
    first_line = code.split("\n", 1)[0]
    if line.startswith("%send"):
        number = _SEND_NUMBER.match(line)
    elif first_line.startswith("%%send") and line_start > 0:
        number = _CELL_NUMBER.match(first_line)
    else:
        return None
    before = code[line_start:start]
    if _METHOD_VALUE.search(before):
        methods, _ = words(int(number.group(1)) if number else None)
        return [m for m in methods if m.startswith(typed)]
    if _NAME_VALUE.search(before) and '"tools/call"' in before:
        _, tools = words(int(number.group(1)) if number else None)
        return [t for t in tools if t.startswith(typed)]
    return None
