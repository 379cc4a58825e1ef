"""The resume-or-restart decision, without pipes or threads: a call that may have run is never sent
twice, and nothing unanswered is forgotten."""

from __future__ import annotations

import pytest

from owsandbox import protocol as P
from owsandbox.host.client import Call
from owsandbox.host.session import Session

pytestmark = pytest.mark.unit


def call(session: Session, request_id: str, sent_to: str | None = None) -> Call:
    made = Call(request_id, "shell.run", f"frame {request_id}".encode(), None)
    made.sent_to = sent_to
    session.calls[request_id] = made
    return made


def test_the_first_hello_starts_from_the_boxs_last_seq_and_sends_what_waited() -> None:
    session = Session()
    waiting = call(session, "a")
    adoption = session.adopt({"instance_id": "one", "last_seq": 7}, first=True)
    assert adoption.kind == "first" and adoption.send == [waiting] and waiting.sent_to == "one"
    assert session.seqs.contiguous == 7 and session.acked == 7 and session.ack_due() is None


def test_the_same_daemon_resumes_after_the_last_contiguous_answer_and_resends_the_unanswered() -> None:
    session = Session()
    session.adopt({"instance_id": "one", "last_seq": 0}, first=True)
    sent = call(session, "a", sent_to="one")
    answered = call(session, "b", sent_to="one")
    for seq, request_id in ((1, "b"), (3, "x")):
        session.answered({"id": request_id, "seq": seq, "result": {}})
    adoption = session.adopt({"instance_id": "one", "last_seq": 3}, first=False)
    assert adoption.kind == "resume" and adoption.resume_from == 1  # 2 is missing: ask again from 1
    assert adoption.send == [sent] and not adoption.lost and answered.request_id not in session.calls


def test_another_daemon_fails_every_sent_call_and_sends_only_the_never_sent() -> None:
    session = Session()
    session.adopt({"instance_id": "one"}, first=True)
    sent = call(session, "a", sent_to="one")
    never = call(session, "b")
    adoption = session.adopt({"instance_id": "two", "last_seq": 0}, first=False)
    assert adoption.kind == "restarted" and adoption.lost == [sent] and adoption.send == [never]
    assert session.restarts == 1 and session.instance_id == "two" and list(session.calls) == ["b"]
    assert never.sent_to == "two"


def test_a_replayed_answer_settles_nothing_twice_and_acks_are_due_once() -> None:
    session = Session()
    session.adopt({"instance_id": "one"}, first=True)
    first = call(session, "a", sent_to="one")
    assert session.answered({"id": "a", "seq": 1, "result": 1}) is first
    assert session.answered({"id": "a", "seq": 1, "result": 1}) is None
    assert session.ack_due() == 1 and session.ack_due() is None and not session.unacked


def test_failing_all_settles_and_forgets_every_call() -> None:
    session = Session()
    calls = [call(session, name) for name in "abc"]
    session.fail_all(P.RunnerError(P.RUNNER_UNREACHABLE, "gone"))
    assert not session.calls
    assert all(isinstance(c.error, P.RunnerUnreachable) and c.done() for c in calls)


# -- each shell's folder: the session is its one owner on the host -------------------------------

def ran(session: Session, shell: str, cwd: str) -> None:
    session.ran({"shell": shell, "cwd": cwd, "command": "cd x"})


def test_a_shells_folder_is_learnt_from_its_result_and_sent_with_its_next_run() -> None:
    session = Session()
    first = session.run_params({"shell": "main", "command": "cd sub", "cwd": "/w"})
    assert first["cwd"] == "/w"  # the caller's: where a shell starts that has run nothing here
    ran(session, "main", "/w/sub")
    assert session.run_params({"shell": "main", "command": "ls", "cwd": "/w"})["cwd"] == "/w/sub"
    assert session.run_params({"command": "ls"})["cwd"] == "/w/sub"  # no shell named: "main"
    assert "cwd" not in session.run_params({"shell": "other", "command": "ls"})


def test_a_closed_shell_is_forgotten_and_a_restart_keeps_every_folder() -> None:
    session = Session()
    session.adopt({"instance_id": "one"}, first=True)
    ran(session, "main", "/w/a")
    ran(session, "side", "/w/b")
    session.closed("side")
    assert session.folders == {"main": "/w/a"}
    session.adopt({"instance_id": "two"}, first=False)  # a new box knows nothing: the session tells it
    assert session.run_params({"shell": "main", "command": "pwd"})["cwd"] == "/w/a"


def test_a_result_without_a_folder_teaches_nothing() -> None:
    session = Session()
    session.ran({"shell": "main", "cwd": "", "command": "x"})
    assert session.folders == {}



def test_a_call_is_a_future_settled_once_that_nobody_cancels() -> None:
    """(The kernel awaits it with `asyncio.wrap_future`: test_kernel_prompts and the kernel tests run that.)"""
    from concurrent.futures import Future

    made = Call("a", "shell.run", b"frame", None)
    assert isinstance(made, Future) and not made.done() and made.error is None
    assert made.cancel() is False and not made.cancelled()  # it may run in the box: only shell.interrupt stops it
    seen: list[object] = []
    made.add_done_callback(lambda done: seen.append(done.result()))
    made.settle({"exit_code": 0})  # as the pump thread settles it
    assert seen == [{"exit_code": 0}]
    made.settle(error=P.RunnerError(P.RUNNER_RESTARTED, P.RESTARTED_MESSAGE))  # a late second answer changes nothing
    assert made.result(0) == {"exit_code": 0} and made.error is None
    failed = Call("b", "shell.run", b"frame", None)
    failed.settle(error=P.RunnerError(P.RUNNER_UNREACHABLE, "gone"))
    assert isinstance(failed.error, P.RunnerUnreachable)
    with pytest.raises(P.RunnerUnreachable):
        failed.result(0)


def test_waiting_past_the_timeout_is_the_builtin_timeout_error_and_forgets_the_call() -> None:
    from owsandbox.host.client import RunnerClient

    client = RunnerClient(lambda: None)  # type: ignore[arg-type,return-value]  # never connected: no pipe is opened
    waiting = call(client._session, "late")
    with pytest.raises(TimeoutError, match="no answer to shell.run within 0.01 s"):
        client.wait(waiting, 0.01)
    assert "late" not in client._session.calls
