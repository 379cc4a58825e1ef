"""A cell's `shell.run`: the one place the kernel packs a cell's code, and how it is to run, for the box.

Every command the kernel runs for a cell (the cell itself, `%%check`'s quiet tests) starts here, as a
`RunParams`: what `do_execute` was given is followed from the cell to the wire through this function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...protocol import messages as M

if TYPE_CHECKING:
    from ..magics.shells import TerminalSettings


def cell_run(shell: str, code: str, cwd: str, *, output_limit: int, timeout_s: float | None,
             terminal: TerminalSettings | None, stdin: bool) -> M.RunParams:
    """`code` on `shell`; `cwd` is where a shell starts that has run nothing yet (the client sends the
    folder of one that has, which its session keeps). `terminal`: the shell's settings
    (`%terminal`, `%stderr`), or None for pipes with stderr apart (output read by the kernel, not shown);
    `stdin`: whether the cell's client answers prompts."""
    params = M.RunParams(shell=shell, command=code, cwd=cwd, output_limit=output_limit, stdin=stdin)
    if terminal is None:
        params.update(terminal=False, stderr="apart")
    else:
        params.update(terminal=terminal.terminal, cols=terminal.cols, rows=terminal.rows,
                      stderr="merge" if terminal.stderr == "merge" else "apart")
    if timeout_s is not None:
        params["timeout_s"] = timeout_s
    return params
