"""How a terminal into a kernel's sandbox is started, in one place for `%terminal open` and JupyterLab.

A person is shown the shortest command that starts the same owsandbox as the kernel's (`owsandbox` when
that is the one on PATH, else its full path); a server starts it by its own Python, which has owsandbox
since it loaded the terminal manager. In JupyterLab the terminal for kernel ID is the terminal named
`sandbox_ID` (dashes as underscores: the terminal WebSocket's route takes word characters only), which
owsandbox's terminal manager (`lab.py`) starts as `owsandbox shell --existing` for that kernel.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys

from .. import settings

#: Set in a Jupyter server's environment by owsandbox's terminal manager, so the kernels it starts know
#: that a terminal named `sandbox_ID` opens in their sandbox (and is not a plain shell on this machine).
LAB_TERMINALS_ENV = settings.LAB_TERMINALS
LAB_TERMINAL_PREFIX = "sandbox_"
_KERNEL_ID = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}")


def shell_argv(connection_file: str) -> list[str]:
    """The command that opens a terminal in the sandbox of the kernel with `connection_file`, run by this
    Python (no PATH needed)."""
    return [sys.executable, "-m", "owsandbox.terminal", "--existing", connection_file]


def shell_command_line(connection_file: str) -> str:
    """The same command as a person types it."""
    beside = os.path.join(os.path.dirname(sys.executable), "owsandbox")
    if not os.access(beside, os.X_OK):
        return shlex.join(shell_argv(connection_file))
    on_path = shutil.which("owsandbox")
    program = "owsandbox" if on_path and os.path.samefile(on_path, beside) else beside
    return shlex.join([program, "shell", "--existing", connection_file])


def lab_terminal_name(kernel_id: str) -> str | None:
    """The JupyterLab terminal that opens in kernel `kernel_id`'s sandbox; None for an id that is not a
    Jupyter server's (a uuid)."""
    return LAB_TERMINAL_PREFIX + kernel_id.replace("-", "_") if _KERNEL_ID.fullmatch(kernel_id) else None


def kernel_of_lab_terminal(name: str) -> str | None:
    """The kernel id a terminal named `sandbox_ID` is for; None for any other name."""
    if not name.startswith(LAB_TERMINAL_PREFIX):
        return None
    kernel_id = name[len(LAB_TERMINAL_PREFIX):].replace("_", "-")
    return kernel_id if _KERNEL_ID.fullmatch(kernel_id) else None
