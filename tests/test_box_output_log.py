"""A command's whole-output log lives in the box's size-limited /run: when it fills, the log stops,
the record says so, and nothing else breaks."""

from __future__ import annotations

import errno
import io

import pytest

from owsandbox.box.shell.capture import OutputRecord

pytestmark = pytest.mark.unit


class FillingFile(io.RawIOBase):
    """A log file on a file system with room for `room` bytes."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.kept = b""

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        if len(self.kept) + len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.kept += bytes(data)
        return len(data)


def test_a_full_log_stops_the_log_and_says_so_while_the_record_goes_on() -> None:
    log = FillingFile(room=250)
    record = OutputRecord(100, lambda: ("/run/owsandbox/run/logs/1.log", log))  # type: ignore[arg-type,return-value]
    for i in range(100):
        line = f"line {i:04d}\n"
        record.add("stdout", line.encode(), line)
    text = record.finish()
    assert text.startswith("line 0000\n")
    assert text.endswith("line 0099\n")
    assert "holds the output only up to where writing it failed (No space left on device)" in text
    assert log.kept.startswith(b"line 0000\n") and len(log.kept) <= 250
    assert record.total_chars == 1000


def test_a_log_with_room_keeps_everything() -> None:
    log = FillingFile(room=10_000)
    record = OutputRecord(100, lambda: ("/x.log", log))  # type: ignore[arg-type,return-value]
    for i in range(100):
        line = f"line {i:04d}\n"
        record.add("stdout", line.encode(), line)
    assert "the whole output is in /x.log" in record.finish()
    assert len(log.kept) == 1000
