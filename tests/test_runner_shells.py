"""Shells through the whole runner: zipapp daemon, relay, resumable client, executor."""

from __future__ import annotations

import hashlib
import re
import threading
import time

import pytest

from owsandbox import protocol as P
from owsandbox.host.executor import DirectExecutor, RunnerExecutor

from .processes import wait_for_file
from .waiting import patience, shell_waits_for, wait_until


def run_in_background(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}
    worker = threading.Thread(target=lambda: box.update(fn()))
    worker.start()
    return worker, box


def wait_until_busy(client, shell: str = "main", timeout: float | None = None) -> None:
    """Block until the daemon reports `shell` running a command (an event, not a guess)."""

    def busy() -> bool:
        shells = {s["name"]: s for s in client.call("shell.list", timeout=5)["shells"]}
        return bool(shells.get(shell, {}).get("busy"))

    wait_until(busy, patience(10) if timeout is None else timeout, f"shell {shell} to become busy", interval=0.01)


def test_shell_syntax_reaches_bash_unchanged(box, workspace):
    _, client = box
    ex = RunnerExecutor(client, cwd=str(workspace))
    assert ex.run("printf 'one\\ntwo\\nthree\\n'")["output"] == "one\ntwo\nthree\n"
    assert ex.run("printf 'b\\na\\nb\\n' > words.txt 2>&1")["output"] == ""
    assert ex.run("sort words.txt | uniq -c | sort -rn | head -1")["output"].split() == ["2", "b"]
    ex.run("cat > doc.md <<'END'\n# Title\nsaid \"hi\" and 'bye' $HOME\nEND")
    assert (workspace / "doc.md").read_text() == "# Title\nsaid \"hi\" and 'bye' $HOME\n"
    assert ex.run("echo 'it''s' \"$((6 * 7))\" ☃")["output"] == "its 42 ☃\n"


def test_hello_describes_the_runner(box):
    _, client = box
    hello = client.hello
    assert hello["protocol_version"] == P.PROTOCOL_VERSION
    assert hello["instance_id"] == client.instance_id
    assert hello["os"].startswith("Linux") and hello["shell"].startswith("bash ")
    assert hello["pid"] > 0 and hello["python"] and hello["machine"]


def test_another_protocol_version_is_refused(box):
    _, client = box
    with pytest.raises(P.RunnerError) as err:
        client.call("runner.hello", {"protocol_version": 2}, timeout=10)
    assert err.value.code == P.VERSION_MISMATCH
    assert "protocol version 1" in err.value.message


def test_runner_and_direct_executors_give_equal_results(box, workspace):
    _, client = box
    direct = DirectExecutor(str(workspace))
    try:
        for command in ("echo out; sleep 0.05; echo err >&2; false", "cd /; pwd", "printf 'no newline'"):
            assert RunnerExecutor(client, cwd=str(workspace)).run(command) == direct.run(command)
    finally:
        direct.close()


def test_each_named_shell_has_its_own_folder_and_variables(box, workspace):
    _, client = box
    (workspace / "left").mkdir()
    (workspace / "right").mkdir()
    a = RunnerExecutor(client, cwd=str(workspace), shell="a")
    b = RunnerExecutor(client, cwd=str(workspace), shell="b")
    a.run("cd left; export SIDE=L")
    b.run("cd right; export SIDE=R")
    assert a.run("echo $SIDE ${PWD##*/}")["output"] == "L left\n"
    assert b.run("echo $SIDE ${PWD##*/}")["output"] == "R right\n"
    names = [s["name"] for s in client.call("shell.list", timeout=5)["shells"]]
    assert names == ["a", "b"]


def test_the_status_carries_over_to_the_next_command(box, workspace):
    """As in a terminal: `$?` in one command is what the one before left."""
    _, client = box
    ex = RunnerExecutor(client, cwd=str(workspace), shell="status")
    assert ex.run("true; echo $?")["output"] == "0\n"
    seven = ex.run("sh -c 'exit 7'")
    assert seven["exit_code"] == 7 and seven["outcome"] == "exit"
    assert ex.run("echo $?")["output"] == "7\n"
    assert ex.run("echo $?")["output"] == "0\n"  # the echo before succeeded
    ended = ex.run("set -e; sh -c 'exit 3'")  # errexit ends that shell, as it would in a terminal
    assert ended["exit_code"] == 3 and ended["outcome"] == "shell_exited" and "exited" in ended["error"]
    assert ex.run("echo $? alive")["output"] == "0 alive\n"  # a new shell starts from 0


