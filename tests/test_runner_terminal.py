"""Commands with a terminal, through the real daemon on every provider: programs see a tty, a read of
the terminal is reported with its prompt and answered with `shell.input`, and with no one to answer
it gets end-of-input at once (never a hang)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from owsandbox import protocol as P
from owsandbox.box.shell.terminal import EOF_NOTE

UNBUFFERED_OFF = "unset PYTHONUNBUFFERED; "  # as on a user's machine: Python buffers on a pipe


def run(client: Any, command: str, answers: list[str | None] | None = None, watch: Any = None,
        **params: Any) -> tuple[dict, list]:
    """Run `command` with a terminal; answer each `shell.input_wanted` with the next of `answers`
    (None: end-of-input); hand each notification to `watch` as well. Returns the result and the
    notifications with their arrival times."""
    started = time.monotonic()
    seen: list[tuple[float, dict]] = []
    queue = list(answers or [])
    typing: list[threading.Thread] = []
    failed: list[BaseException] = []

    def answer(body: dict) -> None:
        try:
            client.call("shell.input", body, timeout=30)
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's own thread
            failed.append(exc)

    def on_notification(frame: dict) -> None:
        seen.append((time.monotonic() - started, frame))
        if watch is not None:
            watch(frame)
        if frame.get("method") == "shell.input_wanted":
            given = queue.pop(0)
            body = {"shell": "main", "eof": True} if given is None else {"shell": "main", "text": given}
            typing.append(threading.Thread(target=answer, args=(body,), daemon=True))
            typing[-1].start()

    body = {"command": command, "terminal": True, "stdin": answers is not None, **params}
    result = client.call("shell.run", body, timeout=60, on_notification=on_notification)
    for thread in typing:  # each answer's own call is over before the box may be closed
        thread.join(30)
    assert not failed, failed
    return result, seen


def wanted(seen: list) -> list[dict]:
    return [{k: v for k, v in frame.items() if k != "method"} for _, frame in seen
            if frame.get("method") == "shell.input_wanted"]


def test_programs_see_a_terminal_with_notebook_settings(box):
    _, client = box
    result, _ = run(client, "test -t 0 && test -t 1 && test -t 2 && echo all-ttys; echo \"$TERM $COLUMNS\"; "
                            "stty size; printf 'a\\nb\\n' | od -c | head -1")
    assert result["output"].splitlines()[:3] == ["all-ttys", "xterm-256color 120", "50 120"]
    assert "\\r" not in result["output"]  # no \r\n translation
    narrow, _ = run(client, "stty size; echo $COLUMNS", cols=60, rows=20)
    assert narrow["output"] == "20 60\n60\n"


def first_line_program(seen_one: Path) -> str:
    """A Python program that prints "one", then "two" once `seen_one` exists (the test makes it when it
    has seen "one"), or, after 20 s without it, "one was never seen"."""
    return (f"import os, time\nprint('one')\nend = time.monotonic() + 20\n"
            f"while not os.path.exists({str(seen_one)!r}) and time.monotonic() < end:\n    time.sleep(0.02)\n"
            f"print('two' if os.path.exists({str(seen_one)!r}) else 'one was never seen')\n")


def test_a_python_program_shows_its_first_line_at_once(box, workspace):
    """The program prints its second line only once the test has seen the first: a Python that held
    "one" back (as it does on a pipe) waits in vain and says so."""
    _, client = box
    seen_one = workspace / "seen-one"

    def watch(frame: dict) -> None:
        if frame.get("method") == "shell.output" and "one" in frame.get("text", ""):
            seen_one.touch()

    (workspace / "first_line.py").write_text(first_line_program(seen_one))
    result, seen = run(client, UNBUFFERED_OFF + f"python3 {workspace / 'first_line.py'}", watch=watch)
    assert result["output"] == "one\ntwo\n", seen


def test_a_prompt_is_reported_and_answered(box):
    _, client = box
    result, seen = run(client, "read -p 'Your name? ' n; echo \"hello $n\"", answers=["Ada"])
    assert wanted(seen) == [{"id": wanted(seen)[0]["id"], "shell": "main", "prompt": "Your name? ",
                             "password": False}]
    assert result["exit_code"] == 0 and result["output"].endswith("hello Ada\n")
    assert "Ada\nhello" not in result["output"]  # the echo of the answer is not output


def test_a_silent_read_asks_for_a_password(box):
    _, client = box
    result, seen = run(client, "read -s -p 'pw: ' p; echo \"${#p} chars\"", answers=["secret"])
    assert [w["password"] for w in wanted(seen)] == [True]
    assert result["output"].endswith("6 chars\n") and "secret" not in result["output"]


def test_two_reads_in_one_command_are_two_prompts(box):
    _, client = box
    result, seen = run(client, "python3 -c \"print(input('a? ')); print(input('b? '))\"", answers=["x", "y"])
    assert [w["prompt"] for w in wanted(seen)] == ["a? ", "b? "]
    assert result["output"].endswith("x\nb? y\n")


def test_a_prompt_that_reaches_the_terminal_after_the_read_began_is_the_one_asked(box):
    """What a reader prints just before it waits can reach the box's side of the terminal late (a busy
    machine's kernel worker hands it on); a thread printing it 0.1 s into the wait stands in for that."""
    _, client = box
    late = ("import sys, threading; threading.Timer(0.1, lambda: (sys.stdout.write('late? '), sys.stdout.flush()))"
            ".start(); print('got', input())")
    result, seen = run(client, f'python3 -c "{late}"', answers=["z"])
    assert [w["prompt"] for w in wanted(seen)] == ["late? "]
    assert result["output"].endswith("late? got z\n")


