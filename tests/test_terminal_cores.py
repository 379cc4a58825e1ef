"""The pure parts of the terminal and the limits: fed values, no processes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from owsandbox.box.shell.terminal import EchoStripper
from owsandbox.host.isolation.resources import LimitReport, Limits
from owsandbox.kernel.cell.limit_names import named_limit

pytestmark = pytest.mark.unit


def test_the_echo_of_an_answer_is_taken_out_once_even_split_across_reads():
    echo = EchoStripper()
    echo.expect(b"Ada\n")
    assert echo.strip(b"Ad") == b""
    assert echo.strip(b"a\nhello Ada\n") == b"hello Ada\n"
    assert echo.strip(b"Ada\n") == b"Ada\n"  # only once


def test_output_that_is_not_the_echo_is_kept_whole():
    echo = EchoStripper()
    echo.expect(b"secret\n")
    assert echo.strip(b"warning: x\n") == b"warning: x\n"
    assert echo.strip(b"secret\n") == b"secret\n"  # the expectation was dropped, not kept for later


def test_limits_parse_sizes_and_refuse_what_is_wrong():
    limits = Limits.parse("memory=2G,pids=512,tmp=512M,shm=64MiB,cpu=1.5")
    assert (limits.memory, limits.pids, limits.tmp, limits.shm, limits.cpu) == (2 << 30, 512, 512 << 20, 64 << 20, 1.5)
    assert Limits.parse(None).pids == 1024 and Limits.parse(None).memory <= 4 << 30
    for bad, words in [("memory=lots", "not a size"), ("pids=3", "at least 16"), ("cpu=0", "more than 0"),
                       ("disk=1G", "no limit is named 'disk'; the limits are memory"), ("memory", "NAME=VALUE"),
                       ("tmp=10K", "under 1 MiB")]:
        with pytest.raises(ValueError, match=words):
            Limits.parse(bad)


def test_a_limit_is_named_from_counters_first_and_from_words_without_them():
    limits = LimitReport(Limits.parse("memory=1G,pids=64").describe())
    killed = {"exit_code": 137, "output": ""}
    assert named_limit(killed, {"oom_kills": 0}, {"oom_kills": 1}, limits)[0] == "OutOfMemory"
    assert named_limit(killed, {"oom_kills": 1}, {"oom_kills": 1}, limits) is None  # counted, and nothing new
    assert named_limit(killed, {}, {}, limits) is None  # rlimits: a SIGKILL is not the memory limit's
    guessed = named_limit(killed, {}, {}, replace(limits, oom_counted=False))  # a container's, uncounted
    assert guessed[0] == "OutOfMemory" and "most likely" in guessed[1]
    said = {"exit_code": 1, "output": "MemoryError\n", "segments": [["stderr", 12]]}
    assert named_limit(said, {}, {}, limits)[0] == "OutOfMemory"
    assert named_limit(said, {}, {}, None) is None  # no limits, no names
    retried = {"exit_code": 0, "output": "bash: fork: retry: Resource temporarily unavailable\n"}
    assert named_limit(retried, {}, {}, limits)[0] == "TooManyProcesses"
    full = {"exit_code": 1, "output": "dd: error writing '/tmp/x': No space left on device\n"}
    assert named_limit(full, {}, {}, limits)[0] == "NoSpaceLeft"
    assert named_limit({"exit_code": 0, "output": "MemoryError mentioned\n"}, {}, {}, limits) is None
