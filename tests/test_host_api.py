"""The sandbox's calls by name: each asks the box with the protocol's method and hands back the part
of the answer it promises (the calls themselves are tried on real boxes by the kernel's tests)."""

from __future__ import annotations

from typing import Any

import pytest

from owsandbox.host.api import SandboxAPI
from owsandbox.protocol import methods

pytestmark = pytest.mark.unit


class Box:
    """Answers as a box would, and keeps what it was asked (a stand-in for the client's call)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, dict[str, Any], float]] = []

    def __call__(self, method: str, params: dict[str, Any], timeout: float) -> Any:
        self.asked.append((method, params, timeout))
        return self.answers[method]


def test_each_call_names_its_method_and_returns_what_it_promises() -> None:
    box = Box({methods.SHELL_LIST: {"shells": [{"name": "main", "cwd": "/w", "busy": False}]},
               methods.SHELL_COMPLETE: {"matches": ["echo"]}, methods.SHELL_INSPECT: {"text": "a builtin"},
               methods.SHELL_INTERRUPT: {"interrupted": True}, methods.FS_READ: {"text": "x"}})
    api = SandboxAPI(box)
    assert api.shells() == [{"name": "main", "cwd": "/w", "busy": False}]
    assert api.complete({"shell": "main", "line": "ec"}, timeout=2) == ["echo"]
    assert api.inspect("main", "cd", timeout=2) == "a builtin"
    assert api.interrupt_and_wait("main") is True
    assert api.read({"path": "a.txt"})["text"] == "x"
    assert [method for method, _, _ in box.asked] == [methods.SHELL_LIST, methods.SHELL_COMPLETE,
                                                      methods.SHELL_INSPECT, methods.SHELL_INTERRUPT, methods.FS_READ]
    assert box.asked[2][1] == {"shell": "main", "word": "cd"} and box.asked[2][2] == 2


def test_a_call_that_is_not_waited_for_needs_a_starter() -> None:
    with pytest.raises(RuntimeError, match="only makes calls it waits for"):
        SandboxAPI(Box({})).interrupt("main")


def test_live_frames_go_to_the_handler_of_their_kind_as_their_shape() -> None:
    from owsandbox.host.api import live_router

    got: list[tuple[str, dict[str, Any]]] = []
    route = live_router({methods.SHELL_OUTPUT: lambda f: got.append(("output", f)),
                         methods.SHELL_PROGRESS: None,
                         methods.SHELL_INPUT_WANTED: lambda f: got.append(("input", f))})
    route({"method": methods.SHELL_OUTPUT, "id": "r", "shell": "main", "stream": "stdout", "text": "a", "offset": 0})
    route({"method": methods.SHELL_PROGRESS, "id": "r", "shell": "main", "elapsed_s": 5.0, "output_bytes": 1})
    route({"method": methods.SHELL_INPUT_WANTED, "id": "r", "shell": "main", "prompt": "? ", "password": True})
    route({"method": methods.SHELL_OUTPUT, "id": "r", "shell": "main", "stream": "stdout", "text": 5, "offset": 1})
    route({"method": "shell.unheard_of", "id": "r"})
    assert got == [("output", {"id": "r", "shell": "main", "stream": "stdout", "text": "a", "offset": 0}),
                   ("input", {"id": "r", "shell": "main", "prompt": "? ", "password": True})]


def test_an_answer_that_is_not_its_shape_is_an_error_naming_the_field() -> None:
    from owsandbox import protocol as P
    from owsandbox.host.client import checked_answer

    good = {"shell": "main", "interrupted": True, "state": "running"}
    assert checked_answer(methods.SHELL_INTERRUPT, good) is good
    with pytest.raises(P.RunnerError) as err:
        checked_answer(methods.SHELL_INTERRUPT, {**good, "state": "gone"})
    assert err.value.code == P.INTERNAL_ERROR and err.value.message == (
        "the sandbox's answer to shell.interrupt is not the protocol's InterruptResult: field 'state' must be "
        "'running', 'not started', 'ended', 'unknown' or 'idle', not 'gone'")
    assert checked_answer("x.unheard_of", {"anything": 1}) == {"anything": 1}  # no shape: as it came
