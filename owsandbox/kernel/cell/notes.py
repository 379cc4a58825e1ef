"""Notes the kernel adds to a cell's output: shown plain and dimmed, never on the stderr stream.

A notebook paints stderr red, and stderr is what the program wrote; a paging footer, an output-limit
notice or "stdin is not available" is the kernel talking, so it goes out as its own small display:
`text/plain` for consoles and headless runs, and the same text escaped in a dimmed `<pre>` for
JupyterLab. The metadata marks it, so a reader of the notebook (or a test) can tell notes apart.
"""

from __future__ import annotations

import html
from typing import Any

from ..display.math_safe import no_math

NOTE_METADATA = {"owsandbox": {"note": True}}
_STYLE = "margin:0;padding:0 0 0 8px;opacity:0.6;font-size:0.9em;white-space:pre-wrap;background:none"


def note_content(text: str) -> dict[str, Any]:
    """The `display_data` content of a note (its text without the trailing line break)."""
    text = text.strip("\n")
    return {"data": {"text/plain": text, "text/html": no_math(f'<pre style="{_STYLE}">{html.escape(text)}</pre>')},
            "metadata": NOTE_METADATA}


def is_note(content: dict[str, Any]) -> bool:
    return bool(content.get("metadata", {}).get("owsandbox", {}).get("note"))
