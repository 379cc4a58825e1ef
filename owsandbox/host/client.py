"""The host side of the runner protocol: calls that survive a cut pipe.

One pump thread owns the connection: it reads frames, hands answers to waiting calls and live
notifications to their call's callback, and when the pipe ends it reconnects (with backoff) and
says hello. The same daemon (same `instance_id`) means nothing was lost: `session.resume` replays
the answers kept since the last one seen, and unanswered requests are sent again under their old
ids, which the daemon runs at most once. A new daemon means the sandbox restarted: every call that
was in flight fails with RUNNER_RESTARTED ("the outcome of this command is unknown") and is never
sent again; shells come back in their last known folder.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

from .. import protocol as P
from ..protocol import messages as M
from ..protocol.methods import HELLO, PING, SESSION_ACK, SESSION_RESUME, SHELL_CLOSE, SHELL_RUN
from ..protocol.shapes import ShapeError, parse
from .session import Session

log = logging.getLogger(__name__)

Notification = Callable[[dict[str, Any]], None]


def checked_answer(method: str, result: Any) -> Any:
    """The result of `method` as its shape (`messages.result_shape`: `RESULT_SHAPES`, or the variant the
    answer is); RunnerError naming the method, the shape and the field when the box answered something
    else (the host trusts nothing the box writes, its answers included). Every answer a call gets comes
    through here (`RunnerClient._dispatch`, and hello's in `_greet`)."""
    shape = M.result_shape(method, result)
    if shape is None:
        return result
    try:
        return parse(shape, result)
    except ShapeError as exc:
        raise P.RunnerError(P.INTERNAL_ERROR, f"the sandbox's answer to {method} is not the protocol's "
                                              f"{shape.__name__}: {exc}") from None


class Transport(Protocol):
    """A pipe to the daemon (transport.PipeTransport, wstransport.ExecdPipeTransport)."""

    def send(self, data: bytes) -> None: ...
    def read(self, timeout: float | None = None) -> bytes: ...  # b"" once it ended; TimeoutError past `timeout`
    def close(self) -> None: ...
    def kill(self) -> None: ...
    def stderr_tail(self) -> str: ...


class Call(Future):
    """One request in flight, as `start_call` hands it out: a `concurrent.futures.Future` of its
    result, which fails with the `RunnerError` the daemon answered (`result()` raises it). A thread
    blocks on `result()`, a coroutine awaits `asyncio.wrap_future(call)`, and `add_done_callback` runs
    once it is settled. The client alone settles it, from its reader thread, or with
    `RunnerRestarted`/`RunnerUnreachable` when the sandbox restarted or went away; a caller only reads
    it. It cannot be cancelled: the request may already run in the box, and only `shell.interrupt`
    stops it (so `cancel()` says False, and an awaiting coroutine that is cancelled leaves it alone)."""

    def __init__(self, request_id: str, method: str, frame: bytes, on_notification: Notification | None) -> None:
        super().__init__()
        self.request_id = request_id
        self.method = method
        self.frame = frame
        self.on_notification = on_notification
        self.sent_to: str | None = None  # the instance it was sent to, once sent

    def settle(self, value: Any = None, error: P.RunnerError | None = None) -> None:
        """Its answer, once: a later one (a replay, a restart after the answer) changes nothing."""
        try:
            if error is not None:
                self.set_exception(error)
            else:
                self.set_result(value)
        except InvalidStateError:
            pass

    def cancel(self) -> bool:
        return False

    @property
    def error(self) -> BaseException | None:
        """The error it failed with, without waiting: None while unanswered or once answered with a result."""
        return self.exception(0) if self.done() else None


class RunnerClient:
    def __init__(self, open_transport: Callable[[], Transport], ping_seconds: float = 5.0,
                 reconnect_timeout: float = 30.0, hello_timeout: float = 15.0, ack_delay: float = 0.05) -> None:
        self._open_transport = open_transport
        self.ping_seconds = ping_seconds
        self.reconnect_timeout = reconnect_timeout
        self.hello_timeout = hello_timeout
        self.ack_delay = ack_delay
        self._prefix = uuid.uuid4().hex[:12]
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._session = Session()
        self._transport: Transport | None = None
        self._ready = False  # the current transport has said hello and resumed
        self._closed = False
        self._tick = threading.Condition(self._lock)
        self._pump: threading.Thread | None = None
        self._ticker: threading.Thread | None = None
        self.hello: dict[str, Any] = {}
        self.reconnects = 0
        self.max_frame_bytes = P.DEFAULT_MAX_FRAME_BYTES
        self.last_error: str | None = None
        self.on_restart: Callable[[dict[str, Any]], None] | None = None
        self._reconnecting = False

    # -- connecting -------------------------------------------------------------------------

    def connect(self) -> dict[str, Any]:
        """Open the first pipe and say hello; raises RunnerError if no daemon answers."""
        transport, hello, splitter = self._open_and_greet(deadline=time.monotonic() + self.reconnect_timeout)
        with self._lock:
            frames = self._adopt(transport, hello, splitter, first=True)
        self._go(transport, frames)
        self._ticker = threading.Thread(target=self._tick_loop, name="runner-ticker", daemon=True)
        self._ticker.start()
        return hello

    def _open_and_greet(self, deadline: float) -> tuple[Transport, dict[str, Any], P.LineSplitter]:
        delay = 0.05
        last = "no attempt was made"
        while True:
            if self._closed:
                raise P.RunnerError(P.RUNNER_UNREACHABLE, "the client is closed")
            transport: Transport | None = None
            try:
                transport = self._open_transport()
                hello, splitter = self._greet(transport)
                return transport, hello, splitter
            except P.RunnerError as err:
                if err.code == P.VERSION_MISMATCH:
                    if transport is not None:
                        transport.close()
                    raise
                last = err.message
            except OSError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if transport is not None:
                transport.close()
                tail = transport.stderr_tail()
                if tail:
                    last = f"{last} ({tail.splitlines()[-1]})"
            log.info("no runner yet: %s", last)
            if time.monotonic() + delay > deadline:
                raise P.RunnerError(P.RUNNER_UNREACHABLE, f"the sandbox is unreachable: {last}")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _greet(self, transport: Transport) -> tuple[dict[str, Any], P.LineSplitter]:
        """Send hello and read until its answer, before the pump owns this pipe. Frames that come
        first (replays, live output for calls in flight) are dispatched as usual."""
        hello_id = f"{self._prefix}-hello-{next(self._ids)}"
        transport.send(P.encode(P.request(hello_id, HELLO, {"protocol_version": P.PROTOCOL_VERSION})))
        splitter = P.LineSplitter(1 << 30)
        deadline = time.monotonic() + self.hello_timeout
        result: dict[str, Any] | None = None
        while result is None:
            try:
                chunk = transport.read(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise P.RunnerError(P.RUNNER_UNREACHABLE,
                                    f"no answer to hello within {self.hello_timeout:g} s") from None
            if not chunk:
                raise P.RunnerError(P.RUNNER_UNREACHABLE, "the pipe closed before the runner said hello")
            for line in splitter.feed(chunk):
                message = P.decode(line) if isinstance(line, bytes) else None
                if message is None:
                    continue
                if message.get("id") == hello_id:
                    if "error" in message:
                        err = message["error"]
                        raise P.from_error({"message": "hello failed", **err})
                    result = checked_answer(HELLO, message.get("result"))
                elif self._session.instance_id is not None:
                    self._dispatch(message)
        return result, splitter

    def _adopt(self, transport: Transport, hello: dict[str, Any], splitter: P.LineSplitter,
               first: bool) -> list[bytes]:
        """Make `transport` the pipe (lock held): resume or declare a restart. Returns the frames to
        send once the lock is released (nothing is written while holding it: the pump needs it to
        drain the pipe, and a full pipe would then never empty)."""
        frames: list[bytes] = []
        self.hello = hello
        self.max_frame_bytes = int(hello.get("max_frame_bytes") or P.DEFAULT_MAX_FRAME_BYTES)
        self._transport = transport
        was = self._session.instance_id
        adoption = self._session.adopt(hello, first)
        if adoption.kind == "resume":
            resume_id = f"{self._prefix}-resume-{next(self._ids)}"
            frames.append(P.encode(P.request(resume_id, SESSION_RESUME, {"last_seq": adoption.resume_from})))
            resume = Call(resume_id, SESSION_RESUME, b"", None)
            resume.settle()  # nobody waits (its answer is only logged), and it is never sent again
            self._session.calls[resume_id] = resume
        elif adoption.kind == "restarted":
            log.warning("the runner restarted (instance %s, was %s): commands in flight are unknown",
                        self._session.instance_id, was)
            lost = P.RunnerError(P.RUNNER_RESTARTED, P.RESTARTED_MESSAGE)
            for call in adoption.lost:
                call.settle(error=lost)
            if self.on_restart is not None:
                self.on_restart(hello)
        frames += [call.frame for call in adoption.send]
        self._ready = True
        self._pump = threading.Thread(target=self._pump_loop, args=(transport, splitter), name="runner-pump",
                                      daemon=True)
        return frames

    def _go(self, transport: Transport, frames: list[bytes]) -> None:
        """Start pumping the adopted pipe, then send what waited for it."""
        assert self._pump is not None
        self._pump.start()
        for frame in frames:
            self._send_on(transport, frame)

    # -- the pump ---------------------------------------------------------------------------

    def _pump_loop(self, transport: Transport, splitter: P.LineSplitter) -> None:
        while True:
            chunk = transport.read()
            if not chunk:
                break
            for line in splitter.feed(chunk):
                if isinstance(line, bytes):
                    message = P.decode(line)
                    if message is not None:
                        self._dispatch(message)
        with self._lock:
            if self._transport is not transport:
                return
            self._ready = False
            self._transport = None
            if self._closed:
                return
            self.last_error = transport.stderr_tail() or "the pipe to the sandbox closed"
        transport.close()
        self._reconnect()

    def _reconnect(self) -> None:
        try:
            transport, hello, splitter = self._open_and_greet(time.monotonic() + self.reconnect_timeout)
        except P.RunnerError as err:
            log.error("the runner could not be reached again: %s", err.message)
            with self._lock:
                self.last_error = err.message
                self._session.fail_all(err)
            return
        with self._lock:
            if self._closed:
                transport.close()
                return
            self.reconnects += 1
            log.info("reconnected to the runner (reconnect %d)", self.reconnects)
            frames = self._adopt(transport, hello, splitter, first=False)
        self._go(transport, frames)

    def _dispatch(self, message: dict[str, Any]) -> None:
        request_id = message.get("id")
        if request_id is None:
            params = message.get("params")
            if isinstance(params, dict):
                with self._lock:
                    call = self._session.calls.get(params.get("id"))
                if call is not None and call.on_notification is not None:
                    try:
                        call.on_notification({"method": message.get("method"), **params})
                    except Exception:  # noqa: BLE001 - a broken view must not stop the pump
                        log.exception("a live-output handler failed")
            return
        with self._lock:
            call = self._session.answered(message)
            if isinstance(message.get("seq"), int):
                self._tick.notify()
        if call is None:
            return
        if "error" in message:
            err = message.get("error") or {}
            call.settle(error=P.from_error(err if isinstance(err, dict) else {}))
        else:
            try:
                result = checked_answer(call.method, message.get("result"))
            except P.RunnerError as err:
                call.settle(error=err)
            else:
                self._learn(call.method, result)
                call.settle(value=result)

    def _learn(self, method: str, result: Any) -> None:
        """What an answer says of a shell's folder, kept by the session before anyone waiting reads it."""
        with self._lock:
            if method == SHELL_RUN:
                self._session.ran(result)
            elif method == SHELL_CLOSE:
                self._session.closed(result["shell"])

    def _tick_loop(self) -> None:
        """Acks, batched; pings, so an idle relay is not taken for a dead client."""
        last_ping = time.monotonic()
        while True:
            frames: list[bytes] = []
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                wait = self.ping_seconds - (now - last_ping) if self.ping_seconds > 0 else 3600.0
                if self._session.unacked:
                    wait = min(wait, self.ack_delay)
                self._tick.wait(max(wait, 0.0))
                if self._closed:
                    return
                if self._ready and (acked := self._session.ack_due()) is not None:
                    frames.append(P.encode(P.notification(SESSION_ACK, {"seq": acked})))
                if self.ping_seconds > 0 and time.monotonic() - last_ping >= self.ping_seconds:
                    last_ping = time.monotonic()
                    if self._ready:
                        frames.append(P.encode(P.notification(PING)))
                transport = self._transport if self._ready else None
            for frame in frames:
                self._send_on(transport, frame)

    @staticmethod
    def _send_on(transport: Transport | None, frame: bytes) -> None:
        """Write outside the client's lock; a pipe that broke is noticed by the pump, which reconnects
        and sends every unanswered call again."""
        if transport is None:
            return
        try:
            transport.send(frame)
        except OSError as exc:  # the pump sees the pipe end and reconnects
            log.debug("send failed: %s", exc)

    # -- calls ------------------------------------------------------------------------------

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None,
             on_notification: Notification | None = None) -> Any:
        """Send a request and wait for its answer; raises RunnerError for an error answer and
        TimeoutError when `timeout` passes first (the request may still run)."""
        call = self.start_call(method, params, on_notification)
        return self.wait(call, timeout)

    def start_call(self, method: str, params: dict[str, Any] | None = None,
                   on_notification: Notification | None = None) -> Call:
        """Send a request and return it in flight (a future of its answer); live notifications for it go
        to `on_notification`, on the client's reader thread."""
        params = dict(params or {})
        if method == SHELL_RUN:
            with self._lock:
                params = self._session.run_params(params)
        request_id = f"{self._prefix}-{next(self._ids)}"
        frame = P.encode(P.request(request_id, method, params))
        if len(frame) > self.max_frame_bytes:
            raise P.RunnerError(P.INVALID_REQUEST, f"the request is {len(frame)} bytes, larger than the runner's "
                                                   f"limit of {self.max_frame_bytes} bytes; nothing was sent")
        call = Call(request_id, method, frame, on_notification)
        with self._lock:
            if self._closed:
                raise P.RunnerError(P.RUNNER_UNREACHABLE, "the runner client is closed")
            self._session.calls[request_id] = call
            transport = self._transport if self._ready else None
            if transport is not None:
                call.sent_to = self._session.instance_id
            elif self._pump is None or not self._pump.is_alive():
                threading.Thread(target=self._reconnect_once, daemon=True).start()
        self._send_on(transport, frame)
        return call

    def _reconnect_once(self) -> None:
        with self._lock:
            if self._ready or self._closed or (self._pump is not None and self._pump.is_alive()):
                return
            if self._reconnecting:
                return
            self._reconnecting = True
        try:
            self._reconnect()
        finally:
            self._reconnecting = False

    def wait(self, call: Call, timeout: float | None = None) -> Any:
        """`call`'s result, blocking this thread; its RunnerError raised, or TimeoutError past
        `timeout` (then the call is forgotten: an answer that comes later is dropped)."""
        try:
            return call.result(timeout)
        except FutureTimeout:  # not the builtin TimeoutError before Python 3.11
            with self._lock:
                self._session.calls.pop(call.request_id, None)
            raise TimeoutError(f"no answer to {call.method} within {timeout:g} s") from None

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        with self._lock:
            transport = self._transport if self._ready else None
        self._send_on(transport, P.encode(P.notification(method, params)))

    def folder_of(self, shell: str) -> str | None:
        """The shell's folder after its last command here (None: it has not run one, or was closed)."""
        with self._lock:
            return self._session.folders.get(shell)

    def place_shell(self, shell: str, folder: str) -> None:
        """Start `shell` in `folder` the next time the box has to start it (a restore that removed its folder)."""
        with self._lock:
            self._session.folders[shell] = folder

    def shell_folders(self) -> dict[str, str]:
        with self._lock:
            return dict(self._session.folders)

    @property
    def instance_id(self) -> str | None:
        """The daemon instance this client talks to (a new one after a restart of the box)."""
        return self._session.instance_id

    @property
    def restarts(self) -> int:
        """How often the box was found restarted since the first hello."""
        return self._session.restarts

    @property
    def connected(self) -> bool:
        return self._ready

    def cut(self) -> None:
        """Kill the current pipe as a network failure would (for tests and fault drills)."""
        transport = self._transport
        if transport is not None:
            transport.kill()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            transport, self._transport = self._transport, None
            self._ready = False
            self._tick.notify_all()
            self._session.fail_all(P.RunnerError(P.RUNNER_UNREACHABLE, "the runner client was closed"))
        if transport is not None:
            transport.close()

