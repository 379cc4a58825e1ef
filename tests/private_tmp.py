"""A /tmp of a test's own, for a sandbox opened on /tmp itself.

A sandbox whose workspace is /tmp checks, at each cell's end and at its own, every repository there for git
settings it could have written since it started (the host's git quarantine), and moves them aside. On
this machine's /tmp those are the repositories of the tests running beside it, which are not its to
change: one such test saw the `core.hooksPath` it had just set moved away before its own sandbox started.
So, as root, such a sandbox's host side runs in a mount namespace of its own, whose /tmp is new and empty
but for the folders it needs. As a plain user (who cannot make one) the command is left as it is.
"""

from __future__ import annotations

import os
from pathlib import Path


def private_tmp(*needed: Path) -> tuple[str, ...]:
    """The words to put before a command so that it runs with a /tmp of its own, holding only what it
    needs of this machine's /tmp: the top folder there of each of `needed` (a socket, this project's
    clone and its virtual environment when they are in /tmp), bound in; () when not root."""
    if os.getuid() != 0:
        return ()
    tmp = Path("/tmp")
    kept = sorted({tmp / path.relative_to(tmp).parts[0] for path in needed
                   if path.is_relative_to(tmp) and path != tmp})
    # `cd /tmp` first: the shell's folder stays this machine's /tmp under the new one, so `./NAME`, not
    # made absolute (mount -c), is the folder of this machine. Then back to the folder the command was
    # started in, as seen now (/tmp itself is the new one).
    binds = "".join(f" && mkdir /tmp/{path.name} && mount -c --bind ./{path.name} /tmp/{path.name}" for path in kept)
    script = (f"here=\"$PWD\"; cd /tmp && mount -t tmpfs -o mode=1777 owsbx-tmp /tmp{binds} && cd \"$here\" && "
              "exec \"$@\"")
    return ("unshare", "--mount", "--propagation", "private", "--", "sh", "-ec", script, "private-tmp")
