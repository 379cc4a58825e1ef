"""What a Debian login shell does for colour: LS_COLORS from `dircolors`, and `ls` and `grep` with `--color=auto`.

Debian puts this in each user's ~/.bashrc (from /etc/skel), not in a system file, and a box's home is
empty: without it neither the kernel's shells nor a terminal into the box colour `ls` as a user's own
terminal does. `--color=auto` colours only on a terminal, so `%terminal off` still gets the exact bytes,
and a box without dircolors (busybox, say) is left as it is. Shared by the kernel's shells (bash.py)
and by `owsandbox shell` (owsandbox/terminal/boxshell.py). Standard library only: copied into the box.
"""

from __future__ import annotations

COLOUR_INIT = r"""if builtin command -v dircolors >/dev/null 2>&1; then
  if [ -r ~/.dircolors ]; then eval "$(dircolors -b ~/.dircolors)"; else eval "$(dircolors -b)"; fi
  alias ls='ls --color=auto' grep='grep --color=auto'
fi
"""
