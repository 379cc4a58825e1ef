"""Text from the box is text: the fields of the kernel's messages that a front end prints, filtered.

Why: `jupyter console` prints what it is sent to a real terminal, and a terminal obeys what it reads.
A file named `ESC ] 52 ; c ; ... BEL` set the clipboard when `%ls` listed it; `ESC ] 0 ; ... BEL` in a
file `%read` showed set the window title; `ESC [ 2 J` in a folder's name cleared the screen when
`%shells` or a `ShellExited` error named it. A command's own output already went through
`TerminalText`; what the magics, the errors, completion and inspection show of the box did not.

So every message leaves the kernel through `clean` (IOPub messages and the execute and inspect
replies) or `clean_matches` (completion), which put the fields a client prints as text through the
one filter, `terminal_text.shown_text`: stream text, `text/plain` of displays, results and pages,
an error's name, value and traceback, and the strings of JSON data (only their control characters:
JSON is shown by browsers). HTML and Markdown are not printed by a terminal and are left alone here:
a file's text is filtered before it is made safe for the page (`magics.rich_bundle`), so that what
was checked is what is shown, and the kernel's tables filter their cells before escaping them. A
command's own streams are the exception, filtered as they came (`output.CellOutput`): on a terminal
by `TerminalText`, with `%terminal off` exact, as asked.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..cell.terminal_text import plain, shown_text

# an escaped backslash (kept), or a control as JSON writes it: \b, \f or \u00XX (\n, \r and \t stay)
_JSON_CONTROL = re.compile(r"\\\\|\\[bf]|\\u00(?:[01][0-9a-fA-F]|7[fF]|[89][0-9a-fA-F])")
_WITH_DATA = ("display_data", "update_display_data", "execute_result", "inspect_reply")


def clean(msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
    """`content` of a `msg_type` message with its printed text filtered (a new dict where anything changed)."""
    if msg_type == "stream":
        return {**content, "text": shown_text(str(content.get("text", "")))}
    if msg_type in _WITH_DATA:
        return _clean_data(content)
    if msg_type in ("error", "execute_reply"):
        cleaned = dict(content)
        for key in ("ename", "evalue"):
            if isinstance(cleaned.get(key), str):
                cleaned[key] = shown_text(cleaned[key])
        if isinstance(cleaned.get("traceback"), list):
            cleaned["traceback"] = [shown_text(str(line)) for line in cleaned["traceback"]]
        if isinstance(cleaned.get("payload"), list):  # the pager's text (%page)
            cleaned["payload"] = [_clean_data(item) if item.get("source") == "page" else item
                                  for item in cleaned["payload"]]
        return cleaned
    return content


def clean_matches(matches: list[str]) -> list[str]:
    """Completion matches a terminal may show: one the filter would change is dropped, since what it
    inserted would not name the file or command it stands for; so is one with colours in it, which
    would be typed into the cell as escapes."""
    return [match for match in matches if plain(match) == match]


def _clean_data(content: dict[str, Any]) -> dict[str, Any]:
    data = content.get("data")
    if not isinstance(data, dict):
        return content
    cleaned = dict(data)
    if isinstance(data.get("text/plain"), str):
        cleaned["text/plain"] = shown_text(data["text/plain"])
    if "application/json" in data:
        cleaned["application/json"] = _clean_json(data["application/json"])
    return {**content, "data": cleaned}


def _clean_json(value: Any) -> Any:
    """A JSON value from the box (a file, an attached program's answer) without control characters in
    its strings but line breaks and tabs. Written as ASCII JSON, every control is an escape, so they go
    in one pass over the text, however deep the value nests."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return value
    if "\\u00" not in text and "\\b" not in text and "\\f" not in text:
        return value
    return json.loads(_JSON_CONTROL.sub(lambda found: found.group() if found.group() == "\\\\" else "", text))
