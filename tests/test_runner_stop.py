"""A Stop is never lost: `shell.interrupt` sent right after `shell.run`, before the command has started.

Through the real daemon (the zipapp, its relay and the resumable client), a command that would run
for half a minute is started and `shell.interrupt` follows 0, 1, 5 or 50 ms later: 200 rounds, half
on a shell that is up (the run starts on the daemon's reader thread), half on a shell that the run
itself starts (the run waits for a new bash on a thread of its own while the interrupt comes in).
Every round the command must end interrupted, the interrupt's answer must say what it did, and the
shell must still be usable, with its variables.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from owsandbox import protocol as P
from owsandbox.box import procstat
from owsandbox.box.procstat import pid_alive
from owsandbox.host.api import SandboxAPI
from owsandbox.host.providers.local import LocalProvider

from .conftest import running
from .processes import wait_gone
from .waiting import wait_until

pytestmark = pytest.mark.system

ROUNDS = 50  # per delay: 200 in all
ANSWER_S = 30  # a bound on each answer, for a broken daemon; an interrupted command answers in ms


@pytest.fixture
def local_box(zipapp: Path, workspace: Path):
    with running(LocalProvider(cwd=workspace, runner_path=zipapp, relay_silence_seconds=0)) as pair:
        yield pair


@pytest.mark.timeout(600)
@pytest.mark.parametrize("delay_ms", [0, 1, 5, 50])
def test_a_stop_sent_right_after_the_run_ends_the_command(local_box, delay_ms: int) -> None:
    _, client = local_box
    api = SandboxAPI.over(client)
    assert api.run({"shell": "main", "command": "export KEPT=yes"}, timeout=ANSWER_S)["exit_code"] == 0
    answers: dict[str, int] = {}
    for round_ in range(ROUNDS):
        shell = "main" if round_ % 2 == 0 else f"new-{round_}"
        run = api.start_run({"shell": shell, "command": "sleep 30"})
        if delay_ms:
            time.sleep(delay_ms / 1000)  # the delay under test, not a wait for an event
        answer = api.stop(shell, run.request_id, timeout=ANSWER_S)
        result = client.wait(run, ANSWER_S)
        where = f"round {round_} on {shell}, {delay_ms} ms: {answer}, {result}"
        assert result["outcome"] == P.OUTCOME_INTERRUPT, where
        assert answer["interrupted"] is True and answer["state"] in ("running", "not started"), where
        answers[answer["state"]] = answers.get(answer["state"], 0) + 1
        if answer["state"] == "not started":
            assert result["exit_code"] is None and "before it started" in result["error"], where
        else:
            assert result["error"].startswith("interrupted by user"), where
        if shell == "main":
            assert api.run({"shell": shell, "command": "echo $KEPT"}, timeout=ANSWER_S)["output"] == "yes\n", where
        else:
            assert api.run({"shell": shell, "command": "echo ok"}, timeout=ANSWER_S)["output"] == "ok\n", where
            api.close_shell(shell)
    print(f"[stop] {delay_ms} ms: {ROUNDS} rounds, interrupts answered {answers}")
    late = api.stop("main", run.request_id, timeout=ANSWER_S)  # the last run ended long ago
    assert late == {"shell": "main", "interrupted": False, "state": "ended"}


@pytest.mark.timeout(120)
def test_a_shell_slow_to_come_back_after_a_stop_is_kept(local_box, workspace: Path) -> None:
    """On a busy machine bash can take seconds to come back to its prompt once its command's programs are
    killed (it, or the daemon's reader of its end markers, is not run in time). The Stop waits for it
    rather than end the shell with its variables. Here bash is held stopped (SIGSTOP) for two seconds
    after the last of its programs was killed, more than the second it was once given."""
    _, client = local_box
    api = SandboxAPI.over(client)
    bash = int(api.run({"shell": "main", "command": "export KEPT=yes; echo $$"}, timeout=ANSWER_S)["output"])
    run = api.start_run({"shell": "main", "command": "sh -c 'trap \"\" INT TERM; echo $$ >held; exec sleep 60'"})
    wait_until(lambda: (workspace / "held").read_text().strip() if (workspace / "held").exists() else None,
               ANSWER_S, "the command to start")
    held = int((workspace / "held").read_text())
    os.kill(bash, signal.SIGSTOP)
    try:
        assert api.stop("main", run.request_id, timeout=ANSWER_S)["interrupted"] is True
        assert wait_gone([held], ANSWER_S) == []  # it ignores SIGINT and SIGTERM: the Stop's SIGKILL ended it
        time.sleep(2)  # the delay under test, not a wait for an event
        assert pid_alive(bash), "the Stop ended a shell that was only slow"
    finally:
        os.kill(bash, signal.SIGCONT)
    result = client.wait(run, ANSWER_S)
    assert result["outcome"] == P.OUTCOME_INTERRUPT and result["error"] == "interrupted by user", result
    assert api.run({"shell": "main", "command": "echo $KEPT $$"}, timeout=ANSWER_S)["output"] == f"yes {bash}\n"


@pytest.mark.timeout(120)
def test_a_shell_stuck_in_itself_is_ended_by_a_stop_and_the_next_command_gets_a_new_one(local_box) -> None:
    """A loop of builtins with SIGINT ignored: only ending bash stops it. It is ended once it has spun a
    second of its own CPU time, and says so; the next command runs in a new shell, without the variables."""
    _, client = local_box
    api = SandboxAPI.over(client)
    bash = int(api.run({"shell": "main", "command": "export KEPT=yes; echo $$"}, timeout=ANSWER_S)["output"])
    run = api.start_run({"shell": "main", "command": "trap '' INT; while :; do :; done"})
    wait_until(lambda: (procstat.cpu_seconds(bash) or 0) > 0.05, ANSWER_S, "the loop to spin")
    assert api.stop("main", run.request_id, timeout=ANSWER_S)["interrupted"] is True
    result = client.wait(run, ANSWER_S)
    assert result["outcome"] == P.OUTCOME_INTERRUPT, result
    assert result["error"] == "interrupted by user; the shell had to be ended, and a new one starts in its folder"
    assert (procstat.cpu_seconds(bash) or 1.0) >= 1.0 or not pid_alive(bash)
    after = api.run({"shell": "main", "command": "echo \"[$KEPT]\" $$"}, timeout=ANSWER_S)["output"]
    assert after.startswith("[] ") and after != f"[] {bash}\n", after
