"""A file from the sandbox as a rich output: which types are shown, and each made safe to show.

`%read` and `owdisplay` show images, SVG, HTML, Markdown and JSON from the box. The bytes are the
box's, so only allowed types pass, and each goes through `untrusted` before the browser sees it.
"""

from __future__ import annotations

import base64
import json
import shlex
from typing import Any

from ..cell.terminal_text import shown_text
from ..errors import UsageError
from . import untrusted

RICH_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
              ".svg": "image/svg+xml", ".html": "text/html", ".htm": "text/html", ".md": "text/markdown",
              ".markdown": "text/markdown", ".json": "application/json"}


MAX_RICH_BYTES = 16 * 1024 * 1024


def mime_for(path: str, given: str = "") -> str:
    """The type to show `path` as: `given` (checked: it comes from the sandbox), else by its ending."""
    if given:
        return _allowed(given)
    lower = path.lower()
    for ending, mime in RICH_TYPES.items():
        if lower.endswith(ending):
            return mime
    return "text/plain"


def _allowed(mime: str) -> str:
    try:
        return untrusted.check_type(mime)
    except untrusted.RefusedType as exc:
        raise UsageError(str(exc)) from None


def rich_bundle(data: bytes, mime: str, path: str) -> dict[str, Any]:
    """A display_data bundle for a file's bytes from the sandbox, made safe to show (untrusted.py):
    only allowed types, HTML in a frame that runs no script, Markdown without raw HTML, and no
    terminal controls in any text (taken out before the rest is made safe, so that what is checked
    is what is shown)."""
    mime = _allowed(mime)
    text = shown_text(data.decode("utf-8", "replace"))
    path = shown_text(path)
    if mime.startswith("image/") and mime != "image/svg+xml":
        return {mime: base64.b64encode(data).decode("ascii"), "text/plain": f"<{mime} image: {path}>"}
    if mime == "application/json":
        try:
            return {mime: json.loads(text), "text/plain": text}
        except ValueError as exc:
            raise UsageError(f"{path} is not valid JSON: {exc}") from None
    if mime == "text/plain":
        return {"text/plain": text}
    if mime == "text/html":
        return {mime: untrusted.html_frame(text, f"{path} (from the sandbox: no script runs)"),
                "text/plain": f"<{mime}: {path}>"}
    if mime == "text/markdown":
        return {mime: untrusted.markdown_text(text), "text/plain": text}
    try:
        return {mime: untrusted.svg_image(text), "text/plain": f"<{mime}: {path}>"}
    except untrusted.RefusedSvg as exc:
        raise UsageError(f"{path} is not shown as SVG: {exc}; %read {shlex.quote(path)} --text shows its "
                         "text") from None

