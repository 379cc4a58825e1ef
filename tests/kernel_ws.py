"""A kernel's `/api/kernels/{id}/channels` WebSocket, spoken as a browser does (Jupyter's JSON WebSocket
protocol: one JSON message a frame, the channel named in it): for kernels behind a Jupyter server, a
JupyterHub or a kernel gateway, where there is no ZMQ to reach."""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from .waiting import wait_until


@dataclass
class Cell:
    """One cell run through a kernel WebSocket: its reply and iopub outputs (msg_type, content), in order."""

    reply: dict[str, Any]
    outputs: list[tuple[str, dict[str, Any]]]
    seconds: float

    @property
    def status(self) -> str:
        return self.reply["status"]

    def text(self, stream: str = "stdout") -> str:
        return "".join(c["text"] for t, c in self.outputs if t == "stream" and c["name"] == stream)

    def plain(self) -> str:
        """The text/plain of every display (the kernel's notes and %sandbox tables included)."""
        return "".join(c["data"].get("text/plain", "") for t, c in self.outputs
                       if t in ("display_data", "update_display_data"))

    def of_type(self, msg_type: str) -> list[dict[str, Any]]:
        return [c for t, c in self.outputs if t == msg_type]

    @property
    def error(self) -> dict[str, Any]:
        errors = self.of_type("error")
        assert len(errors) == 1, self.outputs
        return errors[0]


class KernelWebSocket:
    """The WebSocket of kernel `url` (ws://…/api/kernels/ID/channels), with `token`. Every message read
    is kept in `seen` (in order) and filed under the request it answers."""

    def __init__(self, url: str, token: str, user: str = "owsandbox-test", sock: Any = None) -> None:
        """`sock`: a connected socket to speak over (one opened in another network namespace)."""
        from websockets.sync.client import connect

        self.user = user
        self.session = uuid.uuid4().hex
        self.seen: list[dict[str, Any]] = []
        self._stack = ExitStack()  # connect() is a context manager (websockets 17 warns otherwise)
        self.ws = self._stack.enter_context(connect(f"{url}?session_id={self.session}", proxy=None,
                                                    additional_headers={"Authorization": f"token {token}"},
                                                    max_size=None, open_timeout=30, sock=sock))
        self._iopub: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        self._idle: set[str] = set()
        self._replies: dict[str, dict[str, Any]] = {}
        info = self._send("kernel_info_request", {})
        self._read_until(lambda: info in self._replies, 60, "the kernel's kernel_info_reply")

    def _send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": msg_type, "username": self.user, "session": self.session,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": "5.3"}
        self.ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content,
                                 "channel": channel, "buffers": []}))
        return msg_id

    def _read(self, timeout: float) -> dict[str, Any] | None:
        """Read one message (None when none came within `timeout`) and file it under its request."""
        try:
            raw = self.ws.recv(timeout=timeout)
        except TimeoutError:
            return None
        if isinstance(raw, bytes):
            return None  # a message with binary buffers: none of the ones read here
        msg = json.loads(raw)
        self.seen.append(msg)
        parent = msg.get("parent_header", {}).get("msg_id")
        kind = msg["header"]["msg_type"]
        if msg["channel"] == "iopub":
            if kind == "status" and msg["content"]["execution_state"] == "idle":
                self._idle.add(parent)
            elif kind not in ("status", "execute_input"):
                self._iopub[parent].append((kind, msg["content"]))
        elif msg["channel"] == "shell" and kind.endswith("_reply"):
            self._replies[parent] = msg["content"]
        return msg

    def _read_until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Read messages (each wait is on the socket, an event) until `done()`."""

        def read_then_check() -> bool:
            if done():
                return True
            self._read(0.5)
            return done()

        wait_until(read_then_check, timeout, what, interval=0)

    def wait_for(self, wanted: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        """Read until a message that is `wanted` comes; that message."""

        def next_wanted() -> dict[str, Any] | None:
            msg = self._read(0.2)
            return msg if msg is not None and wanted(msg) else None

        return wait_until(next_wanted, timeout, what, interval=0)

    def send(self, code: str) -> str:
        """Send a cell without waiting for it; its msg_id."""
        return self._send("execute_request", {"code": code, "silent": False, "store_history": True,
                                              "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})

    def collect(self, msg_id: str, timeout: float = 60) -> Cell:
        """The cell `msg_id` once its kernel went idle after it and replied."""
        started = time.monotonic()
        self._read_until(lambda: msg_id in self._idle and msg_id in self._replies, timeout,
                         f"cell {msg_id} of {self.user}'s kernel to finish")
        return Cell(self._replies.pop(msg_id), self._iopub.pop(msg_id, []), time.monotonic() - started)

    def wait_for_stdout(self, msg_id: str, text: str, timeout: float = 30) -> None:
        """Until cell `msg_id` (still running) has printed `text` on stdout."""

        def printed() -> bool:
            return text in "".join(c["text"] for t, c in self._iopub[msg_id] if t == "stream" and c["name"] == "stdout")

        self._read_until(printed, timeout, f"{text!r} from {self.user}'s cell")

    def run(self, code: str, timeout: float = 60) -> Cell:
        return self.collect(self.send(code), timeout)

    def close(self) -> None:
        self._stack.close()
