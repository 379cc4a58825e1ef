"""The box's bootstrap, run here as the providers run it in a box: its source, read from the file, is
the program (`python3 -S -c SOURCE ARGS MODULES` as `opensandbox` runs it, and `python3 -` with the
arguments in front as `exec` does), against a runtime folder of its own."""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from owsandbox.box import bootstrap
from owsandbox.box.daemonctl import pid_alive
from owsandbox.host import bundle
from owsandbox.host.providers.boxed import bootstrap_argv, bootstrap_source, missing_modules
from owsandbox.host.providers.exec import stdin_program

from .processes import wait_gone


def arguments(runtime: str, workspace: Path, action: str = "start", **extra: Any) -> dict[str, Any]:
    name, data = bundle.zipapp_bytes()
    return {"action": action, "key": "k-bootstrap", "runner_name": name, "sha256": hashlib.sha256(data).hexdigest(),
            "cwd": str(workspace), "linger": 30, "runtime_dir": runtime, "start_timeout": 20, **extra}


def upload(data: bytes | None = None) -> bytes:
    payload = base64.b64encode(bundle.zipapp_bytes()[1] if data is None else data)
    return b"%d\n" % len(payload) + payload


def run(args: dict[str, Any], stdin: bytes = b"", modules: str | None = None) -> tuple[int, list[dict[str, Any]], str]:
    """The bootstrap as `opensandbox` runs it: (status, its JSON lines, its whole output)."""
    argv = bootstrap_argv(args) if modules is None else [json.dumps(args), modules]
    done = subprocess.run([sys.executable, "-S", "-c", bootstrap_source(), *argv], input=stdin, capture_output=True,
                          timeout=60)
    output = done.stdout.decode()
    assert not done.stderr, done.stderr.decode()
    return done.returncode, [json.loads(line) for line in output.splitlines() if line.startswith("{")], output


@pytest.mark.unit
def test_the_program_sent_is_the_module_file():
    assert bootstrap_source() == Path(bootstrap.__file__).read_text(encoding="utf-8")
    assert bootstrap.PACKAGE == bundle.PACKAGE  # the zipapp's package, where it finds daemonctl
    assert "__future__" not in {node.module for node in ast.walk(ast.parse(bootstrap_source()))
                                if isinstance(node, ast.ImportFrom)}  # `exec` puts its arguments in front of it
    assert stdin_program({"action": "stop"}).endswith(bootstrap_source())
    assert {"json", "base64", "hashlib"} <= set(bundle.box_stdlib_modules())  # its own needs are looked for too


def test_a_box_without_the_runner_asks_for_it_and_keeps_nothing_when_the_input_ends(fresh_runtime, workspace):
    status, lines, _ = run(arguments(fresh_runtime, workspace))
    assert status == 0 and lines == [{"need_runner": True}]
    root = Path(fresh_runtime, f"owsandbox-{os.getuid()}")
    assert root.is_dir() and (root.stat().st_mode & 0o777) == 0o700 and list(root.iterdir()) == []


def test_it_takes_the_runner_in_starts_the_daemon_finds_it_again_and_stops_it(fresh_runtime, workspace):
    args = arguments(fresh_runtime, workspace)
    status, lines, _ = run(args, upload())
    assert status == 0 and lines[0] == {"need_runner": True}
    first = lines[-1]
    assert first["uploaded"] and not first["reused"] and first["cwd"] == str(workspace)
    assert Path(first["runner"]).name == args["runner_name"] and Path(first["socket"]).exists()
    daemon = first["daemon"]["pid"]
    try:
        again = run(args)[1]  # the runner is there: nothing is asked for
        assert len(again) == 1 and again[0]["reused"] and again[0]["daemon"]["pid"] == daemon
        assert "uploaded" not in again[0] and again[0]["executable"] == sys.executable
        stopped = run(arguments(fresh_runtime, workspace, "stop", remove=True))[1]
        assert stopped[-1]["folder"] == first["folder"] and "error" not in stopped[-1]
        assert wait_gone([daemon]) == [] and not os.path.exists(first["folder"])
        assert os.path.exists(first["runner"])  # kept for the next daemon of this version
    finally:
        if pid_alive(daemon):
            os.kill(daemon, 9)


