"""What the host writes into a shell's bash, as text: its start-up, each command's line, the end
markers after it, and where its output goes; and the marks that come back in the output.

Every line is built here, from values that are quoted for bash (`ansi_c_quote`) or are the host's
own (tokens, descriptor numbers), so that nothing a command contains can end the line early or run
in its place. The reader that finds the marks again is in reader.py and capture.py.
"""

from __future__ import annotations

import os

from .colours import COLOUR_INIT

MARK_OUT_FD = 63
MARK_ERR_FD = 62
DISPLAY_START = "\x1f\x1dOWD:"  # a line asking the notebook to show a file: mime TAB id TAB path
# The types `owdisplay --mime` takes: none of them can run code in the notebook's page. A courtesy to
# the user only (a clear error, at once): the kernel checks again what it is asked to show
# (owsandbox/kernel/display/untrusted.py), since anything in the box can print a display line.
DISPLAY_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp", "image/svg+xml",
                 "text/html", "text/markdown", "application/json", "text/plain")
# The function every shell has, kept as bash in a file of its own (owdisplay.bash: `bash -n` checks it),
# read by the loader that read this module, from its folder or the zipapp (as `pkgutil.get_data` does,
# without the imports of `pkgutil` in every daemon).
OWDISPLAY_FUNCTION = (__loader__.get_data(os.path.join(os.path.dirname(__file__), "owdisplay.bash"))  # type: ignore[union-attr]
                      .decode("utf-8").replace("@TYPES_CASE@", "|".join(DISPLAY_TYPES))
                      .replace("@TYPES_LIST@", ", ".join(DISPLAY_TYPES)))
SHELL_INIT = (
    "PS1=''; PS2=''; PS0=''; PROMPT_COMMAND=''; set +H +o history +m; unset HISTFILE; "
    f"exec {MARK_OUT_FD}>&1 {MARK_ERR_FD}>&2\n" + "__ows_status() { return \"$1\"; }\n" + OWDISPLAY_FUNCTION
    + COLOUR_INIT
)

ANSI_C_ESCAPES = {i: f"\\x{i:02x}" for i in range(256) if not 32 <= i < 127}
ANSI_C_ESCAPES.update({ord("\\"): "\\\\", ord("'"): "\\'", ord("\n"): "\\n", ord("\t"): "\\t"})


def ansi_c_quote(text: str) -> str:
    """`text` as a bash $'...' word that yields exactly its UTF-8 bytes."""
    return "$'" + text.encode("utf-8", "surrogateescape").decode("latin-1").translate(ANSI_C_ESCAPES) + "'"


# Every line the host writes starts with a space that bash may lose: a SIGINT that bash takes while
# it runs builtins stays pending until it reads its next line, and bash checks for it after reading
# each character (parse.y, shell_getc), so it throws away the first character of that line. Losing
# the `{` of an end marker line made it a syntax error, and the shell never said the command ended.
LEAD = " "
START_MARK = "go"  # the first field of the mark a command's line prints when bash starts to run it


def command_line(command: str, last_status: int, stdin: str = "/dev/null", token: str | None = None) -> str:
    """The line that runs `command` with `$?` as the previous command left it (the marker line after
    a command succeeds, so 0 needs nothing). A failed status is given back by a function on the left
    of `||`, where `set -e` does not act on it. `stdin` is a file, or `&FD` for the terminal.

    With `token`, the line first prints the start mark `go:TOKEN` on the shell's own stdout: bash
    has then read the whole line and runs it, so a SIGINT aborts the command. Before that moment a
    SIGINT would land while bash reads its input, where it throws away what it has read so far, or
    ends the shell (builtins only, hidden from `set -x`, `$_` kept as it was).
    """
    start = ""
    if token is not None:
        start = (f"{{ __ows_u=$_; printf '\\037\\036OWS:{START_MARK}:%s\\n' {token} >&{MARK_OUT_FD}; "
                 f": \"$__ows_u\"; }} 2>/dev/null; ")
    restore = "" if last_status == 0 else f"__ows_status {last_status} || "
    return f"{LEAD}{start}{restore}eval {ansi_c_quote(command)} <{stdin}\n"


def definitions_line(path: str, token: str) -> str:
    """The line that writes the shell's functions, aliases and PATH (sourceable bash) to `path` with
    `.token` after it, then a marker with `token`: the daemon renames the file onto `path` when the
    marker comes, so a Tab that reads `path` meanwhile reads the last whole file, never one being
    written. Builtins only, nothing on the command channels, `$?` 0 and `$_` as they were (as after
    an end marker), and nothing that can fail under `set -e`."""
    dump = "builtin declare -f; builtin alias -p; builtin declare -p PATH"
    marker = f"builtin printf '\\037\\036OWS:%s\\n' {token} >&{MARK_OUT_FD}; "
    target = ansi_c_quote(f"{path}.{token}")
    return f"{LEAD}{{ __ows_u=$_; {{ {dump}; }} >|{target} || :; {marker}: \"$__ows_u\"; }} 2>/dev/null\n"


def marker_lines(token: str, out_fd: int = MARK_OUT_FD, err_fd: int = MARK_ERR_FD, status: str = "$?") -> str:
    """The end markers, on the channels the command's output took: after all of it, in order (hidden
    from `set -x`: a trace of them would be the runner's chatter in the command's stderr). They
    report `$?`, or the `status` given."""
    return (
        f"{LEAD}{{ __ows_s={status}; printf '\\037\\036OWS:%s:%s:%s\\n' {token} \"$__ows_s\" \"$PWD\" >&{out_fd}; "
        f"printf '\\037\\036OWS:%s\\n' {token} >&{err_fd}; }} 2>/dev/null\n"
    )


# Where a command's output goes: the terminal's descriptors in the shell, or the pipes (saved at start).
TTY_OUT_FD = 61
TTY_ERR_FD = 60


def channel_fds(terminal: bool) -> tuple[int, int]:
    """The shell's descriptors of a channel's stdout and stderr: the terminals, or the pipes."""
    return (TTY_OUT_FD, TTY_ERR_FD) if terminal else (MARK_OUT_FD, MARK_ERR_FD)


def output_mode_line(terminal: bool, merge: bool) -> str:
    """Points the shell's stdout and stderr, for this command and the ones after, at a channel."""
    out, err = channel_fds(terminal)
    return f"{LEAD}exec 1>&{out} 2>&{out if merge else err}\n"
