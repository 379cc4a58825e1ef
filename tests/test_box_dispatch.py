"""The daemon's router: a request that fails in a way nobody foresaw is answered with that failure,
once, and the connection's reader goes on to the next message (one that died would leave the client
waiting on an open connection for ever)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from owsandbox import protocol as P
from owsandbox.box.dispatch import Dispatcher
from owsandbox.box.outbox import ANSWERED, RUNNING, Records
from owsandbox.box.shell.registry import ShellRegistry
from owsandbox.protocol.methods import SHELL_LIST, SHELL_RUN

from .waiting import patience, wait_until

pytestmark = pytest.mark.unit


class Collected:
    """Stands for the client's connection (no socket in a unit test): what was sent on it."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def send(self, frame: bytes) -> bool:
        self.frames.append(json.loads(frame))
        return True


class BrokenShell:
    """A shell whose `run` fails unforeseen, as a pipe closed under its writer once did."""

    name = "main"
    alive = True

    def run(self, *_args: Any, **_options: Any) -> None:
        raise ValueError("I/O operation on closed file.")


class Registry(ShellRegistry):
    """The real registry, with the broken shell up under the name `main`."""

    def running(self, name: str) -> Any:
        return BrokenShell() if name == "main" else None


def dispatcher(tmp_path: Any) -> tuple[Dispatcher, Collected]:
    sent = Collected()
    shells = Registry(str(tmp_path))
    return Dispatcher(Records(), shells, sent.send, lambda: {}, "instance"), sent


def test_an_unforeseen_failure_answers_the_request_and_the_next_is_read(tmp_path):
    router, sent = dispatcher(tmp_path)
    router.handle(sent, P.request("r1", SHELL_RUN, {"shell": "main", "command": "true"}))
    router.handle(sent, P.request("r2", SHELL_LIST, {}))
    first, second = sent.frames
    assert first["id"] == "r1" and first["error"]["code"] == P.INTERNAL_ERROR
    assert first["error"]["message"] == ("the sandbox's daemon failed on this request: ValueError: I/O operation "
                                         "on closed file.")
    assert "seq" in first  # kept like any answer: a client that reconnects gets it again
    assert second["id"] == "r2" and second["result"] == {"shells": []}


def test_a_failure_after_the_answer_went_adds_no_second_answer():
    records = Records()
    assert records.begin("r1")[0] == "new"
    records.answer("r1", P.result("r1", {"exit_code": 0}))
    assert records.answer_unanswered("r1", P.error("r1", P.INTERNAL_ERROR, "late")) == (ANSWERED, None)
    assert records.answer_unanswered("never-seen", P.error("never-seen", P.INTERNAL_ERROR, "x")) == (None, None)
    records.begin("r2")
    state, frame = records.answer_unanswered("r2", P.error("r2", P.INTERNAL_ERROR, "failed"))
    assert state == RUNNING and json.loads(frame)["error"]["message"] == "failed"
    assert records.begin("r2")[0] == ANSWERED


class TalkingShell:
    """A shell that, given a command, sends one live frame of each kind and ends, as bash.Shell does."""

    name = "main"
    alive = True
    cwd = "/w/sub"

    def run(self, command: str, on_done: Any, on_live: Any, **_options: Any) -> None:
        from owsandbox.protocol import methods

        on_live(methods.SHELL_OUTPUT, {"stream": "stdout", "text": "hi\n", "offset": 0, "seq": 1})
        on_live(methods.SHELL_PROGRESS, {"elapsed_s": 5.0, "output_bytes": 3})
        on_live(methods.SHELL_INPUT_WANTED, {"prompt": "name? ", "password": False})
        on_done({"shell": "main", "command": command, "cwd": self.cwd, "exit_code": 0, "outcome": "exit",
                 "output": "hi\n", "timed_out": False, "truncated": False, "duration_ms": 1.0, "output_bytes": 3,
                 "output_chars": 3})


def test_each_live_frame_goes_out_as_its_own_kind_and_shape(tmp_path):
    from owsandbox.protocol import messages as M
    from owsandbox.protocol.shapes import parse

    class Talking(ShellRegistry):
        def running(self, name: str) -> Any:
            return TalkingShell() if name == "main" else None

    sent = Collected()
    router = Dispatcher(Records(), Talking(str(tmp_path)), sent.send, lambda: {}, "instance")
    router.handle(sent, P.request("r1", SHELL_RUN, {"shell": "main", "command": "ask"}))
    *live, answer = sent.frames
    assert [frame["method"] for frame in live] == ["shell.output", "shell.progress", "shell.input_wanted"]
    for frame in live:
        assert frame["params"]["id"] == "r1" and frame["params"]["shell"] == "main"
        parse(M.LIVE_SHAPES[frame["method"]], frame["params"])
        assert not {"progress", "input_wanted"} & set(frame["params"])  # no flags: the kind is the method
    assert parse(M.RunResult, answer["result"])["cwd"] == "/w/sub"


@pytest.mark.parametrize(("method", "params", "message"), [
    (SHELL_RUN, {"command": 1}, "param 'command' must be a string, not int"),
    (SHELL_RUN, {}, "missing param 'command'"),
    (SHELL_RUN, {"command": "x", "stderr": "both"}, "param 'stderr' must be 'apart' or 'merge', not 'both'"),
    (SHELL_RUN, {"command": "x", "timeout_s": -1}, "param 'timeout_s' must be at least 0, not -1"),
    ("shell.close", {}, "missing param 'shell'"),
    ("shell.input", {"shell": "main"}, "missing param 'text'"),
    ("shell.interrupt", {"shell": 3}, "param 'shell' must be a string, not int"),
    ("runner.hello", {"protocol_version": "1"}, "param 'protocol_version' must be an integer, not str"),
    ("session.resume", {}, "missing param 'last_seq'"),
])
def test_every_request_is_parsed_as_its_shape_and_a_bad_one_named(tmp_path, method, params, message):
    router, sent = dispatcher(tmp_path)
    router.handle(sent, P.request("r1", method, params))
    # a work method (shell.input, say) is answered from the dispatcher's worker thread: wait for it
    wait_until(lambda: sent.frames, patience(10), f"the answer to {method}")
    assert sent.frames[0]["error"] == {"code": P.INVALID_PARAMS, "message": message}
