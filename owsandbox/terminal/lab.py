"""The sandbox terminal in JupyterLab: a terminal named for a kernel runs `owsandbox shell --existing` for it.

JupyterLab's terminals are jupyter_server_terminals' (terminado): a named terminal is made by `POST
/api/terminals {"name": ...}` and shown by xterm.js, a real terminal in which vim, less, top and
`git add -p` work. This terminal manager starts the terminal named `sandbox_ID` (launch.py) as
`owsandbox shell --existing` with the connection file of the server's running kernel ID, so JupyterLab
needs no extension of its own: its `terminal:open` command with that name opens it (the button that
`%terminal open` shows; the Running panel lists it afterwards). Every other terminal is the server's
usual shell. A `sandbox_` name for no running kernel is refused (404), never a plain shell.

It is switched on by one server setting (a class, so not merged from `jupyter_server_config.d`, which
holds only the extensions to enable): `jupyter lab
--TerminalsExtensionApp.terminal_manager_class=owsandbox.terminal.lab.SandboxTerminalManager`, or the same
in a `jupyter_server_config.py` or `.json` (docs/how-to/jupyterlab.md). The kernels the server starts then inherit
`OWSANDBOX_LAB_TERMINALS`, which is how `%terminal open` knows that its button works here.
"""

from __future__ import annotations

import os
from typing import Any

from jupyter_server_terminals.terminalmanager import TerminalManager
from tornado import web

from .launch import LAB_TERMINAL_PREFIX, LAB_TERMINALS_ENV, kernel_of_lab_terminal, shell_argv


class SandboxTerminalManager(TerminalManager):
    """jupyter_server_terminals' manager, with `sandbox_ID` terminals in kernel ID's sandbox."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        os.environ[LAB_TERMINALS_ENV] = "1"  # for the kernels started from now on (see the module's docstring)

    def new_terminal(self, **kwargs: Any) -> Any:
        name = kwargs.get("name")
        if not isinstance(name, str) or not name.startswith(LAB_TERMINAL_PREFIX):
            return super().new_terminal(**kwargs)
        kernel_id = kernel_of_lab_terminal(name)
        if kernel_id is None:
            raise web.HTTPError(400, f"a terminal named {LAB_TERMINAL_PREFIX}… opens in a kernel's sandbox and is "
                                     f"named {LAB_TERMINAL_PREFIX}KERNEL_ID (dashes as underscores), not {name}")
        kwargs["shell_command"] = shell_argv(self._connection_file(kernel_id))
        kwargs.pop("cwd", None)  # the terminal starts where the sandbox's commands start
        return super().new_terminal(**kwargs)

    def _connection_file(self, kernel_id: str) -> str:
        kernels = getattr(self.parent, "kernel_manager", None)
        try:
            connection_file = kernels.get_kernel(kernel_id).connection_file  # type: ignore[union-attr]
        except (AttributeError, KeyError):
            raise web.HTTPError(404, f"no running kernel {kernel_id} in this server: a sandbox terminal opens in "
                                     "the sandbox of a running owsandbox kernel") from None
        if not connection_file:
            raise web.HTTPError(404, f"kernel {kernel_id} has no connection file to find its sandbox by")
        return str(connection_file)