def test_end_of_input_answers_a_prompt(box):
    _, client = box
    result, _ = run(client, "cat; echo \"cat ended $?\"", answers=[None])
    assert result["output"].endswith("cat ended 0\n")


def test_with_no_one_to_answer_a_read_gets_end_of_input_and_a_note(box):
    _, client = box
    result, seen = run(client, "read -p 'Your name? ' n; echo \"got [$n]\"; python3 -c 'input()'; echo py $?")
    assert wanted(seen) == []
    assert EOF_NOTE in result["output"] and "got []\n" in result["output"]
    # stdout and stderr are two terminals, read as two queues: each stream is in order, not the two together
    # (on a busy machine python's traceback on stderr can come after the "py 1" printed after it ended).
    by_stream: dict[str, str] = {}
    position = 0
    for stream, length in result["segments"]:
        by_stream[stream] = by_stream.get(stream, "") + result["output"][position : position + length]
        position += length
    assert result["output"].count(EOF_NOTE) == 1 and by_stream["stdout"].endswith("got []\npy 1\n"), by_stream
    assert by_stream["stderr"].endswith("EOFError\n"), by_stream


def test_the_eof_note_is_a_note_of_the_runner_not_the_programs_stderr(box):
    _, client = box
    result, _ = run(client, "read -p 'Name? ' n; echo done")
    kinds = [stream for stream, _ in result["segments"]]
    assert "note" in kinds and result["output"].count(EOF_NOTE) == 1
    start = sum(length for _, length in result["segments"][: kinds.index("note")])
    assert result["output"][start : start + len(EOF_NOTE)] == EOF_NOTE


@pytest.mark.parametrize("terminal", [True, False])
def test_owdisplay_lines_become_display_records_where_they_are_born(box, workspace, terminal):
    _, client = box
    command = ": > pic.png; echo before; owdisplay pic.png --id fig; echo after"
    result = client.call("shell.run", {"command": command, "terminal": terminal}, timeout=60)
    output, position, parts = result["output"], 0, []
    for stream, length in result["segments"]:
        parts.append((stream, output[position : position + length]))
        position += length
    assert parts == [("stdout", "before\n"), ("display", f"\tfig\t{workspace}/pic.png\n"),
                     ("stdout", "after\n")]
    assert "\x1f" not in output  # no marker bytes reach a client