def test_an_upload_that_is_cut_short_or_not_the_runner_is_refused(fresh_runtime, workspace):
    args = arguments(fresh_runtime, workspace)
    size = len(base64.b64encode(bundle.zipapp_bytes()[1]))
    cut = run(args, upload()[:-10])[1][-1]
    assert cut == {"error": f"the runner's upload was cut short ({size - 10} of {size} bytes)"}
    assert run(args, upload(b"not the runner"))[1][-1] == {"error": "the uploaded runner does not match its hash"}
    assert not list(Path(fresh_runtime, f"owsandbox-{os.getuid()}").iterdir())  # nothing half-written is left


def test_a_folder_the_box_lacks_is_named(fresh_runtime, workspace):
    missing = str(workspace / "not-here")
    assert run(arguments(fresh_runtime, workspace, cwd=missing), upload())[1][-1] == {
        "error": f"no such folder in the box: {missing}"}


def test_a_stop_for_a_daemon_that_never_was_is_quiet(fresh_runtime, workspace):
    status, lines, _ = run(arguments(fresh_runtime, workspace, "stop", remove=True))
    assert status == 0 and "error" not in lines[-1]


def test_a_python_that_lacks_a_module_says_which_before_anything_else(fresh_runtime, workspace):
    status, lines, output = run(arguments(fresh_runtime, workspace), upload(), modules="json,no_such_module_here")
    assert status == 3 and lines == [] and output == f"{bootstrap.LACKING_MARK} no_such_module_here\n"
    assert not os.path.exists(fresh_runtime + f"/owsandbox-{os.getuid()}")  # it did nothing
    message = missing_modules(output, "python3")
    assert message is not None and "python3 lacks the no_such_module_here module" in message
    assert "install python3" in message and missing_modules('{"ok": 1}\n', "python3") is None


def test_the_exec_route_carries_its_arguments_and_the_runner_in_the_program(fresh_runtime, workspace):
    """`python3 -` reads its program up to the end of stdin: what the bootstrap reads comes with it."""
    args = arguments(fresh_runtime, workspace)
    for stdin, last in ((b"", {"need_runner": True}), (upload(), None)):
        done = subprocess.run([sys.executable, "-"], input=stdin_program(args, stdin).encode(), capture_output=True,
                              timeout=60)
        assert done.returncode == 0 and not done.stderr, done.stderr.decode()
        answer = json.loads(done.stdout.decode().splitlines()[-1])
        if last is not None:
            assert answer == last
    assert answer["uploaded"] and answer["cwd"] == str(workspace)
    daemon = answer["daemon"]["pid"]
    try:
        run(arguments(fresh_runtime, workspace, "stop", remove=True))
        assert wait_gone([daemon]) == []
    finally:
        if pid_alive(daemon):
            os.kill(daemon, 9)


def test_asked_for_an_ack_a_python_that_lacks_modules_waits_for_it_before_it_ends(fresh_runtime, workspace):
    """A released execd may close the connection before the last output (see the module): the line
    naming what is missing must be read before the program ends, as any answer is."""
    argv = [json.dumps(arguments(fresh_runtime, workspace, ack=True)), "json,no_such_module_here"]
    program = subprocess.Popen([sys.executable, "-S", "-c", bootstrap_source(), *argv], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert program.stdout is not None and program.stdin is not None
        assert program.stdout.readline().decode() == f"{bootstrap.LACKING_MARK} no_such_module_here\n"
        with pytest.raises(subprocess.TimeoutExpired):
            program.wait(0.3)  # waits for the host's line
        program.stdin.write(b"ack\n")
        program.stdin.flush()
        assert program.wait(10) == 3
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()
