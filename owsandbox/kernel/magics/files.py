"""The file magics: `%read`, `%write`, `%%write`, `%ls`, `%stat`, `%search` and `%page`, on the
sandbox's files through the runner's `fs.*` calls, relative to the current shell's folder."""

from __future__ import annotations

import argparse
import base64
import shlex
import time
from typing import Any

from ... import protocol as P
from ...protocol.words import counted
from ..cell.budget import Withheld
from ..display.rich import MAX_RICH_BYTES, mime_for, rich_bundle
from ..errors import UsageError
from .framework import MagicContext, MagicParser, magic, show_table
from .framework import current_shell as _shell


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


def read_whole(ctx: MagicContext, path: str, shell: str | None) -> bytes:
    """A whole file in 1 MiB pages, up to MAX_RICH_BYTES."""
    chunks: list[bytes] = []
    offset = 0
    while True:
        params: dict[str, Any] = {"path": path, "offset_bytes": offset, "limit_bytes": 1024 * 1024}
        if shell:
            params["shell"] = shell
        page = ctx.box.read(params)
        if page["total_bytes"] > MAX_RICH_BYTES:
            raise UsageError(f"{path} is {page['total_bytes']} bytes, more than the {MAX_RICH_BYTES} shown at once")
        chunks.append(base64.b64decode(page["data_b64"]))
        offset += page["length"]
        if page["eof"] or not page["length"]:
            return b"".join(chunks)


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
        page = ctx.box.read({"path": args.path, "shell": shell, "offset_bytes": offset,
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
    page = ctx.box.read({"path": args.path, "shell": shell, "offset_line": first, "limit_lines": count})
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


def _write_args(p: MagicParser) -> None:
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
        done = ctx.box.write(params)
    except P.RunnerError as err:
        if err.code == P.FS_ERROR:
            raise UsageError(f"not written: {err.message}") from None
        raise
    ctx.stream(f"{'appended' if args.append else 'wrote'} {counted(done['bytes_written'], 'byte')} to {done['path']}\n"
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
    listing = ctx.box.list({"path": args.path, "shell": _shell(ctx)})
    rows = [[e["name"] + ("/" if e["type"] == "folder" else ""), e["type"], _size(e.get("size")),
             _when(e.get("mtime"))] for e in listing["entries"]]
    footer = (f"{counted(len(rows), 'entry', 'entries')} in {listing['path']}"
              + (" (truncated)" if listing.get("truncated") else ""))
    show_table(ctx, ["name", "type", "size", "modified"], rows, footer)


@magic("stat", "line", "Show a path's type, size, mode, time and sha256.", lambda p: p.add_argument("path"))
def _stat(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    info = ctx.box.stat({"path": args.path, "shell": _shell(ctx)})
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
        found = ctx.box.search(params, timeout=60.0 if limit is None else max(60.0, limit + 30.0))
    except P.RunnerError as err:
        if err.code in (P.INVALID_PARAMS, P.FS_ERROR):
            raise UsageError(err.message) from None
        raise
    rows = [[m["path"], m["line"], m["text"]] for m in found["matches"]]
    footer = (counted(len(rows), "match", "matches")
              + (" (more not shown; raise --max)" if found.get("truncated") else ""))
    show_table(ctx, ["path", "line", "text"], rows, footer)


@magic("page", "line", "Show a text file from the sandbox in the pager (JupyterLab's side panel, the console's pager).",
       lambda p: p.add_argument("path"))
def _page(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    data = read_whole(ctx, args.path, _shell(ctx))
    ctx.page(data.decode("utf-8", "replace"),
             Withheld(args.path, f"%read {shlex.quote(args.path)} --lines A:B pages the rest"))



# The magics of this module, for the kernel's table (`table.all_magics`).
FILE_MAGICS = (_read, _write_cell, _write_line, _ls, _stat, _search, _page)
