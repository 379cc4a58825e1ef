"""A command's life on a shell, as its one transition table says: a Stop moves it once, its end
comes once, how it ended is its final state's, and an event the table does not allow is an error.

The expected table below is written out by hand, state by state, rather than read from the code: it
is the specification the code's table is held to, for every (state, event) pair."""

from __future__ import annotations

from typing import IO

import pytest

from owsandbox import protocol as P
from owsandbox.box.shell.capture import LiveBatcher, OutputRecord
from owsandbox.box.shell.command import (
    COMMAND_TRANSITIONS,
    Command,
    CommandEvent,
    CommandEventError,
    CommandState,
    Ending,
)

pytestmark = pytest.mark.unit

S, E = CommandState, CommandEvent
X = None  # the event is not allowed in this state: it raises


def no_log() -> tuple[str, IO[bytes]]:
    raise AssertionError("nothing here prints enough to need a log")


def command(timeout_s: float | None = None) -> Command:
    record = OutputRecord(1000, no_log)
    return Command("sleep 9", "token", record, LiveBatcher(), None, lambda _result: None, timeout_s)


def test_a_second_stop_changes_nothing_and_keeps_the_first_reason() -> None:
    cmd = command(timeout_s=2)
    assert cmd.advance(E.TIMEOUT) == (S.SENT, S.TIMEOUT_PENDING) and cmd.stopping
    assert cmd.advance(E.INTERRUPT) == (S.TIMEOUT_PENDING, S.TIMEOUT_PENDING)
    cmd.advance(E.MARKERS_IN)
    assert cmd.ending() == (P.OUTCOME_TIMEOUT, "timed out after 2 s", True)


def test_it_ends_once_whether_stopped_or_not() -> None:
    plain, stopped = command(), command()
    stopped.advance(E.INTERRUPT)
    for cmd in (plain, stopped):
        before, after = cmd.advance(E.SHELL_GONE)
        assert cmd.ended and before is not after
        with pytest.raises(CommandEventError):
            cmd.advance(E.SHELL_GONE)
        with pytest.raises(CommandEventError):
            cmd.advance(E.MARKERS_IN)
        assert cmd.advance(E.INTERRUPT) == (after, after)  # a Stop that comes as it ends finds it ended
    assert plain.ending("main", 1, "/w").outcome == P.OUTCOME_SHELL_EXITED
    assert stopped.ending("main", 1, "/w").outcome == P.OUTCOME_INTERRUPT


#: state -> the state each event leads to, in the order BEGUN, INTERRUPT, TIMEOUT, BEGIN_WAIT_OVER,
#: MARKERS_IN, SHELL_GONE (X: not allowed).
EXPECTED = {
    S.SENT: (S.RUNNING, S.INTERRUPT_PENDING, S.TIMEOUT_PENDING, X, S.EXITED, S.SHELL_EXITED),
    S.RUNNING: (X, S.INTERRUPTING, S.TIMING_OUT, X, S.EXITED, S.SHELL_EXITED),
    S.INTERRUPT_PENDING: (S.INTERRUPTING, S.INTERRUPT_PENDING, S.INTERRUPT_PENDING, S.INTERRUPTING,
                          S.INTERRUPTED, S.INTERRUPTED_SHELL_ENDED),
    S.TIMEOUT_PENDING: (S.TIMING_OUT, S.TIMEOUT_PENDING, S.TIMEOUT_PENDING, S.TIMING_OUT,
                        S.TIMED_OUT, S.TIMED_OUT_SHELL_ENDED),
    S.INTERRUPTING: (S.INTERRUPTING, S.INTERRUPTING, S.INTERRUPTING, S.INTERRUPTING,
                     S.INTERRUPTED, S.INTERRUPTED_SHELL_ENDED),
    S.TIMING_OUT: (S.TIMING_OUT, S.TIMING_OUT, S.TIMING_OUT, S.TIMING_OUT, S.TIMED_OUT, S.TIMED_OUT_SHELL_ENDED),
    **{final: (X, final, final, final, X, X)
       for final in (S.EXITED, S.SHELL_EXITED, S.INTERRUPTED, S.INTERRUPTED_SHELL_ENDED, S.TIMED_OUT,
                     S.TIMED_OUT_SHELL_ENDED)},
}
EVENTS = (E.BEGUN, E.INTERRUPT, E.TIMEOUT, E.BEGIN_WAIT_OVER, E.MARKERS_IN, E.SHELL_GONE)
#: How each state is reached from a new command, by events alone.
PATHS = {
    S.SENT: (),
    S.RUNNING: (E.BEGUN,),
    S.INTERRUPT_PENDING: (E.INTERRUPT,),
    S.TIMEOUT_PENDING: (E.TIMEOUT,),
    S.INTERRUPTING: (E.BEGUN, E.INTERRUPT),
    S.TIMING_OUT: (E.TIMEOUT, E.BEGIN_WAIT_OVER),
    S.EXITED: (E.BEGUN, E.MARKERS_IN),
    S.SHELL_EXITED: (E.SHELL_GONE,),
    S.INTERRUPTED: (E.BEGUN, E.INTERRUPT, E.MARKERS_IN),
    S.INTERRUPTED_SHELL_ENDED: (E.INTERRUPT, E.SHELL_GONE),
    S.TIMED_OUT: (E.BEGUN, E.TIMEOUT, E.MARKERS_IN),
    S.TIMED_OUT_SHELL_ENDED: (E.TIMEOUT, E.BEGUN, E.SHELL_GONE),
}
CASES = [(state, event, row[i]) for state, row in EXPECTED.items() for i, event in enumerate(EVENTS)]


