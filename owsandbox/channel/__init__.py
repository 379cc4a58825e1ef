"""The client side of execd's PTY WebSocket API: a JSON-lines channel to a program in a sandbox.

`ExecdEndpoint` says where execd is; `ExecdControl` creates, inspects and deletes sessions over
HTTP; `execdws` is execd's WebSocket itself (frame kinds and their codec, control messages,
connecting and closing, for asyncio and for threads: the runner's pipe transport uses it too);
`JsonLineDecoder` (sans-I/O) turns execd's frames into records with resume offsets; and
`ExecdJsonLineChannel` runs a conversation over the WebSocket on an asyncio loop. Nothing here is
specific to one vendor: the same code talks to OpenSandbox's execd and to the runner box's own
execd-compatible endpoint.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .channel import ExecdJsonLineChannel
    from .control import ExecdControl
    from .endpoint import ExecdEndpoint
    from .errors import (
        BadFrame,
        BadRecord,
        ChannelDetached,
        ChannelTakenOver,
        ExecdAlreadyConnected,
        ExecdError,
        ExecdHTTPError,
        ExecdNotFound,
        ExecdServerError,
        ExecdUnauthorized,
        ExecdUnreachable,
        ExecdUnsupported,
        JsonLineError,
        LineTooLong,
        ProgramExited,
        ReplayGap,
    )
    from .execdws import REPLAY, STDERR, STDIN, STDOUT
    from .jsonlines import JsonLineDecoder, Record, StderrText

# Each name is imported from its module when first asked for: a kernel that only needs `ExecdEndpoint` at
# its start (terminal/locate.py) does not pay for the WebSocket channel and its dependencies then.
_FROM = {
    "ExecdJsonLineChannel": "channel", "ExecdControl": "control", "ExecdEndpoint": "endpoint",
    **dict.fromkeys(("BadFrame", "BadRecord", "ChannelDetached", "ChannelTakenOver", "ExecdAlreadyConnected",
                     "ExecdError", "ExecdHTTPError", "ExecdNotFound", "ExecdServerError", "ExecdUnauthorized",
                     "ExecdUnreachable", "ExecdUnsupported", "JsonLineError", "LineTooLong", "ProgramExited",
                     "ReplayGap"), "errors"),
    **dict.fromkeys(("REPLAY", "STDERR", "STDIN", "STDOUT"), "execdws"),
    **dict.fromkeys(("JsonLineDecoder", "Record", "StderrText"), "jsonlines"),
}

__all__ = [
    "REPLAY", "STDERR", "STDIN", "STDOUT",
    "BadFrame", "BadRecord", "ChannelDetached", "ChannelTakenOver", "ExecdAlreadyConnected", "ExecdControl",
    "ExecdEndpoint", "ExecdError", "ExecdHTTPError", "ExecdJsonLineChannel", "ExecdNotFound", "ExecdServerError",
    "ExecdUnauthorized", "ExecdUnreachable", "ExecdUnsupported", "JsonLineDecoder", "JsonLineError", "LineTooLong",
    "ProgramExited", "Record", "ReplayGap", "StderrText",
]


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # asked once
    return value
