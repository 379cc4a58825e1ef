"""Tab completion and inspection, answered from the sandbox without touching the user's shells.

A shell may be busy running a cell, and running anything in it would change its `$?` or race the
next cell, so completion asks the daemon (`shell.complete`, `shell.inspect`), which answers from a
fresh bash in the shell's folder that knows the shell's functions, aliases and PATH as of its last
idle moment (owsandbox/box/shell/complete.py says how): commands, functions and aliases, variables
(plus the ones earlier cells assigned), options and other arguments from bash-completion when the
box has it, and folder listings for paths. Magic names and their path arguments complete too.

The kernel hands these functions a `CompletionContext`: the little of it that completion reads.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import protocol as P
from ...host.api import SandboxAPI
from ..attach.send_completion import Words, send_matches

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..magics.table import MagicTable

COMPLETION_SECONDS = 5  # a completion that takes longer is not worth waiting for


@dataclass
class CompletionContext:
    """What completion may use of the kernel, taken when the request came."""

    shell: str  # the current shell: its functions, variables and folder are the ones that count
    box: SandboxAPI  # the sandbox's calls
    folder: Callable[[], str]  # the current shell's folder
    history: list[str]  # the cells run so far (the variables they assigned complete too)
    magics: MagicTable
    attach_words: Words | None = None  # the attached programs' method and tool names, for %send

_BREAKS = set(" \t\n;|&<>()`\"'=")
_COMMAND_BEFORE = re.compile(r"(^|[;&|(`]|\$\(|&&|\|\||\b(then|do|else|elif|time|sudo|xargs|exec)\s)\s*$")
_SEPARATOR = re.compile(r"[;&|(`]|\$\(")  # where a simple command starts
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
_PREFIX_WORDS = {"then", "do", "else", "elif", "!", "{", "time"}
_ASSIGNED = re.compile(r"(?:^|[\s;&|(])(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?|readonly\s+)?"
                       r"([A-Za-z_][A-Za-z0-9_]*)(?:\+?=)|\b(?:read(?:\s+-\w+)*|for)\s+([A-Za-z_][A-Za-z0-9_]*)")


def word_at(code: str, cursor: int) -> tuple[int, int]:
    """The span of the word that ends at the cursor (for completion)."""
    start = cursor
    while start > 0 and code[start - 1] not in _BREAKS:
        start -= 1
    return start, cursor


def whole_word_at(code: str, cursor: int) -> str:
    start, _ = word_at(code, cursor)
    end = cursor
    while end < len(code) and code[end] not in _BREAKS:
        end += 1
    return code[start:end]


def assigned_names(history: list[str]) -> set[str]:
    names: set[str] = set()
    for code in history:
        for match in _ASSIGNED.finditer(code):
            names.add(match.group(1) or match.group(2))
    return names


def _shell_complete(ctx: CompletionContext, what: str, word: str, words: list[str] | None = None) -> list[str]:
    params: dict[str, Any] = {"shell": ctx.shell, "what": what, "word": word}
    if words is not None:
        params["words"] = words
    return ctx.box.complete(params, timeout=COMPLETION_SECONDS)


def command_words(before: str) -> list[str]:
    """The words of the simple command that `before` (its line up to the word at the cursor) is in, as
    bash splits them for completion (a `=` is a word of its own); [] when there is no command."""
    words = _SEPARATOR.split(before)[-1].split()
    while words and (words[0] in _PREFIX_WORDS or _ASSIGNMENT.match(words[0])):
        words.pop(0)
    return [part for word in words for part in re.findall(r"=|[^=]+", word)]


def _arguments(ctx: CompletionContext, before: str, typed: str) -> list[str]:
    """What bash-completion offers for the word (options, subcommands, ...), paths left out."""
    words = command_words(before)
    if not words:
        return []
    try:
        return _shell_complete(ctx, "arguments", typed, [*words, typed])
    except (P.RunnerError, TimeoutError) as exc:  # an older runner, or a slow completion: the paths still come
        log.debug("argument completion of %r: %s", typed, exc)
        return []


def _paths(ctx: CompletionContext, typed: str) -> list[str]:
    folder_part, _, name_part = typed.rpartition("/")
    if "/" in typed:
        folder_part += "/"
    listing_path = folder_part or "."  # `~` is the box's home: the box expands it
    if not listing_path.startswith("~") and not os.path.isabs(listing_path):
        listing_path = os.path.join(ctx.folder(), listing_path)
    try:
        listing = ctx.box.list({"path": listing_path}, timeout=COMPLETION_SECONDS)
    except Exception as exc:  # noqa: BLE001 - no such folder: nothing to offer
        log.debug("no paths to complete in %s: %s", listing_path, exc)
        return []
    matches = []
    for entry in listing["entries"]:
        name = entry["name"]
        if name.startswith(name_part) and (name_part.startswith(".") or not name.startswith(".")):
            matches.append(folder_part + name + ("/" if entry["type"] == "folder" else ""))
    return matches[:300]


def complete(ctx: CompletionContext, code: str, cursor: int) -> tuple[list[str], int, int]:
    start, end = word_at(code, cursor)
    typed = code[start:end]
    line_start = code.rfind("\n", 0, start) + 1
    before = code[line_start:start]
    if ctx.attach_words is not None:
        names = send_matches(code, line_start, start, typed, ctx.attach_words)
        if names is not None:
            return names, start, end
    if typed.startswith("%") and not before.strip():
        return [name for name in ctx.magics.names() if name.startswith(typed)], start, end
    if typed.startswith("$"):
        bare = typed.lstrip("${")
        names = set(_shell_complete(ctx, "variables", bare))
        names |= {n for n in assigned_names(ctx.history) if n.startswith(bare)}
        lead = typed[: len(typed) - len(bare)]
        return [lead + name for name in sorted(names)], start, end
    if _COMMAND_BEFORE.search(before) and "/" not in typed and not before.lstrip().startswith("%"):
        commands = _shell_complete(ctx, "commands", typed) if typed else []
        return sorted(set(commands)) + _paths(ctx, typed), start, end
    paths = _paths(ctx, typed)
    if before.lstrip().startswith("%"):
        return paths, start, end
    return paths + [match for match in _arguments(ctx, before, typed) if match not in paths], start, end


def inspect_word(ctx: CompletionContext, code: str, cursor: int) -> str:
    word = whole_word_at(code, cursor) or whole_word_at(code, max(cursor - 1, 0))
    if not word:
        return ""
    if word.startswith("%"):
        kind = "cell" if word.startswith("%%") else "line"
        found = ctx.magics.get((kind, word.lstrip("%")))
        return found.parser.format_help() if found else ""
    return ctx.box.inspect(ctx.shell, word, timeout=COMPLETION_SECONDS)
