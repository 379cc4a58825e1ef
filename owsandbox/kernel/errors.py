"""The errors a cell ends with. Each becomes the cell's one `error` output: its name (`ename`) and its
message (`evalue`), so a notebook run stops there and says why.

They live apart from `kernel.py` so that the magics (`magics/`) and the
`%attach` machinery raise them without importing the kernel, which imports them.
"""

from __future__ import annotations


class UsageError(Exception):
    """A magic used the wrong way; the message is shown as the cell's error."""


class CellError(Exception):
    """The cell failed in a way of its own name (ExitStatus, TimedOut, ShellExited, ...)."""

    def __init__(self, ename: str, evalue: str) -> None:
        super().__init__(evalue)
        self.ename = ename
        self.evalue = evalue


class AttachError(CellError):
    """A clear reason why an %attach operation could not be done; a UsageError unless a subclass
    names it otherwise."""

    ename = "UsageError"

    def __init__(self, message: str) -> None:
        super().__init__(type(self).ename, message)


class AttachedProgramExited(AttachError):
    """The program exited while %attach started it, or had ended before %attach --session/--last."""

    ename = "AttachedProgramExited"


class AttachFailed(AttachError):
    """The channel to a program failed at once (a line that is not JSON, execd's error), not by an exit."""

    ename = "AttachFailed"
