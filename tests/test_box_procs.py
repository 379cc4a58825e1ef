"""Unit tests of the runner's one-shot commands (`owsandbox.box.procs`), with real processes."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from owsandbox.box.procs import HANDLERS, KILL_GRACE_S, OUTPUT_CAP_BYTES, PIPE_GRACE_S, proc_run
from owsandbox.protocol import FS_ERROR, INVALID_PARAMS, RunnerError

from .waiting import patience, wait_until

PY = sys.executable


def run(base: Path, **params: Any) -> dict[str, Any]:
    return proc_run(params, str(base))


def python(code: str) -> list[str]:
    return [PY, "-c", code]


def fails(code: int, params: dict[str, Any], base: Path) -> str:
    with pytest.raises(RunnerError) as caught:
        proc_run(params, str(base))
    assert caught.value.code == code, caught.value.message
    return caught.value.message


def is_running(pid: int) -> bool:
    """True while `pid` is a live process (a zombie waiting to be reaped counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read()
    except FileNotFoundError:
        return False
    return fields.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_for_pid_file(path: Path) -> int:
    return int(wait_until(lambda: path.exists() and path.read_text().strip(), 2, f"a pid written to {path}",
                          interval=0.01))


@pytest.mark.unit
def test_handlers_table() -> None:
    assert HANDLERS == {"proc.run": proc_run}


def test_returns_exit_code_and_separate_streams(tmp_path: Path) -> None:
    answer = run(tmp_path, argv=["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert answer["exit_code"] == 3
    assert (answer["stdout"], answer["stderr"]) == ("out\n", "err\n")
    assert answer["timed_out"] is False
    assert (answer["stdout_truncated"], answer["stderr_truncated"]) == (False, False)
    assert isinstance(answer["duration_ms"], int)


def test_argv_is_not_expanded_by_a_shell(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("")
    answer = run(tmp_path, argv=["echo", "$HOME", "*", "a;b", "`id`", "x|y"])
    assert answer["stdout"] == "$HOME * a;b `id` x|y\n"


def test_stdin_is_dev_null_by_default_not_our_own_stdin(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()  # our stdin becomes a pipe that never ends
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        answer = run(tmp_path, argv=["sh", "-c", "readlink /proc/self/fd/0; cat"], timeout_s=5)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert (answer["stdout"], answer["timed_out"]) == ("/dev/null\n", False)


def test_stdin_text_is_fed_to_the_command(tmp_path: Path) -> None:
    answer = run(tmp_path, argv=["cat"], stdin="héllo\nworld")
    assert answer["stdout"] == "héllo\nworld"


def test_large_stdin_and_stdout_flow_without_deadlock(tmp_path: Path) -> None:
    text = "0123456789abcdef\n" * 200_000  # 3.4 MB each way, far more than a pipe buffer
    answer = run(tmp_path, argv=["cat"], stdin=text, timeout_s=30)
    assert (answer["stdout"] == text, answer["timed_out"]) == (True, False)


def test_command_that_ignores_stdin_still_finishes(tmp_path: Path) -> None:
    answer = run(tmp_path, argv=["true"], stdin="x" * (4 * 1024 * 1024), timeout_s=10)
    assert (answer["exit_code"], answer["timed_out"]) == (0, False)


def test_env_is_merged_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OWS_INHERITED", "from-parent")
    answer = run(tmp_path, argv=["sh", "-c", 'printf "%s|%s" "$OWS_INHERITED" "$OWS_GIVEN"'],
                 env={"OWS_GIVEN": "given value"})
    assert answer["stdout"] == "from-parent|given value"


def test_env_overrides_inherited_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OWS_VAR", "old")
    answer = run(tmp_path, argv=["sh", "-c", 'printf %s "$OWS_VAR"'], env={"OWS_VAR": "new"})
    assert answer["stdout"] == "new"
    assert os.environ["OWS_VAR"] == "old"


def test_cwd_defaults_to_base(tmp_path: Path) -> None:
    assert run(tmp_path, argv=["pwd", "-P"])["stdout"] == f"{tmp_path.resolve()}\n"


def test_relative_cwd_resolves_against_base(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    assert run(tmp_path, argv=["pwd", "-P"], cwd="sub")["stdout"] == f"{(tmp_path / 'sub').resolve()}\n"


@pytest.mark.unit
def test_missing_cwd_is_an_fs_error_naming_it(tmp_path: Path) -> None:
    message = fails(FS_ERROR, {"argv": ["true"], "cwd": "nope"}, tmp_path)
    assert str(tmp_path / "nope") in message


def test_command_runs_in_its_own_session(tmp_path: Path) -> None:
    answer = run(tmp_path, argv=python("import os; print(os.getsid(0) == os.getpid(), os.getsid(0))"))
    leads, session = answer["stdout"].split()
    assert leads == "True"
    assert int(session) != os.getsid(0)


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    limit = patience(0.5)  # time for sh to start its job and write the pid first, on a busy machine too
    started = time.monotonic()
    answer = run(tmp_path, argv=["sh", "-c", f"sleep 30 & echo $! > {pid_file}; sleep 30"], timeout_s=limit)
    elapsed = time.monotonic() - started
    assert answer["timed_out"] is True
    assert answer["exit_code"] == -signal.SIGTERM
    assert elapsed < limit + KILL_GRACE_S  # SIGTERM reached the grandchild too: no SIGKILL needed
    assert limit * 1000 <= answer["duration_ms"] < limit * 1000 + 4500
    assert not is_running(wait_for_pid_file(pid_file))


def test_timeout_does_not_wait_for_the_grace_when_sigterm_is_obeyed(tmp_path: Path) -> None:
    limit = patience(0.3)
    started = time.monotonic()
    answer = run(tmp_path, argv=["sleep", "30"], timeout_s=limit)
    assert (answer["timed_out"], answer["exit_code"]) == (True, -signal.SIGTERM)
    assert time.monotonic() - started < limit + KILL_GRACE_S


def test_timeout_on_plain_background_and_foreground_sleeps(tmp_path: Path) -> None:
    started = time.monotonic()
    answer = run(tmp_path, argv=["sh", "-c", "sleep 30 & sleep 30"], timeout_s=0.3)
    assert answer["timed_out"] is True
    assert time.monotonic() - started < 5


def test_timeout_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path) -> None:
    limit = patience(0.5)  # time for sh to set its trap first, on a busy machine too
    started = time.monotonic()
    answer = run(tmp_path, argv=["sh", "-c", "trap '' TERM; echo ready; sleep 30"], timeout_s=limit)
    elapsed = time.monotonic() - started
    assert (answer["timed_out"], answer["exit_code"]) == (True, -signal.SIGKILL)
    assert answer["stdout"] == "ready\n"
    assert limit + KILL_GRACE_S - 0.1 <= elapsed < limit + KILL_GRACE_S + PIPE_GRACE_S + 1


def test_output_before_timeout_is_kept(tmp_path: Path) -> None:
    answer = run(tmp_path, argv=["sh", "-c", "echo partial; echo oops >&2; sleep 30"], timeout_s=patience(0.5))
    assert (answer["stdout"], answer["stderr"], answer["timed_out"]) == ("partial\n", "oops\n", True)


def test_fast_command_with_timeout_is_not_timed_out(tmp_path: Path) -> None:
    answer = run(tmp_path, argv=["sh", "-c", "sleep 0.2; echo done"], timeout_s=10)
    assert (answer["stdout"], answer["timed_out"], answer["exit_code"]) == ("done\n", False, 0)
    assert answer["duration_ms"] >= 200


def test_background_child_holding_the_pipe_does_not_block_the_answer(tmp_path: Path) -> None:
    started = time.monotonic()
    answer = run(tmp_path, argv=["sh", "-c", "sleep 30 & echo $!"])
    elapsed = time.monotonic() - started
    background = int(answer["stdout"])
    try:
        assert (answer["exit_code"], answer["timed_out"]) == (0, False)
        assert elapsed < PIPE_GRACE_S + 2
    finally:
        os.kill(background, signal.SIGKILL)


def test_stdout_is_capped_and_flagged(tmp_path: Path) -> None:
    code = f"import sys; sys.stdout.write('a' * {OUTPUT_CAP_BYTES + 100_000}); sys.stderr.write('small')"
    answer = run(tmp_path, argv=python(code), timeout_s=30)
    assert answer["exit_code"] == 0
    assert (len(answer["stdout"]), answer["stdout_truncated"]) == (OUTPUT_CAP_BYTES, True)
    assert (answer["stderr"], answer["stderr_truncated"]) == ("small", False)


def test_stderr_is_capped_and_flagged(tmp_path: Path) -> None:
    code = f"import sys; sys.stderr.write('e' * {2 * OUTPUT_CAP_BYTES}); print('fine')"
    answer = run(tmp_path, argv=python(code), timeout_s=30)
    assert (len(answer["stderr"]), answer["stderr_truncated"]) == (OUTPUT_CAP_BYTES, True)
    assert (answer["stdout"], answer["stdout_truncated"], answer["exit_code"]) == ("fine\n", False, 0)


def test_output_of_exactly_the_cap_is_not_truncated(tmp_path: Path) -> None:
    answer = run(tmp_path, argv=python(f"import sys; sys.stdout.write('b' * {OUTPUT_CAP_BYTES})"))
    assert (len(answer["stdout"]), answer["stdout_truncated"]) == (OUTPUT_CAP_BYTES, False)


def test_invalid_utf8_output_is_replaced(tmp_path: Path) -> None:
    answer = run(tmp_path, argv=python(r"import sys; sys.stdout.buffer.write(b'ok \xff\xfe \xc3\xa9')"))
    assert answer["stdout"] == "ok \ufffd\ufffd \u00e9"


def test_exit_by_signal_gives_negative_exit_code(tmp_path: Path) -> None:
    assert run(tmp_path, argv=["sh", "-c", "kill -KILL $$"])["exit_code"] == -signal.SIGKILL


def test_missing_program_is_an_fs_error_naming_it(tmp_path: Path) -> None:
    message = fails(FS_ERROR, {"argv": ["no-such-program-ows"]}, tmp_path)
    assert message == "cannot run 'no-such-program-ows': No such file or directory"


def test_non_executable_program_is_an_fs_error(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    message = fails(FS_ERROR, {"argv": ["./script.sh"]}, tmp_path)
    assert message == "cannot run './script.sh': Permission denied"


@pytest.mark.unit
@pytest.mark.parametrize(("params", "name"), [
    ({}, "argv"),
    ({"argv": []}, "argv"),
    ({"argv": "ls -l"}, "argv"),
    ({"argv": ["ls", 3]}, "argv"),
    ({"argv": [""]}, "argv"),
    ({"argv": ["echo", "a\0b"]}, "argv"),
    ({"argv": ["true"], "cwd": 5}, "cwd"),
    ({"argv": ["true"], "cwd": ""}, "cwd"),
    ({"argv": ["true"], "env": ["A=1"]}, "env"),
    ({"argv": ["true"], "env": {"A": 1}}, "env"),
    ({"argv": ["true"], "env": {"A=B": "1"}}, "env"),
    ({"argv": ["true"], "env": {"": "1"}}, "env"),
    ({"argv": ["true"], "stdin": 5}, "stdin"),
    ({"argv": ["true"], "timeout_s": 0}, "timeout_s"),
    ({"argv": ["true"], "timeout_s": -1}, "timeout_s"),
    ({"argv": ["true"], "timeout_s": "5"}, "timeout_s"),
    ({"argv": ["true"], "timeout_s": True}, "timeout_s"),
    ({"argv": ["true"], "timeout_s": float("nan")}, "timeout_s"),
])
def test_bad_param_is_named(tmp_path: Path, params: dict[str, Any], name: str) -> None:
    assert f"'{name}'" in fails(INVALID_PARAMS, params, tmp_path)
