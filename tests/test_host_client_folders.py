"""The client's session owns each shell's folder: learnt from every `shell.run` result, sent with
every `shell.run`, kept across a restart of the box (which knows nothing of the old one's shells) and
forgotten by `shell.close`. Against an in-memory box (a unit test opens no socket): the client, its
pump and its session are the real ones."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from owsandbox import protocol as P
from owsandbox.host.client import RunnerClient
from owsandbox.protocol import methods

from .waiting import wait_until

pytestmark = pytest.mark.unit


class Box:
    """A daemon instance that keeps no folder of its own: a shell that is not up starts in the `cwd` it is
    sent (else /w), as the real registry does; `cd DIR` moves it."""

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self.up: dict[str, str] = {}  # the shells up, and their folders
        self.runs: list[dict[str, Any]] = []

    def answer(self, message: dict[str, Any]) -> dict[str, Any] | None:
        method, params, request_id = message.get("method"), message.get("params") or {}, message.get("id")
        if request_id is None:
            return None
        if method == methods.HELLO:
            return P.result(request_id, {
                "protocol_version": 1, "runner_version": "t", "instance_id": self.instance, "pid": 1, "os": "t",
                "machine": "t", "python": "t", "shell": "bash", "cwd": "/w", "shells": [], "last_seq": 0,
                "max_frame_bytes": 1 << 20, "output_limit": 1000, "log_dir": "/l", "attach_registry": "/a",
                "uptime_s": 0.0, "execd": None})
        if method == methods.SHELL_RUN:
            self.runs.append(params)
            shell = params.get("shell", "main")
            folder = self.up.setdefault(shell, params.get("cwd") or "/w")
            if params["command"].startswith("cd "):
                folder = self.up[shell] = params["command"][3:]
            return P.result(request_id, {
                "shell": shell, "command": params["command"], "cwd": folder, "exit_code": 0, "outcome": "exit",
                "output": "", "timed_out": False, "truncated": False, "duration_ms": 0.1, "output_bytes": 0,
                "output_chars": 0})
        if method == methods.SHELL_CLOSE:
            self.up.pop(params["shell"], None)
            return P.result(request_id, {"shell": params["shell"], "closed": True})
        return P.error(request_id, P.METHOD_NOT_FOUND, str(method))


class Pipe:
    """A transport to `box`: what is sent is answered at once; `read` waits for answers."""

    def __init__(self, box: Box) -> None:
        self.box = box
        self.pending = b""
        self.ended = False
        self.changed = threading.Condition()

    def send(self, data: bytes) -> None:
        if self.ended:
            raise BrokenPipeError("the pipe is closed")
        for line in data.splitlines():
            answer = self.box.answer(json.loads(line))
            if answer is not None:
                with self.changed:
                    self.pending += P.encode(answer)
                    self.changed.notify_all()

    def read(self, timeout: float | None = None) -> bytes:
        with self.changed:
            if not self.changed.wait_for(lambda: self.pending or self.ended, timeout):
                raise TimeoutError
            data, self.pending = self.pending, b""
            return data

    def close(self) -> None:
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    kill = close

    def stderr_tail(self) -> str:
        return ""


@pytest.fixture
def boxes():
    made: list[Box] = []
    pipes: list[Pipe] = []

    def open_pipe() -> Pipe:
        pipes.append(Pipe(made[-1]))
        return pipes[-1]

    made.append(Box("one"))
    client = RunnerClient(open_pipe, ping_seconds=0)
    client.connect()
    yield client, made, pipes
    client.close()


def run(client: RunnerClient, command: str, shell: str = "main", cwd: str = "/w") -> dict[str, Any]:
    return client.call(methods.SHELL_RUN, {"shell": shell, "command": command, "cwd": cwd}, timeout=10)


def test_the_folder_is_learnt_from_each_result_and_sent_after_a_restart(boxes) -> None:
    client, made, pipes = boxes
    assert run(client, "cd /w/sub")["cwd"] == "/w/sub"
    assert client.folder_of("main") == "/w/sub" and client.folder_of("side") is None
    made.append(Box("two"))  # the box restarts: the new daemon knows no shell
    pipes[-1].close()
    wait_until(lambda: client.restarts == 1 and client.connected, 10, "the client to find the new box")
    assert run(client, "pwd")["cwd"] == "/w/sub"  # started where it was, told by the client
    assert made[-1].runs[-1]["cwd"] == "/w/sub"


def test_the_callers_folder_starts_a_new_shell_and_close_forgets(boxes) -> None:
    client, made, _ = boxes
    assert run(client, "pwd", shell="side", cwd="/w/start")["cwd"] == "/w/start"
    run(client, "cd /w/there", shell="side")
    client.call(methods.SHELL_CLOSE, {"shell": "side"}, timeout=10)
    assert client.folder_of("side") is None
    assert run(client, "pwd", shell="side", cwd="/w/start")["cwd"] == "/w/start"
    assert [sent["cwd"] for sent in made[-1].runs] == ["/w/start", "/w/start", "/w/start"]


def test_a_placed_folder_is_where_the_shell_starts_next(boxes) -> None:
    client, made, _ = boxes
    run(client, "cd /w/gone")
    client.place_shell("main", "/w")  # a restore removed /w/gone
    assert made[-1].runs[-1]["cwd"] == "/w"  # (the first run was sent before any folder was known)
    run(client, "pwd")
    assert made[-1].runs[-1]["cwd"] == "/w" and client.shell_folders() == {"main": "/w/gone"}
