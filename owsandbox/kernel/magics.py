"""The kernel's magics: files, shells and settings of the sandbox, one `%` away.

A cell whose first line starts with `%%` is a cell magic (the rest is its body); lines starting with
`%` at the top of a cell are line magics, run in order, and any lines after them run as shell code.
Every magic has `--help`; every bad use raises `UsageError` with a message naming what was wrong.
Handlers are plain functions of a `MagicContext` (which talks to the sandbox and to the notebook),
so they run on a worker thread and are tested through a real kernel. `@magic(...)` makes a handler a
`Magic` and registers nothing: this module lists its magics in `BUILTIN_MAGICS`, and the kernel builds
its table from such lists (`magic_table.all_magics`).
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..runner.box import protocol as P
from . import untrusted
from .budget import Withheld
from .errors import UsageError
from .terminal_text import shown_text

if TYPE_CHECKING:
    from .magic_table import MagicTable


@dataclass
class RunOnShell:
    """A magic's answer that means: run `code` as a cell on shell `shell`."""

    shell: str
    code: str


class MagicContext(Protocol):
    settings: dict[str, Any]
    attach: Any  # the kernel's AttachManager
    parent: dict[str, Any]
    magics: MagicTable  # every magic the kernel knows (for %magics)

    def call(self, method: str, params: dict[str, Any], timeout: float = 60.0) -> Any: ...
    # `withheld`: what an output is and how else to see it, said in its place past the output limit
    def stream(self, text: str, name: str = "stdout", withheld: Withheld | None = None) -> None: ...
    def note(self, text: str) -> None: ...
    def display(self, data: dict[str, Any], metadata: dict[str, Any] | None = None,
                display_id: str | None = None, update: bool = False, withheld: Withheld | None = None) -> None: ...
    def describe_sandbox(self) -> dict[str, Any]: ...
    def terminal_open(self) -> dict[str, Any]: ...  # %terminal open: how to open a terminal in the sandbox
    def set_network(self, on: bool) -> str: ...  # the running box's outbound network (%network), in words
    def shell_folder(self) -> str: ...
    def result(self, text: str) -> None: ...
    def clear(self) -> None: ...
    def page(self, text: str, withheld: Withheld | None = None) -> None: ...


# -- parsing ------------------------------------------------------------------------------------

@dataclass
class ParsedCell:
    lines: list[tuple[str, str]] = field(default_factory=list)  # (name, argument text) of line magics
    cell: tuple[str, str, str] | None = None  # (name, argument text, body)
    rest: str = ""  # shell code after the line magics


def parse_cell(code: str) -> ParsedCell | None:
    """The magics at the top of a cell, or None when the cell is plain shell code."""
    stripped = code.lstrip("\n\r\t ")
    if not stripped.startswith("%"):
        return None
    if stripped.startswith("%%"):
        first, _, body = stripped.partition("\n")
        name, _, args = first[2:].partition(" ")
        return ParsedCell(cell=(name.strip(), args.strip(), body))
    parsed = ParsedCell()
    lines = stripped.split("\n")
    index = 0
    while index < len(lines) and lines[index].lstrip().startswith("%"):
        name, _, args = lines[index].strip()[1:].partition(" ")
        parsed.lines.append((name.strip(), args.strip()))
        index += 1
    parsed.rest = "\n".join(lines[index:])
    return parsed


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        raise UsageError(message or f"{self.prog}: bad arguments")


def magic_prefix(kind: str) -> str:
    """How a magic of `kind` ("line" or "cell") is written: `%name` or `%%name`."""
    return "%%" if kind == "cell" else "%"