def test_stop_ends_a_command_waiting_at_a_prompt(box):
    _, client = box
    asked = threading.Event()
    call = client.start_call("shell.run", {"command": "read -p 'wait: ' x", "terminal": True, "stdin": True},
                             on_notification=lambda f: f.get("method") == "shell.input_wanted" and asked.set())
    assert asked.wait(20)
    client.call("shell.interrupt", {"shell": "main"})
    result = client.wait(call, 20)
    assert "interrupted" in result.get("error", "")
    assert run(client, "echo next")[0]["output"] == "next\n"


def test_input_for_a_shell_running_nothing_is_refused(box):
    _, client = box
    run(client, "true")
    try:
        client.call("shell.input", {"shell": "main", "text": "x"})
    except P.RunnerError as err:
        assert err.code == P.INVALID_PARAMS and "runs no command" in err.message
    else:
        raise AssertionError("input with no command running was accepted")


def test_merged_stderr_keeps_exact_order_and_pipes_keep_exact_bytes(box):
    _, client = box
    merged, _ = run(client, "for i in 1 2 3; do echo out $i; echo err $i >&2; done", stderr="merge")
    assert merged["output"] == "out 1\nerr 1\nout 2\nerr 2\nout 3\nerr 3\n"
    assert {stream for stream, _ in merged.get("segments") or [("stdout", 0)]} == {"stdout"}
    exact = client.call("shell.run", {"command": "head -c 30000 /dev/urandom > r.bin; base64 r.bin; "
                                      "sha256sum r.bin >&2", "terminal": False}, timeout=60)
    data = "".join(exact["output"].splitlines(keepends=True)[:-1])
    digest = exact["output"].splitlines()[-1].split()[0]
    import base64

    assert hashlib.sha256(base64.b64decode(data)).hexdigest() == digest
    back, _ = run(client, "test -t 1 && echo tty-again")
    assert back["output"] == "tty-again\n"


def test_the_python_repl_runs_through_prompts(box):
    """`python3` alone is a REPL with a line editor: it reads through prompts, its own echo of what was
    typed is not output, and a line editor's silent terminal is not taken for a password read."""
    _, client = box
    result, seen = run(client, "python3; echo \"repl ended $?\"", answers=["x = 6 * 7", "print(x)", None])
    assert result["output"].endswith("42\n>>> \nrepl ended 0\n"), result["output"]
    assert "x = 6 * 7" not in result["output"] and "print(x)" not in result["output"]
    assert len(wanted(seen)) == 3 and not any(w["password"] for w in wanted(seen))


# -- reads of the controlling terminal: /dev/tty, a dup, a re-open ----------------------------------

GETPASS = "python3 -c 'import getpass; print(len(getpass.getpass(\"Secret: \")))'"


def test_getpass_reads_dev_tty_and_is_asked_as_a_password(box):
    _, client = box
    result, seen = run(client, GETPASS, answers=["hunter2"])
    assert [(w["prompt"], w["password"]) for w in wanted(seen)] == [("Secret: ", True)]
    assert result["exit_code"] == 0 and result["output"].endswith("7\n"), result["output"]
    assert "hunter2" not in result["output"]


def test_getpass_with_no_one_to_answer_gets_end_of_input_and_fails_as_itself(box):
    _, client = box
    result, seen = run(client, GETPASS + "; echo \"getpass $?\"", timeout_s=30)
    assert wanted(seen) == [] and not result["timed_out"]
    assert result["output"].count(EOF_NOTE) == 1 and "EOFError" in result["output"]
    assert "getpass 1\n" in result["output"]


