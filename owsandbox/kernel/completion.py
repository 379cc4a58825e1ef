"""Tab completion and inspection, answered from the sandbox without touching the user's shells.

A shell may be busy running a cell, and running anything in it would change its `$?` or race the
next cell, so completion asks the daemon for what it can see on its own: folder listings (relative
to the shell's folder), `compgen` in a fresh bash for commands and variables, plus the variables
that earlier cells assigned. Magic names and their path arguments complete too.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from . import magics

if TYPE_CHECKING:
    from .kernel import OwSandboxKernel

_BREAKS = set(" \t\n;|&<>()`\"'=")
_COMMAND_BEFORE = re.compile(r"(^|[;&|(`]|\$\(|&&|\|\||\b(then|do|else|elif|time|sudo|xargs|exec)\s)\s*$")
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


def _sandbox_call(kernel: OwSandboxKernel, method: str, params: dict[str, Any]) -> Any:
    return kernel.sandbox.client.call(method, params, timeout=5)


def _compgen(kernel: OwSandboxKernel, kind: str, prefix: str) -> list[str]:
    done = _sandbox_call(kernel, "proc.run", {
        "argv": ["bash", "-c", f'compgen {kind} -- "$1" | sort -u | head -n 300', "complete", prefix],
        "cwd": kernel.shell_folder(kernel.settings["shell"]), "timeout_s": 5})
    return [line for line in done["stdout"].splitlines() if line]


def _paths(kernel: OwSandboxKernel, typed: str) -> list[str]:
    folder_part, _, name_part = typed.rpartition("/")
    if "/" in typed:
        folder_part += "/"
    listing_path = os.path.expanduser(folder_part) if folder_part else "."
    if not os.path.isabs(listing_path):
        listing_path = os.path.join(kernel.shell_folder(kernel.settings["shell"]), listing_path)
    try:
        listing = _sandbox_call(kernel, "fs.list", {"path": listing_path})
    except Exception:  # noqa: BLE001 - no such folder: nothing to offer
        return []
    matches = []
    for entry in listing["entries"]:
        name = entry["name"]
        if name.startswith(name_part) and (name_part.startswith(".") or not name.startswith(".")):
            matches.append(folder_part + name + ("/" if entry["type"] == "folder" else ""))
    return matches[:300]


def complete(kernel: OwSandboxKernel, code: str, cursor: int) -> tuple[list[str], int, int]:
    start, end = word_at(code, cursor)
    typed = code[start:end]
    line_start = code.rfind("\n", 0, start) + 1
    before = code[line_start:start]
    if typed.startswith("%") and not before.strip():
        return [name for name in magics.magic_names() if name.startswith(typed)], start, end
    if typed.startswith("$"):
        bare = typed.lstrip("${")
        names = set(_compgen(kernel, "-v", bare)) | {n for n in assigned_names(_history(kernel)) if n.startswith(bare)}
        lead = typed[: len(typed) - len(bare)]
        return [lead + name for name in sorted(names)], start, end
    if _COMMAND_BEFORE.search(before) and "/" not in typed and not before.lstrip().startswith("%"):
        commands = _compgen(kernel, "-abck -A function", typed) if typed else []
        return sorted(set(commands)) + _paths(kernel, typed), start, end
    return _paths(kernel, typed), start, end


def _history(kernel: OwSandboxKernel) -> list[str]:
    return list(getattr(kernel, "cell_history", []))[-200:]


def inspect_word(kernel: OwSandboxKernel, code: str, cursor: int) -> str:
    word = whole_word_at(code, cursor) or whole_word_at(code, max(cursor - 1, 0))
    if not word:
        return ""
    if word.startswith("%"):
        kind = "cell" if word.startswith("%%") else "line"
        found = magics.MAGICS.get((kind, word.lstrip("%")))
        return found.parser.format_help() if found else ""
    done = _sandbox_call(kernel, "proc.run", {
        "argv": ["bash", "-c", 'type -- "$1" 2>/dev/null || exit 1; help -d -- "$1" 2>/dev/null; '
                               'man -f -- "$1" 2>/dev/null; exit 0', "inspect", word],
        "cwd": kernel.shell_folder(kernel.settings["shell"]), "timeout_s": 5})
    return done["stdout"] if done["exit_code"] == 0 else ""
