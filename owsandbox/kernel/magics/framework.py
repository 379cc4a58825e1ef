"""The magics' framework: how a cell's magics are parsed, what a magic is, and what it may touch.

A cell whose first line starts with `%%` is a cell magic (the rest is its body); lines starting with
`%` at the top of a cell are line magics, run in order, and any lines after them run as shell code.
Every magic has `--help`; every bad use raises `UsageError` with a message naming what was wrong.
Handlers are plain functions of a `MagicContext` (which talks to the sandbox and to the notebook),
so they run on a worker thread and are tested through a real kernel. `@magic(...)` makes a handler a
`Magic` and registers nothing: each module of magics lists its own (`FILE_MAGICS`, ...), and the
kernel builds its table from such lists (`table.all_magics`).
"""

from __future__ import annotations

import argparse
import html
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..cell.budget import Withheld
from ..cell.terminal_text import shown_text
from ..display.math_safe import no_math
from ..errors import UsageError

if TYPE_CHECKING:
    from ...host.api import SandboxAPI
    from .table import MagicTable



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

    @property
    def box(self) -> SandboxAPI: ...  # the sandbox's calls, by name
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
    def subshell_shells(self) -> dict[str, str]: ...  # shell name → the kernel subshell whose cells run on it
    def usage(self) -> dict[str, Any]: ...  # what the sandbox uses now, as the Kernel Usage panel gets it
    def preview_box(self) -> Any: ...  # %preview: the kernel's connection file, provider and execd endpoint


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


class MagicParser(argparse.ArgumentParser):
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
    configure: Callable[[MagicParser], Any] | None = None
    raw: bool = False  # the handler parses its own argument text (JSON, a command line)
    usage: str | None = None  # the usage line, when argparse's own would not say it well
    parser: MagicParser = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.parser = MagicParser(prog=self.spelled, description=self.summary, add_help=False,
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


def magic(name: str, kind: str, summary: str, configure: Callable[[MagicParser], Any] | None = None,
          raw: bool = False, usage: str | None = None) -> Callable[[Callable[..., Any]], Magic]:
    """Make the function below a `Magic`. Nothing is registered: the kernel's table lists the magics
    (`table.all_magics`)."""

    def make(handler: Callable[..., Any]) -> Magic:
        return Magic(name, kind, summary, handler, configure, raw, usage)

    return make


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
    ctx.display({"text/plain": text, "text/html": no_math(_table(headers, rows) + (f"<p>{html.escape(footer)}</p>"
                                                                                   if footer else ""))},
                withheld=Withheld("the table", "ask for fewer rows (a narrower path or pattern, --max)"))


def current_shell(ctx: MagicContext) -> str:
    return ctx.settings["shell"]

