"""The runner protocol's errors: one code per way a call can fail, and one class per code.

Both ends raise and catch these. The box raises `RunnerError(code, ...)` or a class of its own code;
the host turns each error answer back into the class of its code (`from_error`), so a caller can
`except ShellBusy:` instead of comparing numbers, and the kernel names a cell's error by the class.
Codes below zero are JSON-RPC's own; the runner's are small positive numbers.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["PARSE_ERROR", "INVALID_REQUEST", "METHOD_NOT_FOUND", "INVALID_PARAMS", "INTERNAL_ERROR", "SHELL_BUSY",
           "UNKNOWN_SHELL", "UNKNOWN_TASK", "FS_ERROR", "VERSION_MISMATCH", "RUNNER_RESTARTED",
           "RUNNER_UNREACHABLE", "SHELL_EXITED", "RunnerError", "ParseError", "InvalidRequest", "MethodNotFound",
           "InvalidParams", "InternalError", "ShellBusy", "UnknownShell", "UnknownTask", "FsError",
           "VersionMismatch", "RunnerRestarted", "RunnerUnreachable", "ShellExited", "from_error"]

# JSON-RPC's own codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# The runner's codes.
SHELL_BUSY = 1
UNKNOWN_SHELL = 2
UNKNOWN_TASK = 3
FS_ERROR = 4
VERSION_MISMATCH = 5
RUNNER_RESTARTED = 6  # raised by the client only
RUNNER_UNREACHABLE = 7  # raised by the client only: no daemon answered within the reconnect window
SHELL_EXITED = 8  # the shell ended (exit, set -e) between being found and being asked to run


class RunnerError(Exception):
    """An error answer of the protocol, raised where a call was made. `RunnerError(code, message)`
    gives the class of that code (`RunnerError(SHELL_BUSY, ...)` is a `ShellBusy`), so the box and
    the host may spell either."""

    code: int
    #: The name a cell's error gets for this code (the kernel shows it as the error's `ename`).
    cell_name: ClassVar[str] = "SandboxError"
    _by_code: ClassVar[dict[int, type[RunnerError]]] = {}

    def __new__(cls, code: int, message: str, data: Any = None) -> RunnerError:
        target = cls if cls is not RunnerError else RunnerError._by_code.get(code, RunnerError)
        return super().__new__(target)

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def __init_subclass__(cls, code: int | None = None, cell_name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            RunnerError._by_code[code] = cls
            cls.code = code
        if cell_name is not None:
            cls.cell_name = cell_name

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            body["data"] = self.data
        return body

    def __reduce__(self) -> tuple[Any, ...]:
        return (RunnerError, (self.code, self.message, self.data))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}, {self.message!r})"


class ParseError(RunnerError, code=PARSE_ERROR):
    """The frame was not JSON."""


class InvalidRequest(RunnerError, code=INVALID_REQUEST):
    """The frame was JSON but not a request (or too large to be one)."""


class MethodNotFound(RunnerError, code=METHOD_NOT_FOUND):
    """The box knows no such method."""


class InvalidParams(RunnerError, code=INVALID_PARAMS, cell_name="UsageError"):
    """A param was missing, of the wrong type or out of range; the message names it."""


class InternalError(RunnerError, code=INTERNAL_ERROR):
    """The box failed while doing what was asked."""


class ShellBusy(RunnerError, code=SHELL_BUSY, cell_name="ShellBusy"):
    """The shell is running another command."""


class UnknownShell(RunnerError, code=UNKNOWN_SHELL, cell_name="UnknownShell"):
    """No shell has that name."""


class UnknownTask(RunnerError, code=UNKNOWN_TASK):
    """No task has that id."""


class FsError(RunnerError, code=FS_ERROR, cell_name="FileError"):
    """A file operation failed (the message names the path and the reason)."""


class VersionMismatch(RunnerError, code=VERSION_MISMATCH):
    """The box speaks another protocol version than the host."""


class RunnerRestarted(RunnerError, code=RUNNER_RESTARTED, cell_name="SandboxRestarted"):
    """Raised by the host only: the box restarted, so what was in flight may or may not have run."""


class RunnerUnreachable(RunnerError, code=RUNNER_UNREACHABLE, cell_name="SandboxUnreachable"):
    """Raised by the host only: no daemon answered within the reconnect window."""


class ShellExited(RunnerError, code=SHELL_EXITED, cell_name="ShellExited"):
    """The shell ended between being found and being asked to run."""


def from_error(body: dict[str, Any]) -> RunnerError:
    """The error of an answer's `error` member, as the class of its code (a bare `RunnerError` for a
    code this side does not know)."""
    code = body.get("code", INTERNAL_ERROR)
    return RunnerError(code if isinstance(code, int) else INTERNAL_ERROR, str(body.get("message", "error")),
                       body.get("data"))