def test_dev_tty_a_descriptor_opened_from_it_and_the_terminal_opened_again_are_all_prompts(box):
    _, client = box
    command = ("read a </dev/tty; exec 3<>/dev/tty; read b <&3; exec 3<&-; read c <\"$(tty)\"; "
               "echo \"[$a $b $c]\"")
    result, seen = run(client, command, answers=["1", "2", "3"])
    assert len(wanted(seen)) == 3 and result["output"].endswith("[1 2 3]\n"), result["output"]
    unattended, _ = run(client, command, timeout_s=30)
    assert not unattended["timed_out"] and unattended["output"].endswith("[  ]\n")
    assert unattended["output"].count(EOF_NOTE) == 1


def test_a_select_on_dev_tty_alone_is_a_prompt_and_one_that_also_waits_on_a_socket_is_not(box):
    _, client = box
    alone = ("python3 -c 'import os, select; fd = os.open(\"/dev/tty\", os.O_RDONLY); os.dup2(fd, 9); "
             "select.select([9], [], []); print(os.read(9, 100))'")
    result, seen = run(client, alone, answers=["typed"])
    assert len(wanted(seen)) == 1 and result["output"].endswith("b'typed\\n'\n"), result["output"]
    with_socket = ("python3 -c 'import select, socket; a, b = socket.socketpair(); "
                   "print(select.select([0, a], [], [], 0.5)[0])'")
    result, seen = run(client, with_socket, answers=[])
    assert wanted(seen) == [] and result["output"] == "[]\n"  # waiting on the network too: not asking


def test_ssh_keygen_asks_for_its_passphrase_twice(box, workspace):
    if not shutil.which("ssh-keygen"):
        pytest.skip("ssh-keygen is not installed (openssh-client)")
    _, client = box
    result, seen = run(client, "ssh-keygen -q -t ed25519 -C test -f key && ssh-keygen -y -P 'pass phrase' -f key",
                       answers=["pass phrase", "pass phrase"])
    prompts = [(w["prompt"], w["password"]) for w in wanted(seen)]
    assert prompts == [("Enter passphrase (empty for no passphrase): ", True), ("Enter same passphrase again: ", True)]
    assert result["exit_code"] == 0 and "ssh-ed25519 " in result["output"], result["output"]
    assert "pass phrase" not in result["output"]


# -- whole lines, and bash's own words --------------------------------------------------------------

def test_a_line_of_one_stream_is_never_cut_by_the_other(box):
    """`ls` writes its error in pieces; two terminals are two queues: the other stream's line used to
    land between the pieces. 200 errors, each followed by a line on stdout."""
    _, client = box
    result, seen = run(client, "for i in $(seq 200); do ls /no-such-$i; echo out$i; done")
    frames = [frame for _, frame in seen if frame.get("method") == "shell.output"]
    for before, after in zip(frames, frames[1:], strict=False):
        if before["stream"] != after["stream"]:
            assert before["text"].endswith("\n"), (before, after)
    output, position, lines = result["output"], 0, []
    for stream, length in result["segments"]:
        assert output[position : position + length].endswith("\n")
        lines += [(stream, line) for line in output[position : position + length].splitlines()]
        position += length
    assert sorted(line for stream, line in lines if stream == "stderr") == sorted(
        f"ls: cannot access '/no-such-{i}': No such file or directory" for i in range(1, 201))
    assert [line for stream, line in lines if stream == "stdout"] == [f"out{i}" for i in range(1, 201)]


def parts(result: dict) -> list[tuple[str, str]]:
    output, position, found = result["output"], 0, []
    for stream, length in result["segments"]:
        found.append((stream, output[position : position + length]))
        position += length
    return found


