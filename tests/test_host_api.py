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
