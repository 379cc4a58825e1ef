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

__all__ = [
    "REPLAY", "STDERR", "STDIN", "STDOUT",
    "BadFrame", "BadRecord", "ChannelDetached", "ChannelTakenOver", "ExecdAlreadyConnected", "ExecdControl",
    "ExecdEndpoint", "ExecdError", "ExecdHTTPError", "ExecdJsonLineChannel", "ExecdNotFound", "ExecdServerError",
    "ExecdUnauthorized", "ExecdUnreachable", "ExecdUnsupported", "JsonLineDecoder", "JsonLineError", "LineTooLong",
    "ProgramExited", "Record", "ReplayGap", "StderrText",
]
