"""`%terminal open`: how to get a real terminal on a new shell in this kernel's sandbox.

A notebook cannot run vim, less, top or `git add -p`; a terminal can. The kernel cannot open one
itself (it has no terminal of the user's to draw in), so it says exactly what opens one: the
`owsandbox shell --existing` command with this kernel's connection file, and, in a JupyterLab whose
server runs owsandbox's terminal manager, a button that opens it as a JupyterLab terminal. The button
is offered only there: elsewhere a terminal of that name would be a plain shell on this machine.
"""

from __future__ import annotations

import html
import json
import os
from typing import Any

from ...settings import Settings, settings_of
from ...terminal.launch import lab_terminal_name, shell_command_line
from ...terminal.locate import sandbox_key
from ..display.math_safe import no_math
from ..errors import CellError

# The providers that keep a keyed sandbox's state on this machine, where `owsandbox shell` finds it.
TERMINAL_PROVIDERS = ("bwrap", "local")


def terminal_open(connection_file: str | None, provider_name: str, settings: Settings | None = None) -> dict[str, Any]:
    """The output of `%terminal open` (text/plain and text/html); CellError naming why there is no terminal.
    `settings`: the kernel's (None: this process's environment now)."""
    if not connection_file:
        raise CellError("NoTerminal", "this kernel was started without a connection file, so no terminal can find "
                                      "its sandbox")
    if provider_name not in TERMINAL_PROVIDERS:
        raise CellError("NoTerminal", f"a terminal reaches a sandbox of the bwrap or local provider on this machine; "
                                      f"this kernel's is {provider_name}")
    connection_file = os.path.abspath(connection_file)
    command = shell_command_line(connection_file)
    text = ("A terminal on a new shell in this sandbox (the same files, /tmp, limits and network; this notebook's "
            f"shells are not touched). Run in a terminal of this machine:\n\n    {command}\n")
    page = (f"<p>{html.escape(text.split(chr(10))[0])}</p><pre>{html.escape(command)}</pre>")
    name = lab_terminal_name(sandbox_key(connection_file).removeprefix("kernel-"))
    if name is not None and settings_of(settings).lab_terminals:
        args = html.escape(json.dumps({"name": name}), quote=True)
        page += (f'<p><button data-commandlinker-command="terminal:open" data-commandlinker-args="{args}">'
                 "Open it as a JupyterLab terminal</button></p>")
    return {"text/plain": text, "text/html": no_math(page)}
