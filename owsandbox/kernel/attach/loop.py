"""Where `%attach`'s channels live: an asyncio loop on a thread of its own, so that records keep
coming while other cells run, and the execd endpoints those channels reach.

The magics run on worker threads; they hand the loop a coroutine (`AttachLoop.run`) and wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import settings
from ..errors import AttachError, AttachFailed

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ...channel import ExecdEndpoint


class _Channel:
    """`owsandbox.channel`, imported on first use: it brings in websockets, which the kernel need not
    load before anybody attaches."""

    def __getattr__(self, name: str) -> Any:
        from ... import channel
        from ...channel import endpoint

        return getattr(channel, name, None) or getattr(endpoint, name)


ch = _Channel()


class AttachLoop:
    """One event loop thread, started by the first use and stopped by `stop`."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._loop is not None

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="attach-loop", daemon=True).start()
                self._loop = loop
            return self._loop

    def run(self, coro: Any, timeout: float | None = 60) -> Any:
        """Run `coro` on the loop and wait for its result (from any other thread)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop())
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise AttachError(f"no answer within {timeout:g} s") from None

    def submit(self, coro: Any) -> None:
        """Run `coro` on the loop without waiting for it (from any thread): Stop must return at once."""
        asyncio.run_coroutine_threadsafe(coro, self.loop())

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> None:
        self.loop().call_later(delay, callback, *args)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """`callback` on the loop's thread, if the loop has started (nothing runs on it otherwise)."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(callback, *args)

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


def endpoint_for(url: str | None, headers: dict[str, str], box_endpoint: Callable[[], ExecdEndpoint],
                 given: settings.Settings | None = None) -> ExecdEndpoint:
    """The execd a program runs in: `url` (with OWSANDBOX_EXECD_TOKEN as its token unless `headers`
    have one), else OWSANDBOX_EXECD_URL's, else the sandbox's own (`box_endpoint`). `given`: the kernel's
    settings (None: this process's environment now)."""
    given = settings.settings_of(given)
    if url:
        merged = dict(headers)
        token = given.execd_token
        if token and not any(k.lower() == ch.TOKEN_HEADER.lower() for k in merged):
            merged[ch.TOKEN_HEADER] = token
        if url.startswith("unix:"):
            return ch.ExecdEndpoint(unix_socket=url[5:], headers=merged)
        return ch.ExecdEndpoint(origin=url, headers=merged)
    if given.execd_url:
        return ch.ExecdEndpoint.from_env(given)
    return box_endpoint()


def session_status(endpoint: ExecdEndpoint, session_id: str) -> dict[str, Any] | None:
    """execd's `GET /pty/{id}` for the session; None when execd does not know it (the connection then
    says so). Any other failure is an AttachFailed: not knowing whether the program still runs, a
    reattach could start it again on a released execd, so it is not tried."""
    try:
        return ch.ExecdControl(endpoint).status(session_id)
    except ch.ExecdNotFound:
        return None
    except (ch.ExecdError, OSError) as exc:
        log.debug("status of session %s unknown: %s", session_id, exc)
        raise AttachFailed(f"could not ask execd whether session {session_id[:8]} still runs ({exc}); not "
                           "attaching, as a released execd would start an ended program again") from None


def has_ended(status: dict[str, Any] | None) -> bool:
    """Whether the status says the session's program is not running (False when unknown)."""
    return status is not None and status.get("running") is False


def restarts_when_ended(status: dict[str, Any]) -> bool:
    """Whether a connection to this ended session would start a new bash in it, as every released
    execd does (controller/pty_ws.go: `if !session.IsRunning()` starts it; IsRunning is `pid != 0`,
    reset when the process is reaped, runtime/pty_session.go, docker/execd v1.0.10 to v1.0.18).
    The box's own endpoint answers its status with `exit_code` and sends an ended session's `exit`
    to a new connection instead; without that field, the safe guess is a release."""
    return "exit_code" not in status
