"""Is a bash cell finished? The answer to Jupyter's `is_complete_request`, decided locally.

Jupyter console asks after every Enter whether the text typed so far is a whole cell. It waits at
most a second for the answer; after a timeout it stops asking for the rest of the session and falls
back to guessing. So the answer cannot come from the sandbox (`bash -n` there costs a round trip
and a process): it comes from this small hand-written lexer and parser of bash's structure, pure
Python, no I/O, in one pass over the text (milliseconds for thousands of lines).

It knows what decides completeness: quotes and expansions (`'`, `"`, `$'`, backticks, `$(`, `${`,
`$((`, `<(`, `arr=(`), backslash continuations, here-documents, compound commands (`if`, loops,
`case`, `{`, `(`, `[[`, `((`, functions) with their reserved words recognised only where bash
recognises them, and lines ending in `|`, `&&`, `||`. "invalid" means bash would reject the text
however it goes on: a token nothing open can take (`fi` with no `if`, `;;` outside a `case`), or a
newline where the last line ends (`echo >`). Errors it does not look for, such as an empty `{ }`,
pass as complete: the cell runs and bash reports them.

The indent is four spaces per open block (a `case` branch counts two); inside a quote, a
here-document or after a backslash it is "", since spaces there would change the text.
"""

from __future__ import annotations

from ..magics.framework import parse_cell
from .scanner import Scanner
from .syntax import COMPLETE, INCOMPLETE, INDENT, INVALID, Invalid, Unfinished

__all__ = ["COMPLETE", "INCOMPLETE", "INDENT", "INVALID", "check", "line_starts"]


def check(code: str) -> tuple[str, str]:
    """("complete", "") | ("incomplete", indent) | ("invalid", "")"""
    if not code.strip():
        return COMPLETE, ""
    head = code.lstrip("\n\r\t ")
    if head.startswith("%"):
        return _check_magics(head)
    return _check_bash(code)


def line_starts(code: str) -> list[int]:
    """Where lines of `code` start at its own level, read as bash reads them: not inside a quote, a
    here-document, a substitution or after a backslash. A magic spelled there would go to bash as a
    command (the kernel refuses a cell magic below the first line: `placement.py`). The starts found
    before text bash would reject, or that is unfinished, are those lines all the same."""
    scanner = Scanner(code)
    scanner.line_starts = [0]
    try:
        scanner.run()
    except (Invalid, Unfinished):
        pass
    return scanner.line_starts


def _check_magics(head: str) -> tuple[str, str]:
    """Magics, read as the kernel reads them (`magics.parse_cell`).

    A `%%` cell magic takes any text as its body, so only the writer knows where it ends: as in
    IPython, the cell is complete once its last line is blank (Enter on an empty line in a console),
    never on its first line (`%%write PATH` alone would write an empty file). `%` lines at the top are
    line magics, one line each, and what follows them is shell code; with none, the cell goes on only
    after a last line ending in a backslash.
    """
    parsed = parse_cell(head)
    assert parsed is not None  # `head` starts with a %
    last_line = head.rpartition("\n")[2]
    if parsed.cell is not None:
        return (COMPLETE, "") if "\n" in head and not last_line.strip() else (INCOMPLETE, "")
    if parsed.rest.strip():
        return _check_bash(parsed.rest)
    return (INCOMPLETE, "") if last_line.endswith("\\") else (COMPLETE, "")


def _check_bash(code: str) -> tuple[str, str]:
    try:
        return Scanner(code).run()
    except Invalid:
        return INVALID, ""
    except Unfinished:
        return INCOMPLETE, ""
