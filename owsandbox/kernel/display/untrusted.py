"""Rich output made in the sandbox, made safe to show in the notebook's page.

Why: whatever the box writes may be an attack. A file shown with `owdisplay` (a command in every
shell) or `%read`, or a display request printed by any program in the box, becomes display_data, and
JupyterLab trusts the outputs of the running session: HTML goes into the page as it is and its
scripts run, so does Markdown's raw HTML, and application/javascript is run. A script there acts
with the user's rights on the Jupyter server: it reads and writes every file, opens terminals,
talks to other kernels. `owdisplay` refuses unsafe types in the box, but that is a courtesy to the
user: the kernel checks again here, because the host trusts nothing the box can write.

So, of what comes from the box:

* only the types in `ALLOWED_TYPES` are shown; any other is refused (`RefusedType` names it and the
  allowed ones): application/javascript, text/javascript, widget views, text/latex, ... never reach
  the page;
* text/html is shown inside `<iframe sandbox="" srcdoc="...">`: no script runs in it and it has an
  opaque origin (no cookies, no same-origin requests to the server), with no forms, popups or
  top-level navigation; a Content-Security-Policy at the top of its document stops it loading
  anything over the network. Tables, inline styles, `<style>` and images as data: URLs still show.
  A frame cannot size itself to its content without a script, so its height is estimated from the
  document (and the user can drag it taller);
* text/markdown keeps its text but not its raw HTML: outside code every `<` is written `&lt;`, so
  `<img onerror=...>` shows as text. Code (fenced, indented, inline) keeps its exact text and is
  written back so that no `<` of it can be read as HTML whatever a renderer makes of it: blocks as
  fences longer than any backtick run inside, spans as `<code>` with every punctuation character an
  entity. Link, image and reference targets whose scheme is not http, https or mailto
  (javascript:, vbscript:, data:, ...) get a `#` in front, which makes them harmless fragments;
* image/svg+xml is written anew from what draws (svg.py): no script, event handler, foreign
  object, link or reference out of the document is left. JupyterLab shows SVG as
  `<img src="data:image/svg+xml,...">` (`renderSVG` in @jupyterlab/rendermime), where nothing of it
  would run anyway, but the classic Notebook and other front ends put it into the page as markup.
  Raster images are sent as base64 and shown as images.

HTML the kernel makes itself (the `%ls` and `%shells` tables) escapes every value it shows and is
not framed.
"""

from __future__ import annotations

import html
import re
import string

from .svg import RefusedSvg, sanitised

__all__ = ["ALLOWED_TYPES", "RefusedSvg", "RefusedType", "check_type", "html_frame", "markdown_text", "svg_image"]

ALLOWED_TYPES: tuple[str, ...] = (
    "image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp", "image/svg+xml",
    "text/html", "text/markdown", "application/json", "text/plain",
)
SAFE_SCHEMES = frozenset({"http", "https", "mailto"})  # link targets in Markdown that are kept as they are

FRAME_MIN_PX = 60
FRAME_MAX_PX = 640
_LINE_PX = 22  # a table row, a paragraph, a line of <pre>
_IMAGE_PX = 150  # an image whose height is not written
_CSP = ("default-src 'none'; img-src data:; media-src data:; font-src data:; style-src 'unsafe-inline' data:; "
        "form-action 'none'")
_FRAME_HEAD = (f'<!DOCTYPE html><meta http-equiv="Content-Security-Policy" content="{_CSP}">'
               "<style>body{margin:4px 0;font:13px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif}</style>")