@dataclass
class Magic:
    """A magic: its name and kind, the line `%magics` shows, its arguments (`configure` adds them to
    its parser, which also gives its `--help`) and the function that does it."""

    name: str
    kind: str  # "line" or "cell"
    summary: str
    handler: Callable[[MagicContext, Any, str], RunOnShell | None]
    configure: Callable[[_Parser], Any] | None = None
    raw: bool = False  # the handler parses its own argument text (JSON, a command line)
    usage: str | None = None  # the usage line, when argparse's own would not say it well
    parser: _Parser = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.parser = _Parser(prog=self.spelled, description=self.summary, add_help=False,
                              usage=self.usage.replace("%", "%%") if self.usage else None)
        self.parser.add_argument("-h", "--help", action="store_true", help="show this help")
        if self.configure is not None:
            self.configure(self.parser)

    @property
    def spelled(self) -> str:
        """`%name` or `%%name`, as a cell writes it."""
        return magic_prefix(self.kind) + self.name

    def run(self, ctx: MagicContext, args_text: str, body: str = "") -> RunOnShell | None:
        if self.raw:
            if args_text.strip() in ("-h", "--help"):
                ctx.stream(self.parser.format_help())
                return None
            return self.handler(ctx, args_text, body)
        try:
            tokens = shlex.split(args_text)
        except ValueError as exc:
            raise UsageError(f"{self.parser.prog}: {exc}") from None
        if "-h" in tokens or "--help" in tokens:
            ctx.stream(self.parser.format_help())
            return None
        return self.handler(ctx, self.parser.parse_args(tokens), body)


def magic(name: str, kind: str, summary: str, configure: Callable[[_Parser], Any] | None = None,
          raw: bool = False, usage: str | None = None) -> Callable[[Callable[..., Any]], Magic]:
    """Make the function below a `Magic`. Nothing is registered: the kernel's table lists the magics
    (`magic_table.all_magics`)."""

    def make(handler: Callable[..., Any]) -> Magic:
        return Magic(name, kind, summary, handler, configure, raw, usage)

    return make


# -- helpers ------------------------------------------------------------------------------------

def _span(text: str, what: str) -> tuple[int, int | None]:
    """`A:B`, `A:` or `A` as numbers; names `what` when it is malformed."""
    start, sep, end = text.partition(":")
    try:
        first = int(start) if start else None
        last = int(end) if end else None
    except ValueError:
        raise UsageError(f"{what} takes A:B with whole numbers, not '{text}'") from None
    if first is None:
        raise UsageError(f"{what} needs a start, as in 1:100, not '{text}'")
    if not sep:
        last = None
    return first, last


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _text_table(headers: list[str], rows: list[list[str]]) -> str:
    cells = [headers] + rows
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in cells)


def show_table(ctx: MagicContext, headers: list[str], rows: list[list[Any]], footer: str = "") -> None:
    """A table as text and HTML; its cells (names, folders, lines of files: the box's words) are text
    for a terminal (terminal_text.shown_text) and escaped for the page."""
    headers = [shown_text(str(h)) for h in headers]
    rows = [[shown_text(str(c)) for c in row] for row in rows]
    footer = shown_text(footer)
    text = _text_table(headers, rows) + footer
    ctx.display({"text/plain": text, "text/html": _table(headers, rows) + (f"<p>{html.escape(footer)}</p>"
                                                                           if footer else "")},
                withheld=Withheld("the table", "ask for fewer rows (a narrower path or pattern, --max)"))


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _when(seconds: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds)) if isinstance(seconds, (int, float)) else ""


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


def read_whole(ctx: MagicContext, path: str, shell: str | None) -> bytes:
    """A whole file in 1 MiB pages, up to MAX_RICH_BYTES."""
    chunks: list[bytes] = []
    offset = 0
    while True:
        params: dict[str, Any] = {"path": path, "offset_bytes": offset, "limit_bytes": 1024 * 1024}
        if shell:
            params["shell"] = shell
        page = ctx.call("fs.read", params)
        if page["total_bytes"] > MAX_RICH_BYTES:
            raise UsageError(f"{path} is {page['total_bytes']} bytes, more than the {MAX_RICH_BYTES} shown at once")
        chunks.append(base64.b64decode(page["data_b64"]))
        offset += page["length"]
        if page["eof"] or not page["length"]:
            return b"".join(chunks)


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


# -- the magics ---------------------------------------------------------------------------------