def test_job_notices_are_notes_and_look_alikes_stay_stderr(box):
    _, client = box
    started = client.call("shell.run", {"command": "sleep 30 & echo \"job $!\"", "terminal": True}, timeout=60)
    pid = started["output"].split("job ")[1].split()[0]
    assert ("note", f"[1] {pid}\n") in parts(started) and "stderr" not in dict(parts(started))
    client.call("shell.run", {"command": "kill %1; wait", "terminal": True}, timeout=60)
    alike = client.call("shell.run", {"command": "echo '[1] 999' >&2; echo exit >&2; echo '[2]+  Done  x' >&2",
                                      "terminal": True}, timeout=60)
    assert parts(alike) == [("stderr", "[1] 999\nexit\n[2]+  Done  x\n")]
    reported = client.call("shell.run", {"command": "set -m; sleep 0.1 &\nsleep 0.5; echo after",
                                         "terminal": True}, timeout=60)
    client.call("shell.run", {"command": "set +m", "terminal": True}, timeout=60)
    notes = "".join(text for stream, text in parts(reported) if stream == "note")
    assert "[1]+  Done" in notes and "sleep 0.1" in notes and "stderr" not in dict(parts(reported)), parts(reported)
    # (the notice is told by the job it names while that job still runs: a reader far behind on a busy
    # machine sees the job reaped, and the notice then stays stderr; the pause keeps it running meanwhile)
    piped = client.call("shell.run", {"command": "sleep 30 & sleep 0.3; kill $!", "terminal": False}, timeout=60)
    assert [stream for stream, _ in parts(piped)] == ["note"]


def test_exit_echo_is_dropped_and_the_result_says_the_shell_exited(box):
    _, client = box
    result = client.call("shell.run", {"command": "echo bye; exit 3", "terminal": True}, timeout=60)
    assert result["output"] == "bye\n" and result["exit_code"] == 3
    assert "exited (status 3)" in result["error"]
    merged = client.call("shell.run", {"command": "exit 4", "terminal": True, "stderr": "merge"}, timeout=60)
    assert merged["output"] == "" and merged["exit_code"] == 4


_ASK_AS_PLAIN_USER = r"""
import json, sys, tempfile, threading
from pathlib import Path
from owsandbox.host.bundle import build_runner_zipapp
from owsandbox.host.client import RunnerClient
from owsandbox.host.providers.local import LocalProvider

folder = Path(tempfile.mkdtemp())
provider = LocalProvider(cwd=folder, runner_path=build_runner_zipapp(folder / "dist"), relay_silence_seconds=0)
provider.create()
client = RunnerClient(provider.open_runner)
wanted = []

def on_notification(frame):
    if frame.get("method") == "shell.input_wanted":
        wanted.append(frame)
        threading.Thread(target=client.call, args=("shell.input", {"shell": "main", "eof": True}), daemon=True).start()

try:
    client.connect()
    result = client.call("shell.run", {"command": sys.argv[1], "terminal": True, "stdin": True, "timeout_s": 30},
                         timeout=60, on_notification=on_notification)
    print(json.dumps({"wanted": wanted, "output": result["output"], "timed_out": result["timed_out"]}))
finally:
    client.close()
    provider.destroy()
"""


@pytest.mark.parametrize("command", ["su -c true; echo \"su $?\"", "sudo -k true; echo \"sudo $?\""])
def test_a_setuid_program_asking_a_plain_user_for_a_password_is_a_prompt(command):
    """su and sudo run as root while they read a plain user's password: the box may not look into
    them, and still takes their read for a password prompt (the terminal's echo is off)."""
    from .machine_lock import ensure_user
    from .plain_python import as_user, make_plain_python

    program = command.split()[0]
    if not shutil.which(program):
        pytest.skip(f"{program} is not installed")
    plain = make_plain_python()
    try:
        argv = [plain.python, "-c", _ASK_AS_PLAIN_USER, command]
        if os.getuid() == 0:
            argv = as_user(ensure_user("owsbx-prompted").pw_name, argv, plain.env)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/",
                              env={**os.environ, **plain.env})
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout.splitlines()[-1])
    finally:
        shutil.rmtree(plain.root, ignore_errors=True)
    assert not answer["timed_out"] and answer["wanted"], answer
    assert answer["wanted"][0]["password"] is True and "assword" in answer["wanted"][0]["prompt"]
    assert f"{program} 1\n" in answer["output"]
