"""The reference pages' generated parts, made from the code's own tables when the docs are built, so they
cannot drift from what the program does:

* ``{owsandbox-magics}``: every magic of the kernel's table (`owsandbox.kernel.magics.table.all_magics`),
  each with its summary and its `--help`, as a cell prints it;
* ``{owsandbox-commands}``: every command of `owsandbox` (`owsandbox.cli.COMMANDS`), each with its
  `--help`, as the command prints it;
* ``{owsandbox-settings}``: every `OWSANDBOX_*` setting (`owsandbox.settings.describe`, the list that
  `owsandbox settings` prints), with what it does, what it takes and the module that reads it.

Nothing here restates a table: a magic, a command or a setting added to the code is in the next build.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx

HELP_COLUMNS = "100"  # argparse wraps help to $COLUMNS: a fixed width, whatever terminal builds the docs


def _section(title: str, ident: str) -> nodes.section:
    section = nodes.section(ids=[ident], names=[nodes.fully_normalize_name(ident)])
    section += nodes.title(text=title)
    return section


def _literal(text: str) -> nodes.literal_block:
    block = nodes.literal_block(text, text)
    block["language"] = "text"
    return block


def _paragraph(text: str) -> nodes.paragraph:
    """A paragraph whose `backticked` words are code, as the tables write them."""
    para = nodes.paragraph()
    for index, part in enumerate(re.split(r"`([^`]*)`", text)):
        if part:
            para += nodes.literal(part, part) if index % 2 else nodes.Text(part)
    return para


def _sentence(text: str) -> str:
    """A table's phrase as a sentence: a capital first, a full stop last (one only)."""
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


class MagicsDirective(Directive):
    """Every magic in the kernel's table, in the order `%magics` lists them, with its `--help`."""

    def run(self) -> list[nodes.Node]:
        from owsandbox.kernel.magics.table import all_magics

        table = all_magics()
        out: list[nodes.Node] = []
        with _columns():
            for magic in sorted(table.values(), key=lambda m: (m.name, m.kind)):
                section = _section(magic.spelled, f"magic-{magic.kind}-{magic.name}")
                section += _literal(magic.parser.format_help().rstrip())
                out.append(section)
        return out


class CommandsDirective(Directive):
    """Every `owsandbox` command, with the line `owsandbox --help` gives it and its own `--help`."""

    def run(self) -> list[nodes.Node]:
        from owsandbox import cli

        out: list[nodes.Node] = [_literal(cli.USAGE)]
        for spelled, meaning in cli.COMMANDS:
            word = spelled.split()[0]
            section = _section(f"owsandbox {spelled}", f"command-{word}")
            section += _paragraph(_sentence(meaning))
            subcommands = [s for s in spelled.split(None, 1)[1].split("|")] if word == "runner" else [""]
            for sub in subcommands:
                argv = [word, *([sub] if sub else []), "--help"]
                section += _literal(_help_of(cli.main, argv))
            out.append(section)
        return out


class SettingsDirective(Directive):
    """Every setting of `owsandbox.settings`, in its order: the list `owsandbox settings` prints."""

    def run(self) -> list[nodes.Node]:
        from owsandbox.settings import describe

        out: list[nodes.Node] = []
        for setting in describe():
            section = _section(setting.name, setting.name.lower().replace("_", "-"))
            section += _paragraph(_sentence(setting.meaning))
            facts = nodes.bullet_list()
            rows = [f"Takes {setting.takes}.", f"Read by `owsandbox.{setting.reader}`."]
            if setting.secret:
                rows.append("A secret: `owsandbox settings` says it is set, never its value.")
            for row in rows:
                item = nodes.list_item()
                item += _paragraph(row)
                facts += item
            section += facts
            out.append(section)
        return out


@contextlib.contextmanager
def _columns() -> Any:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def _help_of(main: Any, argv: list[str]) -> str:
    """What `owsandbox ARGV` prints (a `--help`), run in this process; an error if it printed nothing."""
    out = io.StringIO()
    with _columns(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
    text = out.getvalue().rstrip()
    if not text:
        raise RuntimeError(f"owsandbox {' '.join(argv)} printed no help")
    return text


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("owsandbox-magics", MagicsDirective)
    app.add_directive("owsandbox-commands", CommandsDirective)
    app.add_directive("owsandbox-settings", SettingsDirective)
    from pygments.lexers.shell import BashLexer

    app.add_lexer("cell", BashLexer)  # a notebook cell of this kernel: bash, and magics (tests/test_docs.py runs them)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