_DOCTYPE = re.compile(r"^\ufeff?\s*<!doctype[^>]*>", re.IGNORECASE)
_BLOCKS = re.compile(r"<(tr|br|p|li|h[1-6]|div|dt|dd|hr|caption|blockquote|figcaption|summary)\b", re.IGNORECASE)
# What a block takes in the frame's font (13px/1.4: a line is 18.2 px), margins included, as Chromium lays
# them out (measured, tests/test_untrusted_display.py): a paragraph's 1em margins, a heading's larger font.
_BLOCK_PX = {"p": 31, "blockquote": 31, "h1": 60, "h2": 46, "h3": 38, "h4": 40, "h5": 36, "h6": 36, "hr": 18}
_BORDERED_ROW_PX = 25  # a row of a table with borders (pandas' `border="1"`): the lines and padding around it
_BORDERS = re.compile(r"<table\b[^<>]{0,2000}\bborder\s*=\s*[\"']?[1-9]|\bborder(?:-width)?\s*:", re.IGNORECASE)
_PICTURES = re.compile(r"<(?:img|svg|video|canvas)\b[^<>]{0,2000}", re.IGNORECASE)  # bounded: no quadratic scans
_HEIGHT = re.compile(r"""\bheight\s*[=:]\s*["']?\s*(\d{1,5})""", re.IGNORECASE)
_TAGS = re.compile(r"<[^<>]{0,2000}>")

_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")
_LIST_ITEM = re.compile(r"^ {0,3}(?:[-+*]|\d{1,9}[.)])(?:[ \t]|$)")
_PARAGRAPH_BREAK = re.compile(r"(\n[ \t]*\n)")
_TARGET = re.compile(r"\][ \t]*\(|\]:")  # where a link's, an image's or a reference's target follows
_TARGET_GAP = re.compile(r"[ \t]*(?:\n[ \t]*)?")
_ENTITY = re.compile(r"&(?:#[xX][0-9a-fA-F]{1,8}|#[0-9]{1,8}|[A-Za-z][A-Za-z0-9]{1,31});?")
_SCHEME_CHARS = frozenset(string.ascii_letters + string.digits + "+-.")
_SCAN_LIMIT = 1024  # characters looked at for a target's scheme; a target still undecided then is defused
_CODE_ENTITIES = {c: f"&#{ord(c)};" for c in string.punctuation}


class RefusedType(ValueError):
    """A type the notebook must not be asked to show for the sandbox."""

    def __init__(self, mime: str) -> None:
        self.mime = mime
        shown = mime if len(mime) <= 100 else mime[:100] + "..."
        super().__init__(f"type {shown!r} is not shown from the sandbox (it could run code in the notebook's page); "
                         f"allowed types: {', '.join(ALLOWED_TYPES)}")


def check_type(mime: str) -> str:
    """`mime` in lower case if it is one of `ALLOWED_TYPES`; `RefusedType` otherwise."""
    normal = mime.strip().lower()
    if normal not in ALLOWED_TYPES:
        raise RefusedType(mime)
    return normal


# -- HTML ---------------------------------------------------------------------------------------

def html_frame(document: str, title: str) -> str:
    """`document` inside an iframe that may run no script (sandbox="" allows nothing), as text/html."""
    body = _DOCTYPE.sub("", document, count=1)  # ours comes first: standards mode, as in the page itself
    srcdoc = html.escape(_FRAME_HEAD + body, quote=True)
    return (f'<iframe sandbox="" title="{html.escape(title, quote=True)}" referrerpolicy="no-referrer" '
            f'style="display:block;width:100%;height:{frame_height(document)}px;border:0;resize:vertical;'
            f'overflow:auto" srcdoc="{srcdoc}"></iframe>')


def frame_height(document: str) -> int:
    """A height in pixels for a frame showing `document`: its rows, lines and pictures, within bounds."""
    row_px = _BORDERED_ROW_PX if _BORDERS.search(document) else _LINE_PX
    blocks = [tag.lower() for tag in _BLOCKS.findall(document)]
    pixels = sum(_BLOCK_PX.get(tag, row_px if tag == "tr" else _LINE_PX) for tag in blocks)
    pixels += _pre_lines(document) * _LINE_PX
    if not pixels:
        pixels = max(1, sum(1 for line in _TAGS.sub("", document).splitlines() if line.strip())) * _LINE_PX
    for tag in _PICTURES.findall(document):
        written = _HEIGHT.search(tag)
        pixels += int(written.group(1)) if written else _IMAGE_PX
    return max(FRAME_MIN_PX, min(FRAME_MAX_PX, pixels + 24))


