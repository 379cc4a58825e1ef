"""A file from the sandbox as a rich output: which types are shown, and each made safe to show.

`%read` and `owdisplay` show images, SVG, HTML, Markdown and JSON from the box. The bytes are the
box's, so only allowed types pass, and each goes through `untrusted` before the browser sees it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
from collections import OrderedDict
from typing import Any

from ..cell.terminal_text import shown_text
from ..errors import UsageError

RICH_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
              ".svg": "image/svg+xml", ".html": "text/html", ".htm": "text/html", ".md": "text/markdown",
              ".markdown": "text/markdown", ".json": "application/json"}


MAX_RICH_BYTES = 16 * 1024 * 1024
MAX_JSON_DEPTH = 100  # a JSON file nested deeper is shown as its text (a tree view of it would not help)
MAX_JSON_BYTES = 1024 * 1024  # a JSON file larger is shown as its text: parsed, it could be 25 times that
BOX_ID_PREFIX = "owsandbox-box-"  # box-given display ids live under this; the kernel's own never start so
BOX_ID_CHARS = 200  # a longer id is kept as its digest
KEEP_BOX_IDS = 10_000  # the newest box display ids remembered (to update rather than add)


class BoxDisplayIds:
    """The display ids `owdisplay --id` gives, in a namespace of their own: each one is prefixed, so it
    can never equal an id the kernel makes (an attached program's live view is `owsandbox-attach-…`),
    and only the newest KEEP_BOX_IDS are remembered, so the box cannot grow the kernel with ids."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()

    @staticmethod
    def box_id(given: str) -> str | None:
        if not given:
            return None
        if len(given) > BOX_ID_CHARS:
            given = "sha256-" + hashlib.sha256(given.encode("utf-8", "surrogatepass")).hexdigest()
        return BOX_ID_PREFIX + given

    def seen(self, display_id: str) -> bool:
        """Whether `display_id` was shown before (then this is an update); remembers it either way."""
        known = display_id in self._seen
        self._seen[display_id] = None
        self._seen.move_to_end(display_id)
        while len(self._seen) > KEEP_BOX_IDS:
            self._seen.popitem(last=False)
        return known


def json_depth(value: Any, limit: int) -> int:
    """How deep `value` nests (a scalar is 0), counted without recursion and up to `limit` + 1."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


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
    from . import untrusted  # the sanitisers, imported with the first file shown (not at the kernel's start)

    try:
        return untrusted.check_type(mime)
    except untrusted.RefusedType as exc:
        raise UsageError(str(exc)) from None


def rich_bundle(data: bytes, mime: str, path: str) -> dict[str, Any]:
    """A display_data bundle for a file's bytes from the sandbox, made safe to show (untrusted.py):
    only allowed types, HTML in a frame that runs no script, Markdown without raw HTML, and no
    terminal controls in any text (taken out before the rest is made safe, so that what is checked
    is what is shown)."""
    from . import untrusted

    mime = _allowed(mime)
    text = shown_text(data.decode("utf-8", "replace"))
    path = shown_text(path)
    if mime.startswith("image/") and mime != "image/svg+xml":
        return {mime: base64.b64encode(data).decode("ascii"), "text/plain": f"<{mime} image: {path}>"}
    if mime == "application/json":
        if len(data) > MAX_JSON_BYTES:  # its object graph could be many times its size: its text only
            return {"text/plain": text}
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"{path} is not valid JSON: {exc}") from None
        except RecursionError:
            raise UsageError(f"{path} nests deeper than this kernel parses: %read {shlex.quote(path)} --text "
                             "shows its text") from None
        if json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
            return {"text/plain": text}
        return {mime: value, "text/plain": text}
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