def test_a_failed_status_given_back_does_not_trip_errexit(box, workspace):
    """`set -e` acts on what the command runs, not on the status the previous command left."""
    _, client = box
    ex = RunnerExecutor(client, cwd=str(workspace), shell="errexit")
    assert ex.run("set -e")["exit_code"] == 0
    assert ex.run("false || echo handled")["output"] == "handled\n"
    assert ex.run("echo $? still here")["output"] == "0 still here\n"
    assert ex.run("(exit 4) || echo $?")["output"] == "4\n"
    assert ex.run("! false")["exit_code"] == 0


def test_what_a_background_job_prints_between_commands_opens_the_next_output(box, workspace):
    """Nothing printed is thrown away: with no command running, it waits for the next one."""
    _, client = box
    ex = RunnerExecutor(client, cwd=str(workspace), shell="between")
    started = ex.run("(sleep 0.2; echo late; echo late-err >&2; touch printed) &")
    assert started["exit_code"] == 0 and re.fullmatch(r"\[1\] \d+\n", started["output"])  # as bash -i says
    wait_for_file(workspace / "printed")
    after = client.call("shell.run", {"shell": "between", "command": "echo now"}, timeout=30)
    assert after["output"] == "late\nlate-err\nnow\n" and after["exit_code"] == 0
    assert [segment[0] for segment in after["segments"]] == ["stdout", "stderr", "stdout"]
    assert ex.run("echo again")["output"] == "again\n"  # handed over once


def test_a_flood_between_commands_keeps_the_latest_and_says_what_was_dropped(box, workspace):
    _, client = box
    ex = RunnerExecutor(client, cwd=str(workspace), shell="flood")
    ex.run("(sleep 0.2; seq 1 100000; touch flooded) &")  # 588,895 bytes
    wait_for_file(workspace / "flooded")
    output = ex.run("echo now")["output"]
    assert "earlier bytes printed by background jobs between commands were dropped" in output
    assert len(output) < 200_000 and output.endswith("99999\n100000\nnow\n")
    kept = output.split("the latest follow]\n", 1)[1].splitlines()[:-1]
    first = int(kept[1])  # kept[0] may be the end of a line cut by a read
    assert kept[1:] == [str(n) for n in range(first, 100001)]


def test_a_busy_shell_never_holds_up_another(box, workspace):
    _, client = box
    slow = RunnerExecutor(client, cwd=str(workspace), shell="slow")
    go = workspace / "slow-may-finish"
    worker, _ = run_in_background(lambda: slow.run(shell_waits_for(go)))
    wait_until_busy(client, "slow")
    # The slow shell runs until the test lets it finish, so the fast one's answer came while it ran.
    try:
        assert RunnerExecutor(client, cwd=str(workspace), shell="fast").run("echo quick")["output"] == "quick\n"
        assert worker.is_alive()  # the slow one is still going
    finally:
        go.touch()
        worker.join()


def test_a_shell_takes_one_command_at_a_time(box, workspace):
    _, client = box
    ex = RunnerExecutor(client, cwd=str(workspace))
    worker, first = run_in_background(lambda: ex.run("sleep 1; echo first"))
    wait_until_busy(client)
    with pytest.raises(P.RunnerError) as err:
        client.call("shell.run", {"shell": "main", "command": "echo second"}, timeout=10)
    assert err.value.code == P.SHELL_BUSY and "running another command" in err.value.message
    second = ex.run("echo second")
    worker.join()
    assert first["output"] == "first\n"
    assert second["exit_code"] is None and "running another command" in second["error"]


def test_live_frames_are_a_view_and_the_result_is_the_record(box, workspace):
    _, client = box
    frames: list[dict] = []
    quick = client.call("shell.run", {"command": "echo instant"}, timeout=10, on_notification=frames.append)
    # Most often too quick for the live view (its first frame waits a moment for more); on a loaded
    # machine the end may come after that moment, and then the view shows the same text.
    assert quick["output"] == "instant\n" and "".join(f["text"] for f in frames) in ("", "instant\n"), frames
    frames.clear()
    slow = client.call("shell.run", {"command": "for i in 1 2 3; do echo tick $i; sleep 0.3; done"},
                       timeout=10, on_notification=frames.append)
    assert "tick 1" in frames[0]["text"] and frames[0]["method"] == "shell.output"
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
    assert slow["output"] == "tick 1\ntick 2\ntick 3\n"


