"""Tab completion and inspection (`shell.complete`, `shell.inspect`), answered by a fresh bash in the box.

A user's shell may be running a cell, and anything typed into it would race the cell or change its
`$?`, so it never runs completion itself. A fresh `bash` does, in the shell's folder, after sourcing
what the shell knows that a fresh bash does not: its functions, aliases and PATH, from the file the
shell writes while it is idle (`Shell.write_definitions`, asked for just before; a busy shell's file
is the one it wrote when it was last idle, so a function defined in a cell completes once that cell
has ended, also while the next one runs). Why the shell writes them only when asked, or idle after
being asked once, is in definitions.py: a file written after every command would tax every cell.
Sourcing `declare -f` and `alias -p` output defines names without running any of them, and only
builtins run after it, so no code of the user's runs at a Tab.

Options and other arguments come from the bash-completion package when the box has it: its file is
sourced (never with the user's definitions: its completion functions run commands, such as
`ls --help`), the command's completion is loaded (by bash-completion's default completion, which
loads on demand), and its function is called with COMP_WORDS, COMP_CWORD, COMP_LINE and COMP_POINT
set, as readline would; a spec without a function (`-W`, `-A`, ...) goes through `compgen`. It runs
with a time limit, and what names an existing path is left out (the kernel lists paths itself, with
a `/` on folders). Without bash-completion there are no such matches, only the kernel's paths.
Standard library only: this module is copied into the sandbox.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ...protocol import INVALID_PARAMS, RunnerError
from ..params import get, string_list
from ..procs import proc_run
from .lines import OWDISPLAY_FUNCTION

BASH_COMPLETION_FILES = ("/usr/share/bash-completion/bash_completion",
                         "/usr/local/share/bash-completion/bash_completion", "/etc/bash_completion")
MAX_DEFINITIONS_BYTES = 4 * 1024 * 1024  # a shell's definitions file past this is not sourced
MAX_MATCHES = 300
NAMES_TIMEOUT_S = 3.0
ARGUMENTS_TIMEOUT_S = 2.0  # bash-completion's functions run commands; a slow one gives no matches
OWDISPLAY_NOTE = "owdisplay is a shell function that every shell of this kernel has."

# $1 owdisplay's definition, $2 the shell's definitions file (or ''), $3 what, $4 the word.
_NAMES = r"""eval "$1"
[[ -n $2 ]] && . "$2" >/dev/null 2>&1
case $3 in
  commands) builtin compgen -abck -A function -- "$4";;
  variables) builtin compgen -v -- "$4";;
esac
builtin exit 0
"""

# $1 owdisplay's definition, $2 the shell's definitions file (or ''), $3 the word, $4 a note on
# owdisplay. `help`, `man` and owdisplay's own help run before the definitions come in (a cell may
# have redefined `echo`); `type` sees aliases only with expand_aliases, on for that line alone.
_INSPECT = r"""eval "$1"
__ows_ref=$(declare -f owdisplay) __ows_usage=$(owdisplay --help 2>&1)
__ows_help=$(help -d -- "$3" 2>/dev/null) __ows_man=$(man -f -- "$3" 2>/dev/null)
[[ -n $2 ]] && . "$2" >/dev/null 2>&1
if [[ $3 == owdisplay && $(builtin declare -f owdisplay) == "$__ows_ref" ]]; then
  builtin printf '%s\n\n%s\n' "$__ows_usage" "$4"
  builtin exit 0