def _shell(ctx: MagicContext) -> str:
    return ctx.settings["shell"]


@magic("read", "line", "Show a file from the sandbox: text in pages, images, SVG, HTML, Markdown and JSON rendered.",
       lambda p: (p.add_argument("path"),
                  p.add_argument("--lines", metavar="A:B", help="lines A to B (1-based; default 1:200)"),
                  p.add_argument("--bytes", metavar="OFFSET:LIMIT", help="LIMIT bytes from OFFSET"),
                  p.add_argument("--text", action="store_true", help="show a rich file as plain text")))
def _read(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    if args.lines and args.bytes:
        raise UsageError("%read takes --lines or --bytes, not both")
    mime = mime_for(args.path)
    shell = _shell(ctx)
    if mime != "text/plain" and not (args.lines or args.bytes or args.text):
        ctx.display(rich_bundle(read_whole(ctx, args.path, shell), mime, args.path),
                    withheld=Withheld(args.path, "read it in a cell of its own, or raise %output limit"))
        return
    if args.bytes:
        offset, limit = _span(args.bytes, "--bytes")
        page = ctx.call("fs.read", {"path": args.path, "shell": shell, "offset_bytes": offset,
                                    "limit_bytes": limit if limit is not None else 4096})
        data = base64.b64decode(page["data_b64"])
        end = offset + page["length"]
        withheld = Withheld(f"bytes {offset}-{end} of {args.path}", "ask for fewer with --bytes OFFSET:LIMIT")
        try:
            ctx.stream(data.decode("utf-8"), withheld=withheld)
        except UnicodeDecodeError:
            ctx.stream(_hexdump(data, offset), withheld=withheld)
        more = "" if page["eof"] else f"; next: %read {shlex.quote(args.path)} --bytes {end}:{limit or 4096}"
        ctx.note(f"[bytes {offset}-{end} of {page['total_bytes']}{more}]")
        return
    first, last = _span(args.lines, "--lines") if args.lines else (1, 200)
    if first < 1 or (last is not None and last < first):
        raise UsageError(f"--lines wants 1 <= A <= B, not {args.lines}")
    count = (last - first + 1) if last is not None else 200
    page = ctx.call("fs.read", {"path": args.path, "shell": shell, "offset_line": first, "limit_lines": count})
    ctx.stream(page["text"] if page["text"].endswith("\n") or not page["text"] else page["text"] + "\n",
               withheld=Withheld(f"lines {page['start_line']}-{page['end_line']} of {args.path}",
                                 "ask for fewer with --lines A:B, or part of a long line with --bytes"))
    if not page["eof"] or first > 1:
        size = page["end_line"] - page["start_line"] + 1
        more = "" if page["eof"] else \
            f"; next: %read {shlex.quote(args.path)} --lines {page['end_line'] + 1}:{page['end_line'] + max(size, 1)}"
        ctx.note(f"[lines {page['start_line']}-{page['end_line']} of {page['total_lines']}{more}]")


def _hexdump(data: bytes, offset: int) -> str:
    lines = []
    for i in range(0, len(data), 16):
        chunk = data[i : i + 16]
        hexed = " ".join(f"{b:02x}" for b in chunk)
        shown = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset + i:08x}  {hexed:<47}  {shown}\n")
    return "".join(lines)


def _write_args(p: _Parser) -> None:
    p.add_argument("path")
    p.add_argument("--append", action="store_true", help="add to the end of the file")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--if-match", metavar="SHA256", help="write only if the file's sha256 is still this")
    group.add_argument("--new", action="store_true", help="write only if the file does not exist yet")


def _do_write(ctx: MagicContext, args: argparse.Namespace, text: str) -> None:
    params: dict[str, Any] = {"path": args.path, "shell": _shell(ctx), "text": text, "append": args.append,
                              "make_parents": True}
    if args.if_match is not None:
        params["if_match_sha256"] = args.if_match
    elif args.new:
        params["if_match_sha256"] = ""
    try:
        done = ctx.call("fs.write", params)
    except P.RunnerError as err:
        if err.code == P.FS_ERROR:
            raise UsageError(f"not written: {err.message}") from None
        raise
    ctx.stream(f"{'appended' if args.append else 'wrote'} {done['bytes_written']} bytes to {done['path']}\n"
               f"sha256 {done['sha256']}\n")