def reached(state: CommandState) -> Command:
    cmd = command(timeout_s=2)
    for event in PATHS[state]:
        cmd.advance(event)
    assert cmd.state is state
    return cmd


def test_the_expected_table_covers_every_state_and_event() -> None:
    assert set(EXPECTED) == set(CommandState) == set(PATHS) and set(EVENTS) == set(CommandEvent)


def test_the_code_allows_exactly_the_expected_transitions() -> None:
    allowed = {(state, event): after for state, event, after in CASES if after is not None}
    assert COMMAND_TRANSITIONS == allowed


@pytest.mark.parametrize(("state", "event", "after"), [case for case in CASES if case[2] is not None],
                         ids=lambda value: getattr(value, "name", str(value)))
def test_each_allowed_event_moves_to_its_state(state: CommandState, event: CommandEvent,
                                               after: CommandState) -> None:
    cmd = reached(state)
    assert cmd.advance(event) == (state, after)
    assert cmd.state is after


@pytest.mark.parametrize(("state", "event"), [case[:2] for case in CASES if case[2] is None],
                         ids=lambda value: value.name)
def test_each_forbidden_event_raises_naming_the_state_and_the_event(state: CommandState,
                                                                    event: CommandEvent) -> None:
    cmd = reached(state)
    with pytest.raises(CommandEventError, match=f"state {state.name} cannot take event {event.name}") as caught:
        cmd.advance(event)
    assert (caught.value.state, caught.value.event) == (state, event)
    assert cmd.state is state  # nothing changed


def test_an_event_that_is_not_a_command_event_raises() -> None:
    cmd = command()
    with pytest.raises(TypeError, match="'stop'"):
        cmd.advance("stop")  # type: ignore[arg-type]
    assert cmd.state is S.SENT


SHELL_GONE = "the shell 'main' exited (status 3); the next command starts a new shell in /w (variables are gone)"
ENDINGS = {
    S.EXITED: Ending(P.OUTCOME_EXIT, None, False),
    S.SHELL_EXITED: Ending(P.OUTCOME_SHELL_EXITED, SHELL_GONE, False),
    S.INTERRUPTED: Ending(P.OUTCOME_INTERRUPT, "interrupted by user", False),
    S.INTERRUPTED_SHELL_ENDED: Ending(P.OUTCOME_INTERRUPT, "interrupted by user; the shell had to be ended, and a "
                                      "new one starts in its folder", False),
    S.TIMED_OUT: Ending(P.OUTCOME_TIMEOUT, "timed out after 2 s", True),
    S.TIMED_OUT_SHELL_ENDED: Ending(P.OUTCOME_TIMEOUT, SHELL_GONE, True),
}


@pytest.mark.parametrize("state", list(CommandState), ids=lambda state: state.name)
def test_the_final_state_alone_says_how_it_ended(state: CommandState) -> None:
    cmd = reached(state)
    if state not in ENDINGS:
        assert not cmd.ended
        with pytest.raises(RuntimeError, match=f"state {state.name} has not ended"):
            cmd.ending("main", 3, "/w")
        return
    assert cmd.ended
    assert cmd.ending("main", 3, "/w") == ENDINGS[state]


@pytest.mark.parametrize("state", list(CommandState), ids=lambda state: state.name)
def test_stopping_is_whether_a_stop_came_first(state: CommandState) -> None:
    assert reached(state).stopping == (E.INTERRUPT in PATHS[state] or E.TIMEOUT in PATHS[state])


def test_the_end_is_due_once_both_streams_markers_are_in() -> None:
    cmd = command()
    assert not cmd.end_marker("stdout")
    assert not cmd.end_marker("stdout")  # given again by a stop's escalation: counted once
    assert cmd.end_marker("stderr")
