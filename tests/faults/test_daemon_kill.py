"""kill -9 of the daemon mid-command: the command is reported lost, never run again, and the next one works.

A SIGKILLed daemon is a sandbox that restarted: the client finds a new `instance_id` behind the next
pipe, so the call in flight fails with RUNNER_RESTARTED ("the outcome of this command is unknown")
and is never sent again; the shell comes back in its last known folder (its variables are gone).
Ten rounds on a LocalProvider at moments drawn from a seeded RNG, then the same through the kernel,
where the cell gets an `error` output named `SandboxRestarted` and the next cell works.

The killed daemon's shells live in sessions of their own, so a SIGKILL leaves them orphaned; the
daemon writes their pids beside its socket, and the provider ends them (the last test checks it).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from owsandbox import protocol as P
from owsandbox.host.client import RunnerClient
from owsandbox.host.executor import RunnerExecutor
from owsandbox.host.providers.local import LocalProvider, descendants
from tests.kernel_session import KernelSession
from tests.processes import wait_gone
from tests.waiting import wait_until

from ..conftest import running
from .helpers import alive, reap, seed_from_env

pytestmark = pytest.mark.system

SEED = 4242
ROUNDS = 10
KERNEL_ROUNDS = 3


def _lines(text: str) -> list[str]:
    return text.split()


@pytest.fixture
def local_box(zipapp: Path, workspace: Path):
    with running(LocalProvider(cwd=workspace, runner_path=zipapp, relay_silence_seconds=0),
                 reconnect_timeout=20) as pair:
        yield pair


@pytest.mark.timeout(300)
def test_kill_9_of_the_daemon_mid_command_is_reported_never_rerun(local_box, workspace: Path) -> None:
    seed = seed_from_env(SEED)
    rng = random.Random(seed)
    provider, client = local_box
    shell = RunnerExecutor(client)
    effects = workspace / "effects.txt"
    orphans_left: list[int] = []
    finished_anyway = 0
    for round_ in range(ROUNDS):
        folder = workspace / f"r{round_}"
        # The executor keeps its shell's folder (the client stays generic), as the kernel's sandbox does.
        ready = shell.run(f"mkdir -p {folder} && cd {folder} && export GONE=1")
        assert ready["exit_code"] == 0 and ready["cwd"] == str(folder), (seed, round_, ready)
        daemon_pid = provider.daemon_pid
        assert daemon_pid and alive(daemon_pid)

        command = (f"echo start-{round_} >> {effects}; for i in $(seq 1 60); do echo line-$i; sleep 0.02; done; "
                   f"echo end-{round_} >> {effects}")
        call = client.start_call("shell.run", {"command": command})
        assert call.sent_to == client.instance_id  # sent: from here on its outcome is the daemon's
        delay = rng.choice((0.0, rng.uniform(0.0, 0.05), rng.uniform(0.05, 0.8), rng.uniform(0.05, 0.8)))
        time.sleep(delay)
        family = descendants(daemon_pid)  # its shells and what they run, orphaned by the kill
        os.kill(daemon_pid, signal.SIGKILL)
        with pytest.raises(P.RunnerError) as lost:
            client.wait(call, 30)
        assert lost.value.code == P.RUNNER_RESTARTED, (seed, round_, delay, lost.value)
        assert "outcome of this command is unknown" in lost.value.message

        # The next command works, on a new daemon, in the last folder, with fresh variables.
        after = shell.run("echo \"[$GONE] $PWD\"")
        assert after["output"] == f"[] {folder}\n", (seed, round_, after)
        assert client.restarts == round_ + 1 and provider.daemon_pid != daemon_pid

        # Whatever the orphans still do, the new daemon never ran the command again.
        orphans_left += reap(family, wait=3.0)
        runs = _lines(effects.read_text()) if effects.exists() else []
        assert runs.count(f"start-{round_}") <= 1, (seed, round_, delay, runs)
        finished_anyway += runs.count(f"end-{round_}")
        print(f"[faults] round {round_}: killed after {delay * 1000:.0f} ms; started "
              f"{runs.count(f'start-{round_}')}x, finished by the orphaned shell {runs.count(f'end-{round_}')}x")

    runs = _lines(effects.read_text())
    for round_ in range(ROUNDS):
        assert runs.count(f"start-{round_}") <= 1 and runs.count(f"end-{round_}") <= 1, (seed, runs)
    print(f"[faults] seed={seed}: {ROUNDS} daemon kills; orphaned processes still alive 3 s after the kill: "
          f"{len(orphans_left)}; commands finished by an orphaned shell: {finished_anyway}")


def _wait_for_stream(kernel: KernelSession, msg_id: str, needle: str, timeout: float = 30) -> None:
    kernel.wait_for(lambda m: m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream"
                    and needle in m["content"]["text"], timeout, repr(needle))


@pytest.mark.timeout(300)
def test_kill_9_of_the_daemon_during_a_cell(tmp_path: Path) -> None:
    seed = seed_from_env(SEED + 1)
    rng = random.Random(seed)
    effects = tmp_path / "effects.txt"
    kernel = KernelSession(tmp_path)
    orphans: list[int] = []
    try:
        for round_ in range(KERNEL_ROUNDS):
            folder = tmp_path / f"deep{round_}"
            setup = kernel.run(f"mkdir -p {folder} && cd {folder} && export GONE=1; echo $PPID $$")
            assert setup.status == "ok", setup.outputs
            daemon_pid, shell_pid = map(int, setup.text().split()[-2:])
            msg_id = kernel.send(f"echo {round_} >> {effects}; echo started; "
                                 "for i in $(seq 1 200); do echo tick-$i; sleep 0.05; done")
            _wait_for_stream(kernel, msg_id, "started")
            time.sleep(rng.uniform(0.0, 1.0))
            family = [shell_pid, *descendants(shell_pid)]
            os.kill(daemon_pid, signal.SIGKILL)  # the sandbox goes away mid-command
            run = kernel.collect(msg_id)
            assert run.status == "error", (seed, round_, run.outputs)
            assert run.error["ename"] == "SandboxRestarted", (seed, round_, run.error)
            assert "outcome of this command is unknown" in run.error["evalue"]

            after = kernel.run("echo \"[$GONE] $PWD $PPID\"")
            assert after.status == "ok", (seed, round_, after.outputs)
            gone, pwd, new_daemon = after.text().split()
            assert (gone, pwd) == ("[]", str(folder)) and int(new_daemon) != daemon_pid, (seed, round_, after.text())
            orphans += reap(family, wait=3.0)
            assert _lines(effects.read_text()).count(str(round_)) == 1, (seed, round_, effects.read_text())
        print(f"[faults] seed={seed}: {KERNEL_ROUNDS} daemon kills during cells; orphaned processes that had "
              f"to be killed: {len(orphans)}")
    finally:
        kernel.close()


def test_nothing_the_killed_daemon_started_outlives_destroy(zipapp: Path, workspace: Path) -> None:
    provider = LocalProvider(cwd=workspace, runner_path=zipapp, relay_silence_seconds=0)
    provider.create()
    client = RunnerClient(provider.open_runner, ping_seconds=0.5, reconnect_timeout=20)
    family: list[int] = []
    try:
        client.connect()
        shell_pid = int(client.call("shell.run", {"command": "echo $$"}, timeout=30)["output"])
        call = client.start_call("shell.run", {"command": "sleep 30"})
        wait_until(lambda: descendants(shell_pid), 10, "`sleep 30` to start under the shell", interval=0.01)
        family = [shell_pid, *descendants(shell_pid)]
        os.kill(provider.daemon_pid, signal.SIGKILL)
        with pytest.raises(P.RunnerError):
            client.wait(call, 30)
        assert client.call("shell.run", {"command": "echo back"}, timeout=30)["output"] == "back\n"
        client.close()
        provider.destroy()
        left = wait_gone(family, 3)
        assert not left, f"still running after destroy(): {left}"
    finally:
        client.close()
        provider.destroy()
        reap(family, wait=0)


def test_a_daemon_that_never_answers_fails_the_command_instead_of_hanging(local_box) -> None:
    """A stopped daemon (SIGSTOP: alive, silent) must not hang `owsandbox run` for ever: past the
    command's own timeout and a grace, the executor says it got no answer and the command may still run."""
    provider, client = local_box
    shell = RunnerExecutor(client, answer_grace=0.5)
    assert shell.run("echo ready", timeout=10)["output"] == "ready\n"
    os.kill(provider.daemon_pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        result = shell.run("echo lost", timeout=0.5)
        waited = time.monotonic() - started
    finally:
        os.kill(provider.daemon_pid, signal.SIGCONT)
    assert result["exit_code"] is None and result["output"] == ""
    assert "did not answer within 1 s" in result["error"] and "may still be running on shell 'main'" in result["error"]
    assert waited < 10, waited
