"""A Stop is never lost: `shell.interrupt` sent right after `shell.run`, before the command has started.

Through the real daemon (the zipapp, its relay and the resumable client), a command that would run
for half a minute is started and `shell.interrupt` follows 0, 1, 5 or 50 ms later: 200 rounds, half
on a shell that is up (the run starts on the daemon's reader thread), half on a shell that the run
itself starts (the run waits for a new bash on a thread of its own while the interrupt comes in).
Every round the command must end interrupted, the interrupt's answer must say what it did, and the
shell must still be usable, with its variables.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from owsandbox import protocol as P
from owsandbox.host.api import SandboxAPI
from owsandbox.host.providers.local import LocalProvider

from .conftest import running

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
