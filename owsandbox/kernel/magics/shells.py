"""The shell magics: which shell cells run on (`%shell`, `%%shell`, `%shells`), how they run
(`%timeout`, `%output`, `%terminal`, `%stderr`), `%clear`, and the list of magics (`%magics`)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .framework import MagicContext, RunOnShell, magic, show_table
from .framework import current_shell as _shell


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
    shells = ctx.box.shells()
    current = _shell(ctx)
    subshells = ctx.subshell_shells()  # a client's kernel subshells: each runs its cells on a shell of its own

    def named(name: str) -> str:
        return ("* " if name == current else "  ") + name + (" (kernel subshell)" if name in subshells else "")

    rows = [[named(s["name"]), s["cwd"], f"busy ({s['running_s']:.1f} s): {s['command']}" if s["busy"] else "idle"]
            for s in shells]
    if not any(s["name"] == current for s in shells):
        rows.insert(0, [named(current), "(starts with the next cell)", "idle"])
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


def _rate_words(rate: float) -> str:
    return "not paced" if rate == 0 else f"{rate:,.0f} bytes a second, then a live tail"


@magic("output", "line", "Show or set the per-cell output limit (%output limit CHARACTERS) and the rate output is "
       "streamed at before a live tail takes over (%output rate BYTES|off: off for a client with no Jupyter server "
       "between, which keeps every line).",
       lambda p: (p.add_argument("setting", nargs="?", choices=["limit", "rate"]), p.add_argument("value", nargs="?")))
def _output(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    pacer = ctx.settings["pacer"]  # one for the kernel: the server's limit is on the kernel's connection
    if args.setting is None or args.value is None:
        ctx.result(f"output limit: {ctx.settings['output_limit']} characters per cell; output rate: "
                   f"{_rate_words(pacer.rate)}")
        return
    if args.setting == "rate":
        rate = 0 if args.value.lower() in ("off", "0") else _size(args.value, "%output rate")
        if rate < 0:
            raise UsageError(f"%output rate takes bytes a second (or off), not {args.value}")
        pacer.set_rate(rate)
        ctx.stream(f"output rate: {_rate_words(rate)}\n")
        return
    limit = _size(args.value, "%output limit")
    if limit < 100:
        raise UsageError(f"%output limit must be at least 100 characters, not {limit}")
    ctx.settings["output_limit"] = limit
    ctx.stream(f"output limit: {limit} characters per cell\n")


def _size(value: str, magic: str) -> int:
    text = value.upper().rstrip("B")
    scale = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000}.get(text[-1:], 1)
    try:
        limit = int(float(text[:-1] if scale > 1 else text) * scale)
    except (ValueError, OverflowError):
        raise UsageError(f"{magic} takes a size such as 4M or 200000, not '{value}'") from None
    return limit


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

    def describe(self, shell: str) -> str:
        where = f"on a {self.cols}x{self.rows} terminal" if self.terminal else "on pipes, exact bytes (terminal off)"
        return f"shell '{shell}': {where}; stderr {self.stderr}"


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


@magic("clear", "line", "Clear this cell's output so far (a cell that redraws a progress report, say).")
def _clear(ctx: MagicContext, _args: argparse.Namespace, _body: str) -> None:
    ctx.clear()


def _list_magics(ctx: MagicContext, _args: argparse.Namespace, _body: str) -> None:
    rows = [[m.spelled, m.summary] for m in sorted(ctx.magics.values(), key=lambda m: (m.name, m.kind))]
    show_table(ctx, ["magic", "what it does"], rows,
               "Each magic takes --help. Plain lines run in bash; owdisplay FILE shows a file from a shell.")



# The magics of this module, for the kernel's table (`table.all_magics`).
SHELL_MAGICS = (
    _switch_shell, _cell_on_shell, _shells,
    _timeout, _output, _terminal, _stderr,
    _clear,
    magic("help", "line", "List the magics.")(_list_magics),
    magic("magics", "line", "List the magics.")(_list_magics),
)
