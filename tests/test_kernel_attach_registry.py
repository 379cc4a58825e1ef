"""The attach registry's saves: the last one to land holds the newest cursors.

A kernel saves its attached programs' cursors in the sandbox twice over: soon after records arrive (a
save on a thread of its own, so the live view never waits for the box), and exactly when a program is
detached or the kernel shuts down. The box here is a stand-in `fs.read`/`fs.write` that holds the
first write back until the test lets it go, as a busy box answers late; nothing else is faked.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from owsandbox.kernel.attach.registry import AttachRegistry

pytestmark = pytest.mark.unit


class SlowBox:
    """`fs.read` and `fs.write` of one file; the first write waits for `release`."""

    def __init__(self) -> None:
        self.text = ""
        self.release = threading.Event()
        self.first_write = threading.Event()  # set when the first write has begun
        self.second_write = threading.Event()
        self.writes: list[int] = []  # the cursor each write carried, in the order they landed

    def call(self, method: str, params: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        if method == "fs.read":
            return {"text": self.text}
        if not self.first_write.is_set():
            self.first_write.set()
            self.release.wait(10)
        else:
            self.second_write.set()
        cursor = json.loads(params["text"])["sessions"][0]["cursor"]
        self.text = params["text"]
        self.writes.append(cursor)
        return {"path": params["path"], "bytes": len(params["text"])}


def attached(cursor: int) -> SimpleNamespace:
    return SimpleNamespace(session_id="s1", name="engine", command="engine --stdio", cwd="/w", url="",
                           cursor=cursor, cursor_tail=b"", state="attached", number=1,
                           conversation=SimpleNamespace(dialect=SimpleNamespace(name="json-lines"),
                                                        dialect_fixed=False), auto_answers={})


def test_a_detach_save_during_a_slow_scheduled_save_lands_last() -> None:
    box = SlowBox()
    program = attached(cursor=5)
    registry = AttachRegistry(box.call, lambda: "/box/attached.json", lambda: [program],
                              loop=None)  # type: ignore[arg-type] - these saves are called directly
    scheduled = threading.Thread(target=registry.save)  # a save soon after records, on its own thread
    scheduled.start()
    assert box.first_write.wait(10)  # its write has reached the box, which holds it
    program.cursor = 11  # more records were handed over; then %detach saves the exact cursor
    detach = threading.Thread(target=registry.save)
    detach.start()
    # A second save must wait for the first: if it wrote meanwhile, the held one would land after it.
    assert not box.second_write.wait(0.5), "a second save wrote while the first was still writing"
    box.release.set()
    scheduled.join(10)
    detach.join(10)
    assert box.writes == [5, 11]
    assert json.loads(box.text)["sessions"][0]["cursor"] == 11
