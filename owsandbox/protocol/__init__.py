"""The runner protocol (version 1), the one thing both ends hold: the box (`owsandbox.box`) and the
host (`owsandbox.host`, and the kernel through it). Standard library only; it is packed into the box's
zipapp with the box.

* `framing`: one JSON-RPC 2.0 object per ASCII line, the builders, a bounded line splitter;
* `methods`: the method and notification names (the only place they are spelled);
* `messages`: the shapes of params, results and live frames, which shape goes with which method, the
  stream and outcome names;
* `shapes`: `parse(Shape, raw)`, how each end checks what the other sent against its shape;
* `paths`: `inside(path, folder)`, the one test of a path against a folder;
* `errors`: the codes and one error class per code.

What most callers need is here by name (`from owsandbox import protocol as P`; `P.encode`,
`P.SHELL_BUSY`, `P.RunnerError`).
"""

from __future__ import annotations

from . import methods
from .errors import *  # noqa: F403 - the codes and their classes
from .errors import RunnerError, from_error
from .framing import (
    DEFAULT_MAX_FRAME_BYTES,
    LineSplitter,
    Oversize,
    decode,
    encode,
    error,
    notification,
    request,
    result,
    sniff_id,
)
from .messages import (
    OUTCOME_EXIT,
    OUTCOME_INTERRUPT,
    OUTCOME_SHELL_EXITED,
    OUTCOME_TIMEOUT,
    RESTARTED_MESSAGE,
)

PROTOCOL_VERSION = 1

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "LineSplitter", "OUTCOME_EXIT", "OUTCOME_INTERRUPT", "OUTCOME_SHELL_EXITED",
           "OUTCOME_TIMEOUT", "Oversize", "PROTOCOL_VERSION", "RESTARTED_MESSAGE", "RunnerError", "decode", "encode",
           "error", "from_error", "methods", "notification", "request", "result", "sniff_id"]