def _pre_lines(document: str) -> int:
    """The lines inside <pre> elements (found in one pass: the box chooses the document)."""
    lower, lines, position = document.lower(), 0, 0
    while (start := lower.find("<pre", position)) >= 0:
        end = lower.find("</pre", start)
        lines += lower.count("\n", start, len(lower) if end < 0 else end)
        if end < 0:
            break
        position = end + 5
    return lines


# -- SVG ----------------------------------------------------------------------------------------

def svg_image(svg: str) -> str:
    """`svg` with only what draws (svg.py): safe inline in a page too; RefusedSvg when it cannot be made so."""
    return sanitised(svg)


# -- Markdown -----------------------------------------------------------------------------------

def markdown_text(source: str) -> str:
    """`source` with its raw HTML shown as text, its code kept, and its unsafe link targets defused."""
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    out: list[str] = []
    prose: list[str] = []
    index = 0
    may_start_code = True  # at the start, after a blank line or a code block: where indented code can begin
    in_list = False  # indented lines in a list belong to its items, not to a code block

    def flush() -> None:
        if prose:
            out.append(_prose("\n".join(prose)))
            prose.clear()

    while index < len(lines):
        line = lines[index]
        opening = _FENCE.match(line)
        if opening and not (opening[2][0] == "`" and "`" in opening[3]):
            flush()
            end = index + 1
            while end < len(lines) and not _closes(lines[end], opening[2]):
                end += 1
            indent = len(opening[1])
            out.append(_code_block([_dedent(text, indent) for text in lines[index + 1 : end]], opening[3]))
            index, may_start_code = end + 1, True
            continue
        if may_start_code and not in_list and line.strip() and _indent(line) >= 4:
            flush()
            end = index
            while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) >= 4):
                end += 1
            while not lines[end - 1].strip():
                end -= 1
            out.append(_code_block([_dedent(text, 4) for text in lines[index:end]], ""))
            index = end
            continue
        blank = not line.strip()
        if _LIST_ITEM.match(line):
            in_list = True
        elif not blank and may_start_code and _indent(line) == 0:
            in_list = False
        may_start_code = blank
        prose.append(line)
        index += 1
    flush()
    return "\n".join(out)


def _closes(line: str, fence: str) -> bool:
    """Whether `line` closes a code block opened by `fence` (same character, as long or longer, nothing after)."""
    stripped = line.rstrip(" \t")
    body = stripped.lstrip(" ")
    if len(stripped) - len(body) > 3 or len(body) < len(fence):
        return False
    return body == fence[0] * len(body)


def _indent(line: str) -> int:
    """The columns of white space `line` starts with (a tab reaches the next multiple of 4)."""
    column = 0
    for char in line:
        if char == " ":
            column += 1
        elif char == "\t":
            column += 4 - column % 4
        else:
            break
    return column


def _dedent(line: str, columns: int) -> str:
    """`line` without up to `columns` columns of leading white space."""
    column = 0
    for position, char in enumerate(line):
        if column >= columns or char not in " \t":
            return line[position:]
        width = 1 if char == " " else 4 - column % 4
        if column + width > columns:  # a tab that reaches past the cut leaves its rest as spaces
            return " " * (column + width - columns) + line[position + 1 :]
        column += width
    return ""


def _code_block(body: list[str], info: str) -> str:
    """A fenced block with `body` as its exact text: the fence is longer than any backtick run in it."""
    text = "\n".join(body)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    words = info.split()
    language = re.sub(r"[^\w+#.-]", "", words[0]) if words else ""
    return f"{fence}{language}\n{text}\n{fence}" if body else f"{fence}{language}\n{fence}"


