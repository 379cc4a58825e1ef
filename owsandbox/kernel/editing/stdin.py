"""A command's prompt answered by the notebook, through Jupyter's stdin channel.

When a command blocks reading its terminal, the sandbox says so (`shell.input_wanted`); the kernel
sends an `input_request` on the stdin socket to the client that ran the cell (JupyterLab shows an
input box, the console reads a line) and writes the answer to the command's terminal (`shell.input`).

ipykernel's own `Kernel._input_request` waits for the answer with no way out but a KeyboardInterrupt
in the thread that waits. Here the wait runs on a worker thread while the cell goes on showing output,
and must end when the command does (Stop, a `read -t` that timed out, a command killed): so the wait
polls the socket with a short timeout and checks a `threading.Event`. One request at a time uses the
socket (cells on two subshells may both ask); replies that answer an earlier, abandoned request are
passed over.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

import zmq

EOF = "\x04"  # the value of an input_reply that means end of input (the console's Ctrl-D)
POLL_SECONDS = 0.05  # how often a wait looks at its cancel event


def answers(reply: dict[str, Any] | None, request_id: str, earlier: Collection[str]) -> bool:
    """Whether `reply` (a message read on the stdin socket) answers the request `request_id`.

    A reply names its request in its parent header (JupyterLab); some clients (the console, through
    jupyter_client's `input()`) send none, and then it answers the request that is open. A reply to
    one of the `earlier` requests (an input box filled in after its command had ended) answers
    nothing."""
    if not reply or reply.get("msg_type") != "input_reply":
        return False
    parent = (reply.get("parent_header") or {}).get("msg_id")
    return parent == request_id or parent not in earlier


class StdinChannel:
    """The kernel's stdin socket, shared by the cells that ask for input, one request at a time."""

    def __init__(self, session: Any, socket: Callable[[], zmq.Socket], log: Any = None) -> None:
        self._session = session
        self._socket = socket  # looked up when used: the kernel sets its sockets after construction
        self._log = log
        self._lock = threading.Lock()
        self._asked: deque[str] = deque(maxlen=256)  # the latest requests, for telling stale replies apart

    def ask(self, prompt: str, password: bool, parent: dict[str, Any], ident: Any,
            cancelled: threading.Event) -> str | None:
        """Send an `input_request` to the client of `parent` and wait for its value; None when
        `cancelled` is set first (nothing waits on after that)."""
        while not self._lock.acquire(timeout=POLL_SECONDS):
            if cancelled.is_set():
                return None
        try:
            if cancelled.is_set():
                return None
            socket = self._socket()
            self._purge(socket)
            sent = self._session.send(socket, "input_request", {"prompt": prompt, "password": password},
                                      parent, ident=ident)
            request_id = (sent or {}).get("header", {}).get("msg_id", "")
            try:
                return self._wait(socket, request_id, cancelled)
            finally:
                self._asked.append(request_id)
        finally:
            self._lock.release()

    def _wait(self, socket: zmq.Socket, request_id: str, cancelled: threading.Event) -> str | None:
        while not cancelled.is_set():
            readable, _, broken = zmq.select([socket], [], [socket], POLL_SECONDS)
            if not (readable or broken):
                continue
            try:
                _idents, reply = self._session.recv(socket, mode=zmq.NOBLOCK)
            except Exception:  # noqa: BLE001 - a bad signature or frame is not an answer
                if self._log is not None:
                    self._log.warning("a message on stdin could not be read", exc_info=True)
                continue
            if answers(reply, request_id, self._asked):
                assert reply is not None
                value = (reply.get("content") or {}).get("value", "")
                return value if isinstance(value, str) else ""
        return None

    def _purge(self, socket: zmq.Socket) -> None:
        """Drop replies that came for requests nobody waits for any more."""
        while True:
            try:
                socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return


class CellPrompts:
    """The prompts of one running cell: each `InputWanted` is asked on a thread of its own (the cell
    goes on showing output meanwhile) and its answer written to the command's terminal.

    `ask(prompt, password, cancelled)` waits for the notebook's answer (None: cancelled), and
    `send_input(params)` sends `shell.input` with {"text": ...} or {"eof": True}. A new prompt
    abandons the one before (a `read -t` that gave up); `close` abandons the open one when the
    command has ended, so nothing waits on after the cell."""

    def __init__(self, allowed: bool, ask: Callable[[str, bool, threading.Event], str | None],
                 send_input: Callable[[dict[str, Any]], None]) -> None:
        self.allowed = allowed
        self._ask = ask
        self._send_input = send_input
        self._open: threading.Event | None = None
        self._threads: list[threading.Thread] = []

    def wanted(self, prompt: str, password: bool) -> None:
        if self._open is not None:
            self._open.set()
        cancelled = self._open = threading.Event()
        worker = threading.Thread(target=self._answer, args=(prompt, password, cancelled),
                                  name="owsandbox-input", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [worker]
        worker.start()

    def _answer(self, prompt: str, password: bool, cancelled: threading.Event) -> None:
        if not self.allowed:  # the sandbox was told so and should not ask; if it does, end the read
            self._send_input({"eof": True})
            return
        value = self._ask(prompt, password, cancelled)
        if value is None or cancelled.is_set():
            return
        self._send_input({"eof": True} if value == EOF else {"text": value})

    def close(self) -> None:
        if self._open is not None:
            self._open.set()

    def join(self, timeout: float = 5.0) -> bool:
        """Wait for the workers to end (tests); True when they all did."""
        for worker in self._threads:
            worker.join(timeout)
        return not any(worker.is_alive() for worker in self._threads)
