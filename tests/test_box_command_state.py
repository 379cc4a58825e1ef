"""A command's life on a shell, as its one transition table says: a Stop moves it once, its end
comes once, and how it ended follows from the stop that came first."""

from __future__ import annotations

from typing import IO

import pytest

from owsandbox import protocol as P
from owsandbox.box.shell.bash import Command, CommandState
from owsandbox.box.shell.capture import LiveBatcher, OutputRecord

pytestmark = pytest.mark.unit


def no_log() -> tuple[str, IO[bytes]]:
    raise AssertionError("nothing here prints enough to need a log")


def command(timeout_s: float | None = None) -> Command:
    record = OutputRecord(1000, no_log)
    return Command("sleep 9", "token", record, LiveBatcher(), None, lambda _result: None, timeout_s)


def test_a_second_stop_changes_nothing_and_keeps_the_first_reason() -> None:
    cmd = command(timeout_s=2)
    assert cmd.advance("stop", "timeout") and cmd.state is CommandState.STOPPING
    assert not cmd.advance("stop", "interrupt") and cmd.stop_reason == "timeout"
    assert cmd.ending(None, P.OUTCOME_EXIT) == (P.OUTCOME_TIMEOUT, "timed out after 2 s")


def test_it_ends_once_whether_stopped_or_not() -> None:
    plain, stopped = command(), command()
    stopped.advance("stop", "interrupt")
    for cmd in (plain, stopped):
        assert cmd.advance("ended") and cmd.state is CommandState.ENDED
        assert not cmd.advance("ended") and not cmd.advance("stop", "interrupt")
    assert plain.ending(None, P.OUTCOME_EXIT) == (P.OUTCOME_EXIT, None)
    assert stopped.ending("the shell exited", P.OUTCOME_SHELL_EXITED) == (P.OUTCOME_INTERRUPT, "the shell exited")
    assert plain.ending("the shell exited", P.OUTCOME_SHELL_EXITED) == (P.OUTCOME_SHELL_EXITED, "the shell exited")