def test_live_frames_keep_stdout_and_stderr_apart_and_the_record_keeps_their_order(box):
    _, client = box
    frames: list[dict] = []
    command = "echo out-1; sleep 0.2; echo err-1 >&2; sleep 0.2; echo out-2; sleep 0.2"
    result = client.call("shell.run", {"command": command}, timeout=10, on_notification=frames.append)
    assert [(f["stream"], f["text"]) for f in frames] == [
        ("stdout", "out-1\n"), ("stderr", "err-1\n"), ("stdout", "out-2\n")]
    assert [f["offset"] for f in frames] == [0, 6, 12]
    assert result["output"] == "out-1\nerr-1\nout-2\n"
    assert result["segments"] == [["stdout", 6], ["stderr", 6], ["stdout", 6]]


def test_stop_ends_the_command_and_keeps_folder_and_variables(box, workspace):
    _, client = box
    (workspace / "inner").mkdir()
    ex = RunnerExecutor(client, cwd=str(workspace))
    ex.run("cd inner; export KEPT=yes; LOCAL=also")
    for command in ("sleep 30", "while true; do :; done", "python3 -c 'import time; time.sleep(30)'"):
        worker, box_ = run_in_background(lambda c=command: ex.run(c))
        wait_until_busy(client)
        assert ex.interrupt_now() is True
        worker.join(10)  # each would run 30 s or for ever: ended by Stop, long before (the time: benchmarks)
        assert not worker.is_alive(), command
        assert box_["error"] == "interrupted by user"
        assert box_["exit_code"] != 0  # 130 from bash; a Python program chooses its own status
    assert ex.run("echo $KEPT $LOCAL ${PWD##*/}")["output"] == "yes also inner\n"
    assert ex.interrupt_now() is False  # nothing running


def test_stop_reaches_a_program_that_ignores_sigint(box):
    _, client = box
    ex = RunnerExecutor(client)
    ex.run("export STILL=here")
    worker, result = run_in_background(lambda: ex.run("trap '' INT; sleep 30"))
    wait_until_busy(client)
    ex.interrupt_now()
    worker.join(15)
    assert result["error"].startswith("interrupted by user") and result["outcome"] == "interrupt"
    assert ex.run("echo ok")["output"] == "ok\n"


def test_a_timeout_stops_the_command_and_keeps_the_shell(box):
    _, client = box
    ex = RunnerExecutor(client)
    ex.run("export SURVIVES=1")
    started = time.monotonic()
    timed = ex.run("echo before; sleep 30", timeout=0.5)
    assert time.monotonic() - started < patience(5)
    assert timed["timed_out"] is True and timed["error"] == "timed out after 0.5 s" and timed["outcome"] == "timeout"
    assert timed["output"].startswith("before\n")
    assert ex.run("echo $SURVIVES")["output"] == "1\n"


def test_a_command_cannot_wait_on_a_prompt(box):
    _, client = box
    ex = RunnerExecutor(client)
    started = time.monotonic()
    answer = ex.run("read -r reply; echo status=$?; cat; echo cat-done; [ -t 0 ] || echo not-a-terminal")
    assert answer["output"] == "status=1\ncat-done\nnot-a-terminal\n"
    assert time.monotonic() - started < patience(5)


def test_a_command_that_hides_its_output_still_finishes(box):
    _, client = box
    ex = RunnerExecutor(client)
    hidden = ex.run("exec >/dev/null 2>&1; echo gone")
    assert hidden["exit_code"] == 0 and hidden["output"] == ""
    assert ex.run("echo still-here >&2")["output"] == ""  # this shell's output stays hidden, as asked
    client.call("shell.close", {"shell": "main"}, timeout=10)
    assert ex.run("echo fresh")["output"] == "fresh\n"


def test_exit_ends_the_shell_and_the_next_command_gets_a_new_one_in_the_same_folder(box, workspace):
    _, client = box
    (workspace / "here").mkdir()
    ex = RunnerExecutor(client, cwd=str(workspace))
    ex.run("cd here; export GONE=1")
    ended = ex.run("exit 3")
    assert ended["exit_code"] == 3 and ended["outcome"] == "shell_exited"
    assert ended["error"] == (f"the shell 'main' exited (status 3); the next command starts a new shell in "
                              f"{workspace / 'here'} (variables are gone)")
    assert ex.run("echo [$GONE] ${PWD##*/}")["output"] == "[] here\n"


