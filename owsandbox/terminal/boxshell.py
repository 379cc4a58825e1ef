"""The command a terminal's PTY session runs in the box: an interactive bash, set up as a terminal's would be.

The endpoint starts `bash --norc --noprofile -c COMMAND` on a new terminal of the default size, with
the daemon's environment. So the command first gives the terminal the user's window size (`stty`,
before anything draws, rather than a resize that races the first prompt) and the user's TERM, then
becomes `bash -i` with an rc file of ours: what a Debian terminal reads (/etc/bash.bashrc, then
~/.bashrc, in the box: a bubblewrap box's home is its own and empty), the colours a Debian ~/.bashrc
adds (box/shell/colours.py, as the kernel's shells have them) and bash-completion where the box has
it. The rc comes through a process substitution, so nothing is written in the box.
"""

from __future__ import annotations

import re
import shlex

from ..box.shell.colours import COLOUR_INIT

_TERM = re.compile(r"[A-Za-z0-9.+_-]{1,64}")  # a terminfo name; anything else is not passed on

RC = r"""if [ -r /etc/bash.bashrc ]; then . /etc/bash.bashrc; fi
if [ -r ~/.bashrc ]; then . ~/.bashrc; fi
""" + COLOUR_INIT + r"""if ! shopt -oq posix && [ -z "${BASH_COMPLETION_VERSINFO-}" ]; then
  for __ows_bc in /usr/share/bash-completion/bash_completion /etc/bash_completion; do
    if [ -r "$__ows_bc" ]; then . "$__ows_bc"; break; fi
  done
  unset __ows_bc
fi
if [ -z "${PS1-}" ] || [ "$PS1" = '\s-\v\$ ' ]; then PS1='\u@\h:\w\$ '; fi
"""


def shell_command(term: str | None, cols: int, rows: int, colorterm: str | None = None) -> str:
    """The session's command for a window of `cols` x `rows` and the user's TERM (and COLORTERM)."""
    env = [f"TERM={term if term and _TERM.fullmatch(term) else 'xterm-256color'}"]
    if colorterm and _TERM.fullmatch(colorterm):
        env.append(f"COLORTERM={colorterm}")
    return (f"stty cols {int(cols)} rows {int(rows)} 2>/dev/null; "
            f"exec env {' '.join(env)} bash --rcfile <(printf '%s' {shlex.quote(RC)}) -i")


_SHELL_COMMAND = re.compile(r"stty cols \d+ rows \d+ 2>/dev/null; exec env (?:[A-Z]+=\S+ )+bash --rcfile <\(printf ")
#: How `%attach --list` names a terminal's session instead of its kilobyte of set-up.
TERMINAL_LABEL = "bash -i (a terminal: owsandbox shell or JupyterLab's)"


def terminal_label(command: str) -> str | None:
    """TERMINAL_LABEL for a command `shell_command` made, else None. The box lists the commands of its
    sessions, so a program could take the label by starting with the same text: it names, never decides."""
    return TERMINAL_LABEL if _SHELL_COMMAND.match(command) else None
