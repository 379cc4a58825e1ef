"""The host's copy of a sandbox's stderr: bounded, cut at a line, and drained to the end."""

from __future__ import annotations

import os

import pytest

from owsandbox.host.logpump import DROPPED, LogPump, kept_tail

pytestmark = pytest.mark.unit


def test_a_short_log_is_kept_whole():
    assert kept_tail(b"one\ntwo\n", 100) == b"one\ntwo\n"


def test_a_long_log_keeps_its_last_whole_lines():
    data = b"".join(b"line %d\n" % n for n in range(1000))
    tail = kept_tail(data, 100)
    assert tail.startswith(DROPPED) and tail.endswith(b"line 999\n")
    assert len(tail) - len(DROPPED) <= 100 and tail[len(DROPPED):].startswith(b"line ")


def test_the_pump_copies_everything_and_stays_within_twice_its_size(tmp_path):
    read, write = os.pipe()
    path = tmp_path / "daemon.log"
    pump = LogPump(read, str(path), keep=4096).start()
    for n in range(5000):
        os.write(write, b"message %05d from the box\n" % n)
    assert not pump.settle(0.05)  # a writer is still there
    os.close(write)
    assert pump.settle(5)
    text = path.read_bytes()
    assert len(text) <= 2 * 4096 + len(DROPPED) and text.endswith(b"message 04999 from the box\n")
    assert text.startswith(DROPPED)


def test_a_link_in_place_of_the_log_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("kept\n")
    (tmp_path / "daemon.log").symlink_to(target)
    read, write = os.pipe()
    pump = LogPump(read, str(tmp_path / "daemon.log")).start()
    os.write(write, b"x" * 100_000)  # more than a pipe holds: it is drained even with nowhere to write
    os.close(write)
    assert pump.settle(5)
    assert target.read_text() == "kept\n"