@pytest.mark.parametrize("box", ["local", "bwrap"], indirect=True)  # a race in the daemon: the same behind any relay
def test_a_shell_that_ends_with_its_command_never_holds_up_the_next(box, workspace):
    """bash can read a command, end (`set -e; false`) and be reaped while the daemon is still handing it
    the line: the command's answer says the shell exited and the next command gets a new shell, every
    time (once in a few hundred, the daemon stopped reading its client there)."""
    _, client = box
    (workspace / "here").mkdir()
    ex = RunnerExecutor(client, cwd=str(workspace))
    for attempt in range(400):
        ex.run("cd here")
        ended = ex.run("set -e; false", timeout=20)
        assert ended["outcome"] == "shell_exited", (attempt, ended)
        again = ex.run("echo ${PWD##*/}", timeout=20)
        assert again["output"] == "here\n", (attempt, again)
        ex.run("cd ..")


@pytest.mark.parametrize("box", ["local"], indirect=True)  # the daemon's own threads: the same behind any relay
def test_a_timeout_holds_no_thread_once_its_command_has_ended(box):
    """A command's timeout is a timer thread in the daemon; one left waiting out its hour after the command
    ended would pile up cell by cell until the box's process limit refused the next thread."""
    _, client = box
    ex = RunnerExecutor(client)
    threads = "ls /proc/$PPID/task | wc -l"  # the shell's parent is the daemon
    before = int(ex.run(threads)["output"])
    for _ in range(60):
        assert ex.run("true", timeout=3600)["exit_code"] == 0
    assert int(ex.run(threads)["output"]) <= before + 5  # a cancelled timer's thread may take a moment to go


def test_bytes_that_are_not_utf8_do_not_break_frames(box):
    _, client = box
    frames: list[dict] = []
    result = client.call("shell.run", {"command": "printf 'ok \\377\\376 done\\n'; sleep 0.3; printf '\\200\\n' >&2"},
                         timeout=10, on_notification=frames.append)
    assert result["output"] == "ok \ufffd\ufffd done\n\ufffd\n"
    assert frames and frames[0]["text"] == "ok \ufffd\ufffd done\n"
    assert RunnerExecutor(client).run("echo next")["output"] == "next\n"


def test_output_past_the_cap_goes_to_a_log_and_the_result_says_where(box):
    _, client = box
    result = client.call("shell.run", {"command": "seq 1 400000"}, timeout=60)
    expected = "".join(f"{i}\n" for i in range(1, 400001))
    assert result["truncated"] is True and result["output_bytes"] == len(expected)
    # The log is in the sandbox (a bubblewrap box keeps it in a folder of its own): read it there.
    digest = client.call("shell.run", {"command": f"sha256sum < {result['log_path']}"}, timeout=60)["output"]
    assert digest.split()[0] == hashlib.sha256(expected.encode()).hexdigest()
    cap = client.hello["output_limit"]
    assert len(result["output"]) < cap + 500
    assert result["output"].startswith("1\n2\n3\n") and result["output"].endswith("399999\n400000\n")
    assert result["log_path"] in result["output"]  # the notice names the log


@pytest.mark.parametrize("box", ["local"], indirect=True)  # the daemon's own timer: the same behind any relay
def test_a_silent_command_still_sends_progress(box, monkeypatch):
    """`shell.progress` tells the client a quiet command is alive: elapsed time and bytes so far."""
    _, client = box
    seen: list[dict] = []
    result = client.call("shell.run", {"command": "echo begun; sleep 5.8"}, timeout=30, on_notification=seen.append)
    progress = [f for f in seen if f["method"] == "shell.progress"]
    assert result["exit_code"] == 0 and len(progress) == 1
    assert progress[0]["elapsed_s"] >= 5 and progress[0]["output_bytes"] == len("begun\n")
    assert [f["method"] for f in seen][0] == "shell.output"


def test_waiting_for_a_killed_job_prints_no_terminal_noise(box):
    _, client = box
    ex = RunnerExecutor(client)
    started = ex.run("sleep 300 &")
    assert re.fullmatch(r"\[1\] \d+\n", started["output"])  # as a terminal shows it
    assert ex.run("kill $!; wait $!; echo status=$?")["output"] == "status=143\n"