def _prose(text: str) -> str:
    """Markdown outside code blocks: code spans as <code>, every other `<` as `&lt;`, targets defused."""
    pieces = _PARAGRAPH_BREAK.split(text)
    for number in range(0, len(pieces), 2):  # code spans do not cross paragraphs
        paragraph = pieces[number]
        done, position = [], 0
        for start, end, code in _code_spans(paragraph):
            done.append(_escape_tags(paragraph[position:start]))
            done.append(_inline_code(code))
            position = end
        done.append(_escape_tags(paragraph[position:]))
        pieces[number] = "".join(done)
    return _defuse_targets("".join(pieces))


def _code_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of each code span: a backtick run up to the next run of the same length.
    A backslash before an opening run escapes its first backtick (inside a span, backslashes are
    text). Linear: the next run of each length is found by a pointer that only moves forward."""
    runs = [(found.start(), found.end()) for found in re.finditer(r"`+", text)]
    by_length: dict[int, list[int]] = {}
    for number, (start, end) in enumerate(runs):
        by_length.setdefault(end - start, []).append(number)
    next_of: dict[int, int] = {}  # length -> index into by_length[length] of the first run not yet passed
    spans = []
    number = 0
    while number < len(runs):
        start, end = runs[number]
        slashes = 0
        while start - slashes > 0 and text[start - slashes - 1] == "\\":
            slashes += 1
        start += slashes % 2  # an escaped first backtick is text
        candidates = by_length.get(end - start, [])
        pointer = next_of.get(end - start, 0)
        while pointer < len(candidates) and candidates[pointer] <= number:
            pointer += 1
        next_of[end - start] = pointer
        if end == start or pointer == len(candidates):
            number += 1
            continue
        closing = runs[candidates[pointer]]
        spans.append((start, closing[1], text[end : closing[0]]))
        number = candidates[pointer] + 1
    return spans


def _inline_code(code: str) -> str:
    code = code.replace("\n", " ")
    if len(code) > 1 and code[0] == code[-1] == " " and code.strip(" "):
        code = code[1:-1]
    return "<code>" + "".join(_CODE_ENTITIES.get(char, char) for char in code) + "</code>"


def _escape_tags(text: str) -> str:
    """Every `<` as `&lt;` (one backslash that escaped it goes too, so the text shows the same)."""
    pieces, position = [], 0
    while (found := text.find("<", position)) >= 0:
        slashes = 0
        while found - slashes > position and text[found - slashes - 1] == "\\":
            slashes += 1
        pieces.append(text[position : found - slashes % 2] + "&lt;")
        position = found + 1
    pieces.append(text[position:])
    return "".join(pieces)


def _defuse_targets(text: str) -> str:
    """A `#` in front of each link, image or reference target whose scheme is not a safe one."""
    pieces, position = [], 0
    for found in _TARGET.finditer(text):
        start = _TARGET_GAP.match(text, found.end()).end()  # type: ignore[union-attr]
        scheme = target_scheme(text, start)
        if scheme is None or (scheme and scheme not in SAFE_SCHEMES):
            pieces.append(text[position:start] + "#")
            position = start
    pieces.append(text[position:])
    return "".join(pieces)


def target_scheme(text: str, start: int) -> str | None:
    """The scheme a browser would find in the URL written at `start`, read leniently: entities decoded,
    and white space, control characters, backslashes and `<` skipped wherever they are. '' when it
    has none; None when that is not clear within `_SCAN_LIMIT` characters."""
    scheme: list[str] = []
    position, end = start, min(len(text), start + _SCAN_LIMIT)
    while position < end:
        chars = text[position]
        position += 1
        if chars == "&":
            entity = _ENTITY.match(text, position - 1)
            if entity is None:
                return ""
            chars = html.unescape(entity.group())
            position = entity.end()
        for char in chars:
            if char in "\\<" or ord(char) <= 0x20 or ord(char) == 0x7F:
                continue
            if char == ":":
                return "".join(scheme).lower() if scheme and scheme[0].isalpha() else ""
            if char not in _SCHEME_CHARS:
                return ""
            scheme.append(char)
    return None if position >= start + _SCAN_LIMIT else ""
