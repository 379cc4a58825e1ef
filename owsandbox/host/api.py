"""The runner protocol as calls by name: what a kernel or a tool asks of a sandbox.

Everything on this side that talks to a box goes through here (the client underneath matches answers
to calls, resumes and reconnects); the method names are the protocol's, and besides the client's own
session calls and the executor, this is the only host module that names them. Results are the
protocol's typed shapes (`protocol.messages`). A `SandboxAPI` is cheap: it is made over whatever
does the calling, a `RunnerClient` (`over`) or a caller that adjusts params first (the kernel's
magics drop a shell that has not run a cell yet).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..protocol import messages as M
from ..protocol.methods import (
    BOX_USAGE,
    FS_LIST,
    FS_READ,
    FS_SEARCH,
    FS_STAT,
    FS_WRITE,
    SHELL_CLOSE,
    SHELL_COMPLETE,
    SHELL_INPUT,
    SHELL_INPUT_WANTED,
    SHELL_INSPECT,
    SHELL_INTERRUPT,
    SHELL_LIST,
    SHELL_OUTPUT,
    SHELL_PROGRESS,
    SHELL_RUN,
)
from ..protocol.shapes import ShapeError, parse

if TYPE_CHECKING:
    from .client import Call, RunnerClient

log = logging.getLogger(__name__)

CallFn = Callable[..., Any]  # call(method, params, timeout=SECONDS) -> the result, or raises RunnerError
StartFn = Callable[..., "Call"]  # start(method, params, on_notification=...) -> the call in flight (a future)


class SandboxAPI:
    def __init__(self, call: CallFn, start: StartFn | None = None) -> None:
        self._call = call
        self._start = start

    def _starter(self) -> StartFn:
        if self._start is None:
            raise RuntimeError("this SandboxAPI only makes calls it waits for (made without a starter)")
        return self._start

    @classmethod
    def over(cls, client: RunnerClient) -> SandboxAPI:
        return cls(client.call, client.start_call)

    # -- shells ---------------------------------------------------------------------------------

    def start_run(self, params: M.RunParams, on_output: Callable[[M.OutputFrame], None] | None = None,
                  on_progress: Callable[[M.ProgressFrame], None] | None = None,
                  on_input_wanted: Callable[[M.InputWanted], None] | None = None) -> Call:
        """`shell.run`, not waited for: each live frame to the handler of its kind, the result to the call
        (a future: `asyncio.wrap_future(call)` awaits it)."""
        handlers: dict[str, Callable[[Any], None] | None] = {
            SHELL_OUTPUT: on_output, SHELL_PROGRESS: on_progress, SHELL_INPUT_WANTED: on_input_wanted}
        routed = live_router(handlers) if any(handlers.values()) else None
        return self._starter()(SHELL_RUN, dict(params), on_notification=routed)

    def run(self, params: M.RunParams, timeout: float) -> M.RunResult:
        return self._call(SHELL_RUN, dict(params), timeout=timeout)

    def interrupt(self, shell: str, request_id: str | None = None) -> Call:
        """Stop the `shell.run` of `request_id` on `shell` (else the command running there), even one
        that has not started yet; not waited for: its `shell.run` says how it ended."""
        return self._starter()(SHELL_INTERRUPT, _interrupt_params(shell, request_id))

    def interrupt_and_wait(self, shell: str, timeout: float = 10.0) -> bool:
        """Stop the command running on `shell`; whether one was running."""
        return bool(self.stop(shell, timeout=timeout).get("interrupted"))

    def stop(self, shell: str, request_id: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
        """`interrupt`, waited for: `{shell, interrupted, state}`, where `state` says what happened
        ("running": being stopped; "not started": it will not run; "ended", "unknown", "idle")."""
        return self._call(SHELL_INTERRUPT, _interrupt_params(shell, request_id), timeout=timeout)

    def give_input(self, params: M.InputParams, timeout: float = 10.0) -> dict[str, Any]:
        """Type an answer (or end of input) into the command waiting on its terminal."""
        return self._call(SHELL_INPUT, dict(params), timeout=timeout)

    def shells(self, timeout: float = 10.0) -> list[M.ShellInfo]:
        return list(self._call(SHELL_LIST, {}, timeout=timeout)["shells"])

    def close_shell(self, shell: str, timeout: float = 10.0) -> dict[str, Any]:
        return self._call(SHELL_CLOSE, {"shell": shell}, timeout=timeout)

    def complete(self, params: dict[str, Any], timeout: float) -> list[str]:
        return list(self._call(SHELL_COMPLETE, params, timeout=timeout)["matches"])

    def inspect(self, shell: str, word: str, timeout: float) -> str:
        return str(self._call(SHELL_INSPECT, {"shell": shell, "word": word}, timeout=timeout)["text"])

    def usage(self, timeout: float = 10.0) -> M.Usage:
        """What the box uses now (`box.usage`): the box's own figures, to show, never to decide from."""
        return self._call(BOX_USAGE, {}, timeout=timeout)

    # -- files ----------------------------------------------------------------------------------

    def read(self, params: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        """`fs.read`: a page of lines (`ReadLinesResult`) or of bytes (`ReadBytesResult`, `offset_bytes`)."""
        return self._call(FS_READ, params, timeout=timeout)

    def write(self, params: dict[str, Any], timeout: float = 60.0) -> M.WriteResult:
        return self._call(FS_WRITE, params, timeout=timeout)

    def list(self, params: dict[str, Any], timeout: float = 60.0) -> M.ListResult:
        return self._call(FS_LIST, params, timeout=timeout)

    def stat(self, params: dict[str, Any], timeout: float = 60.0) -> M.StatResult:
        return self._call(FS_STAT, params, timeout=timeout)

    def search(self, params: dict[str, Any], timeout: float = 60.0) -> M.SearchResult:
        return self._call(FS_SEARCH, params, timeout=timeout)


def live_router(handlers: dict[str, Callable[[Any], None] | None]) -> Callable[[dict[str, Any]], None]:
    """The client's notification callback for one call: each live frame parsed as the shape of its kind
    (`messages.LIVE_SHAPES`) and given to that kind's handler. A frame that is not its shape is dropped
    and logged: live output is a view, and the result completes it."""

    def route(notification: dict[str, Any]) -> None:
        method = notification.get("method")
        handler = handlers.get(method) if isinstance(method, str) else None
        if handler is None:
            return
        body = {key: value for key, value in notification.items() if key != "method"}
        try:
            frame = parse(M.LIVE_SHAPES[method], body)
        except ShapeError as exc:
            log.warning("a %s frame dropped: %s", method, exc)
            return
        handler(frame)

    return route


def _interrupt_params(shell: str, request_id: str | None) -> dict[str, Any]:
    return {"shell": shell} if request_id is None else {"shell": shell, "id": request_id}