@magic("write", "cell", "Write the cell's body to a file in the sandbox (atomically).", _write_args)
def _write_cell(ctx: MagicContext, args: argparse.Namespace, body: str) -> None:
    _do_write(ctx, args, body if body.endswith("\n") or not body else body + "\n")


@magic("write", "line", "Write one line of text to a file in the sandbox.",
       lambda p: (_write_args(p), p.add_argument("text", nargs="*", help="the line (words joined by spaces)")))
def _write_line(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    _do_write(ctx, args, " ".join(args.text) + "\n")


@magic("ls", "line", "List a folder in the sandbox (default: the shell's folder).",
       lambda p: p.add_argument("path", nargs="?", default="."))
def _ls(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    listing = ctx.call("fs.list", {"path": args.path, "shell": _shell(ctx)})
    rows = [[e["name"] + ("/" if e["type"] == "folder" else ""), e["type"], _size(e.get("size")),
             _when(e.get("mtime"))] for e in listing["entries"]]
    footer = f"{len(rows)} entries in {listing['path']}" + (" (truncated)" if listing.get("truncated") else "")
    show_table(ctx, ["name", "type", "size", "modified"], rows, footer)


@magic("stat", "line", "Show a path's type, size, mode, time and sha256.", lambda p: p.add_argument("path"))
def _stat(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    info = ctx.call("fs.stat", {"path": args.path, "shell": _shell(ctx)})
    if not info.get("exists"):
        raise UsageError(f"no such file or folder: {info.get('path', args.path)}")
    rows = [["path", info["path"]], ["type", info["type"]], ["size", info.get("size")], ["mode", info.get("mode")],
            ["modified", _when(info.get("mtime"))], ["sha256", info.get("sha256") or ""]]
    show_table(ctx, ["field", "value"], rows)


@magic("search", "line", "Search files in the sandbox for a regular expression.",
       lambda p: (p.add_argument("pattern"), p.add_argument("path", nargs="?", default="."),
                  p.add_argument("-i", "--ignore-case", action="store_true"),
                  p.add_argument("--glob", help="only files whose name matches, e.g. '*.py'"),
                  p.add_argument("--max", type=int, default=200, help="at most this many matches (default 200)")))
def _search(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    params: dict[str, Any] = {"pattern": args.pattern, "path": args.path, "shell": _shell(ctx),
                              "ignore_case": args.ignore_case, "max_matches": args.max}
    if args.glob:
        params["glob"] = args.glob
    limit = ctx.settings.get("timeout")  # the cell's limit bounds a search too (the sandbox's default is 30 s)
    if limit is not None:
        params["timeout_s"] = limit
    try:
        # the sandbox stops the search at its limit and says so; wait a little longer than that for its word
        found = ctx.call("fs.search", params, timeout=60.0 if limit is None else max(60.0, limit + 30.0))
    except P.RunnerError as err:
        if err.code in (P.INVALID_PARAMS, P.FS_ERROR):
            raise UsageError(err.message) from None
        raise
    rows = [[m["path"], m["line"], m["text"]] for m in found["matches"]]
    footer = f"{len(rows)} matches" + (" (more not shown; raise --max)" if found.get("truncated") else "")
    show_table(ctx, ["path", "line", "text"], rows, footer)


@magic("shell", "line", "Switch the shell that cells run on (shells keep their own folder and variables).",
       lambda p: p.add_argument("name"))
def _switch_shell(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    if not args.name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise UsageError(f"a shell name is letters, digits, '-', '_' and '.', not '{args.name}'")
    ctx.settings["shell"] = args.name
    ctx.stream(f"cells now run on shell '{args.name}'\n")


@magic("shell", "cell", "Run this cell on the named shell, without switching.", lambda p: p.add_argument("name"))
def _cell_on_shell(ctx: MagicContext, args: argparse.Namespace, body: str) -> RunOnShell:
    return RunOnShell(args.name, body)


@magic("shells", "line", "List the sandbox's shells with their folder and whether they are busy.")
def _shells(ctx: MagicContext, _args: argparse.Namespace, _body: str) -> None:
    shells = ctx.call("shell.list", {}, timeout=10)["shells"]
    current = _shell(ctx)
    rows = [[("* " if s["name"] == current else "  ") + s["name"], s["cwd"],
             f"busy ({s['running_s']:.1f} s): {s['command']}" if s["busy"] else "idle"] for s in shells]
    if not any(s["name"] == current for s in shells):
        rows.insert(0, [f"* {current}", "(starts with the next cell)", "idle"])
    show_table(ctx, ["shell", "folder", "state"], rows)


@magic("timeout", "line", "Set a time limit for each cell (seconds), or 'off'.",
       lambda p: p.add_argument("seconds", nargs="?"))
def _timeout(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    if args.seconds is None:
        current = ctx.settings.get("timeout")
        ctx.result(f"cell time limit: {'off' if current is None else f'{current:g} s'}")
        return
    if args.seconds in ("off", "none", "0"):
        ctx.settings["timeout"] = None
        ctx.stream("cell time limit: off\n")
        return
    try:
        seconds = float(args.seconds)
    except ValueError:
        raise UsageError(f"%timeout takes a number of seconds or 'off', not '{args.seconds}'") from None
    if not math.isfinite(seconds):
        raise UsageError(f"%timeout takes a finite number of seconds (or 'off'), not {args.seconds}")
    if seconds <= 0:
        raise UsageError(f"%timeout takes a positive number of seconds, not {args.seconds}")
    ctx.settings["timeout"] = seconds
    ctx.stream(f"cell time limit: {seconds:g} s\n")


@magic("output", "line", "Show or set the per-cell output limit: %output limit CHARACTERS.",
       lambda p: (p.add_argument("setting", nargs="?", choices=["limit"]), p.add_argument("value", nargs="?")))
def _output(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    if args.setting is None or args.value is None:
        ctx.result(f"output limit: {ctx.settings['output_limit']} characters per cell")
        return
    text = args.value.upper().rstrip("B")
    scale = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000}.get(text[-1:], 1)
    try:
        limit = int(float(text[:-1] if scale > 1 else text) * scale)
    except (ValueError, OverflowError):
        raise UsageError(f"%output limit takes a size such as 4M or 200000, not '{args.value}'") from None
    if limit < 100:
        raise UsageError(f"%output limit must be at least 100 characters, not {limit}")
    ctx.settings["output_limit"] = limit
    ctx.stream(f"output limit: {limit} characters per cell\n")


@dataclass
class TerminalSettings:
    """How one shell's commands are run (`%terminal`, `%stderr`), sent with each of its `shell.run`s.

    On a terminal (the default) programs behave as they do for a user: colours, line-buffered output,
    prompts that wait for an answer. Off, they get pipes and their exact bytes. stderr on a terminal
    of its own keeps the two streams apart; merged, they are one stream in the exact order written."""

    terminal: bool = True
    cols: int = 120
    rows: int = 50
    stderr: str = "apart"  # or "merge"

    def run_params(self, stdin: bool) -> dict[str, Any]:
        return {"terminal": self.terminal, "cols": self.cols, "rows": self.rows, "stderr": self.stderr,
                "stdin": stdin}

    def describe(self, shell: str) -> str:
        where = f"on a {self.cols}x{self.rows} terminal" if self.terminal else "off (pipes, exact bytes)"
        return f"shell '{shell}': terminal {where}; stderr {self.stderr}"


def terminal_settings(settings: dict[str, Any], shell: str) -> TerminalSettings:
    """The shell's own settings (each shell starts with the defaults)."""
    shells = settings.setdefault("terminals", {})
    if shell not in shells:
        shells[shell] = TerminalSettings()
    return shells[shell]


TERMINAL_SIZES = {"cols": (20, 1000), "rows": (2, 1000)}


@magic("terminal", "line", "Show or set how the current shell's commands run: on a terminal (on, the default) "
       "or on pipes with their exact bytes (off), and the terminal's size; open: how to open a real terminal "
       "(vim, less, top) on a new shell in this sandbox.",
       lambda p: p.add_argument("setting", nargs="*", metavar="on|off|cols N|rows N|open",
                                help="on, off, cols N (20-1000), rows N (2-1000); none: show the settings. "
                                     "Each shell has its own; %%%%shell NAME cells use NAME's. open: the "
                                     "command that opens a terminal in this sandbox"),
       usage="%terminal [on|off] [cols N] [rows N] | %terminal open")
def _terminal(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    if [word.lower() for word in args.setting] == ["open"]:
        ctx.display(ctx.terminal_open())
        return
    shell = _shell(ctx)
    current = terminal_settings(ctx.settings, shell)
    if not args.setting:
        ctx.result(current.describe(shell))
        return
    changed = TerminalSettings(**vars(current))
    words = list(args.setting)
    while words:
        word = words.pop(0).lower()
        if word in ("on", "off"):
            changed.terminal = word == "on"
        elif word in TERMINAL_SIZES:
            low, high = TERMINAL_SIZES[word]
            if not words:
                raise UsageError(f"%terminal {word} takes a number, as in %terminal {word} 100")
            value = words.pop(0)
            if not value.isdigit() or not low <= int(value) <= high:
                raise UsageError(f"%terminal {word} takes a whole number from {low} to {high}, not '{value}'")
            setattr(changed, word, int(value))
        else:
            raise UsageError(f"%terminal takes on, off, cols N, rows N or open (alone), not '{word}'")
    ctx.settings["terminals"][shell] = changed
    ctx.stream(changed.describe(shell) + "\n")


@magic("stderr", "line", "Show or set where the current shell's stderr goes: apart (its own stream, the default) "
       "or merge (into stdout, one stream in the exact order written).",
       lambda p: p.add_argument("mode", nargs="?", choices=["apart", "merge"],
                                help="none: show the setting (each shell has its own)"))
def _stderr(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    shell = _shell(ctx)
    current = terminal_settings(ctx.settings, shell)
    if args.mode is None:
        ctx.result(f"shell '{shell}': stderr {current.stderr}")
        return
    current.stderr = args.mode
    ctx.stream(f"shell '{shell}': stderr {current.stderr}\n")


@magic("page", "line", "Show a text file from the sandbox in the pager (JupyterLab's side panel, the console's pager).",
       lambda p: p.add_argument("path"))
def _page(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    data = read_whole(ctx, args.path, _shell(ctx))
    ctx.page(data.decode("utf-8", "replace"),
             Withheld(args.path, f"%read {shlex.quote(args.path)} --lines A:B pages the rest"))


@magic("clear", "line", "Clear this cell's output so far (a cell that redraws a progress report, say).")
def _clear(ctx: MagicContext, _args: argparse.Namespace, _body: str) -> None:
    ctx.clear()


def _list_magics(ctx: MagicContext, _args: argparse.Namespace, _body: str) -> None:
    rows = [[m.spelled, m.summary] for m in sorted(ctx.magics.values(), key=lambda m: (m.name, m.kind))]
    show_table(ctx, ["magic", "what it does"], rows,
               "Each magic takes --help. Plain lines run in bash; owdisplay FILE shows a file from a shell.")


# The magics of this module, for the kernel's table (`magic_table.all_magics`).
BUILTIN_MAGICS = (
    _read, _write_cell, _write_line, _ls, _stat, _search,
    _switch_shell, _cell_on_shell, _shells,
    _timeout, _output, _terminal, _stderr,
    _page, _clear,
    magic("help", "line", "List the magics.")(_list_magics),
    magic("magics", "line", "List the magics.")(_list_magics),
)
