"""Every error the execd channel raises, in one place so that callers can catch by meaning.

They all derive from `ExecdError`, a `RuntimeError`: the kernel can catch that one class around any
channel call. The tree follows what the caller can do about it:

* `ExecdHTTPError` and its kinds: execd refused a request (wrong token, unknown session, someone
  else attached). `ExecdUnreachable`: nothing answered at all.
* `JsonLineError` and its kinds: the byte stream itself is unusable (bytes lost from the replay
  window, a line that is not a JSON object, a line too long to hold). These are never transient.
* `ChannelDetached` and its kinds: the channel is no longer connected to the program; the cause
  says why (the program exited, another client took it over, the connection dropped).
"""

from __future__ import annotations


class ExecdError(RuntimeError):
    """Base of every error raised by `owsandbox.channel`."""


class ExecdUnreachable(ExecdError):
    """No HTTP or WebSocket connection to execd could be made (refused, timed out, bad address)."""


class ExecdHTTPError(ExecdError):
    """execd answered a request with a status the caller did not expect."""

    def __init__(self, method: str, path: str, status: int, body: bytes | bytearray | str, hint: str = "") -> None:
        self.method = method
        self.path = path
        self.status = status
        self.body = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else body
        shown = self.body.strip()
        if len(shown) > 500:
            shown = shown[:500] + "…"
        message = f"execd answered {method} {path} with HTTP {status}"
        if hint:
            message += f" ({hint})"
        message += f": {shown}" if shown else " and an empty body"
        super().__init__(message)


class ExecdUnauthorized(ExecdHTTPError):
    """401: the access token (header X-EXECD-ACCESS-TOKEN) is missing or wrong."""


class ExecdNotFound(ExecdHTTPError):
    """404: execd does not know this session (never created, deleted, or execd restarted)."""


class ExecdAlreadyConnected(ExecdHTTPError):
    """409: another client holds the session and the connection did not ask to take it over."""


class ExecdUnsupported(ExecdHTTPError, NotImplementedError):
    """404/405 on an API this execd does not offer (for example GET /pty, an owsandbox extension)."""


class JsonLineError(ExecdError):
    """The stream of frames cannot be turned into records; base of the decoder's errors."""


class BadFrame(JsonLineError):
    """A binary frame that execd never sends to a client (empty, unknown kind, short REPLAY header)."""


class ReplayGap(JsonLineError):
    """The replay starts after the requested offset: output was lost from execd's ring buffer."""

    def __init__(self, requested: int, available: int) -> None:
        self.requested = requested
        self.available = available
        super().__init__(
            f"execd no longer holds the output asked for: requested={requested} available={available} "
            f"({available - requested} bytes were dropped from its replay buffer; records in them are lost)"
        )


class BadRecord(JsonLineError):
    """A live stdout line that is not JSON, or JSON that is not an object."""

    def __init__(self, message: str, *, start: int, end: int, line: bytes) -> None:
        self.start = start
        self.end = end
        self.line = line
        preview = line[:200].decode("utf-8", "replace") + ("…" if len(line) > 200 else "")
        super().__init__(f"{message} at offset {end} (the line spans bytes {start}..{end}): {preview!r}")


class LineTooLong(JsonLineError):
    """A line grew past the decoder's limit before its LF arrived."""

    def __init__(self, start: int, limit: int) -> None:
        self.start = start
        self.limit = limit
        super().__init__(f"a stdout line starting at offset {start} is longer than {limit} bytes; "
                         "it was not kept (the program must write one JSON object per line)")


class ChannelDetached(ExecdError):
    """The channel is not (or no longer) connected to the program."""


class ChannelTakenOver(ChannelDetached):
    """Another client attached to the session with takeover (execd closed this one with 4001 TAKEN_OVER)."""


class ProgramExited(ChannelDetached):
    """The program behind the channel exited; `stderr_tail` holds the last of what it wrote to stderr."""

    def __init__(self, label: str, exit_code: int, stderr_tail: str) -> None:
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        how = " (killed by a signal)" if exit_code == -1 else ""
        tail = stderr_tail.rstrip()
        told = f"; its stderr ended with: {tail}" if tail else "; it wrote nothing to stderr"
        super().__init__(f"{label} exited with code {exit_code}{how}{told}")


class ExecdServerError(ChannelDetached):
    """execd sent an error control frame (SESSION_GONE, START_FAILED, STDIN_WRITE_FAILED, ...)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"execd reported {code}: {message}")