fi
builtin shopt -s expand_aliases; __ows_type=$(\builtin type -- "$3" 2>/dev/null) || builtin exit 1
\builtin shopt -u expand_aliases
builtin printf '%s\n' "$__ows_type"
[[ -n $__ows_help ]] && builtin printf '%s\n' "$__ows_help"
[[ -n $__ows_man ]] && builtin printf '%s\n' "$__ows_man"
builtin exit 0
"""

# $1 bash-completion's file, then the words of the command line, the last one being completed.
_ARGUMENTS = r""". "$1" >/dev/null 2>&1 || exit 3
shift
COMP_WORDS=("$@") COMP_CWORD=$(($# - 1)) COMP_LINE="$*" COMP_TYPE=9 COMP_KEY=9
COMP_POINT=${#COMP_LINE}
__ows_cmd=${COMP_WORDS[0]} __ows_cur=${COMP_WORDS[COMP_CWORD]} __ows_prev=${COMP_WORDS[COMP_CWORD-1]}
__ows_spec=$(complete -p -- "$__ows_cmd" 2>/dev/null)
if [[ -z $__ows_spec ]]; then  # not loaded yet: bash-completion's default completion loads it
  [[ $(complete -p -D 2>/dev/null) =~ \ -F\ ([^ ]+) ]] &&
    "${BASH_REMATCH[1]}" "$__ows_cmd" "$__ows_cur" "$__ows_prev" >/dev/null 2>&1
  __ows_spec=$(complete -p -- "$__ows_cmd" 2>/dev/null)
fi
[[ -n $__ows_spec ]] || exit 0
COMPREPLY=()
if [[ $__ows_spec =~ \ -F\ ([^ ]+) ]]; then
  "${BASH_REMATCH[1]}" "$__ows_cmd" "$__ows_cur" "$__ows_prev" >/dev/null 2>&1
else  # `complete -W ... NAME`: the same options, without the name, make the compgen
  __ows_spec=${__ows_spec#complete } __ows_spec=${__ows_spec% *}
  mapfile -t COMPREPLY < <(eval "compgen $__ows_spec -- \"\$__ows_cur\"" 2>/dev/null)
fi
[[ ${#COMPREPLY[@]} -gt 0 ]] && printf '%s\0' "${COMPREPLY[@]}"
exit 0
"""


def bash_completion_file() -> str | None:
    return next((path for path in BASH_COMPLETION_FILES if os.path.isfile(path)), None)


def _fresh_bash(script: str, args: list[str], cwd: str, timeout: float) -> dict[str, Any]:
    return proc_run({"argv": ["bash", "--norc", "--noprofile", "-c", script, "owsandbox", *args],
                     "timeout_s": timeout}, cwd)


def _usable(path: str | None) -> str:
    """The definitions file to source, or '' (none yet, or too big to source at a Tab)."""
    try:
        return path if path and os.path.getsize(path) <= MAX_DEFINITIONS_BYTES else ""
    except OSError:
        return ""


def _limited(names: list[str]) -> list[str]:
    return sorted({name for name in names if name and not name.startswith("__ows")})[:MAX_MATCHES]


def shell_complete(p: dict[str, Any], cwd: str, definitions: Callable[[], str | None]) -> dict[str, Any]:
    """Matches for `word`: `what` is commands (with the shell's functions and aliases), variables, or
    arguments (bash-completion's, for `words`, the command line up to and with the word)."""
    what = get(p, "what", str)
    word = get(p, "word", str)
    if what in ("commands", "variables"):
        defs = _usable(definitions()) if what == "commands" else ""
        done = _fresh_bash(_NAMES, [OWDISPLAY_FUNCTION, defs, what, word], cwd, NAMES_TIMEOUT_S)
        return {"matches": _limited(done["stdout"].splitlines())}
    if what != "arguments":
        raise RunnerError(INVALID_PARAMS, f"param 'what' must be commands, variables or arguments, not {what!r}")
    words = string_list(p, "words")
    if len(words) < 2 or words[-1] != word:
        raise RunnerError(INVALID_PARAMS, "param 'words' must be the command and its words up to 'word'")
    script_file = bash_completion_file()
    if script_file is None:
        return {"matches": [], "bash_completion": False}
    done = _fresh_bash(_ARGUMENTS, [script_file, *words], cwd, ARGUMENTS_TIMEOUT_S)
    matches: list[str] = []
    for match in done["stdout"].split("\0"):
        match = match.rstrip(" ")
        if match and match not in matches and not os.path.lexists(os.path.join(cwd, os.path.expanduser(match))):
            matches.append(match)
    return {"matches": matches[:MAX_MATCHES], "bash_completion": True, "timed_out": done["timed_out"]}


def shell_inspect(p: dict[str, Any], cwd: str, definitions: Callable[[], str | None]) -> dict[str, Any]:
    """What `type WORD` says in the shell (a function's definition, an alias), with `help -d` and
    `man -f`; for owdisplay as every shell has it, its help. Empty when the word names nothing."""
    word = get(p, "word", str)
    done = _fresh_bash(_INSPECT, [OWDISPLAY_FUNCTION, _usable(definitions()), word, OWDISPLAY_NOTE], cwd,
                       NAMES_TIMEOUT_S)
    return {"text": done["stdout"] if done["exit_code"] == 0 else ""}
