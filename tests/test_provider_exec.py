"""The exec provider through the kernel: a box reached over a real ssh, and boxes that cannot be used.

(The whole runner suite also runs over ssh: see the `box` fixture.)"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from .conftest import DEFAULT_KERNEL_NAME
from .kernel_session import KernelSession

ENGINE = Path(__file__).resolve().parents[1] / "notebooks" / "engines" / "echo_engine.py"


def exec_kernel(workspace: Path, prefix: list[str] | str, **env: str) -> KernelSession:
    command = prefix if isinstance(prefix, str) else shlex.join(prefix)
    return KernelSession(workspace, kernel_name=DEFAULT_KERNEL_NAME,
                         env={"OWSANDBOX_PROVIDER": "exec", "OWSANDBOX_EXEC": command,
                              "OWSANDBOX_BOX_CWD": str(workspace), **env})


def test_cells_and_attach_work_in_a_box_over_ssh(sshd, tmp_path):
    kernel = exec_kernel(tmp_path, sshd)
    try:
        kernel.kc.kernel_info()
        assert "provider exec" in kernel.kc.get_shell_msg(timeout=10)["content"]["banner"]
        assert kernel.run("cd /tmp; export VIA=ssh").status == "ok"
        assert kernel.run("echo $VIA $PWD").text() == "ssh /tmp\n"
        started = kernel.run(f"%attach -- {sys.executable} {ENGINE}")  # through the forward bridge
        assert started.status == "ok", started.error["evalue"]
        answer = kernel.run('%send {"id": 1, "type": "echo", "text": "over ssh"}')
        assert answer.of_type("display_data")[0]["data"]["application/json"]["text"] == "over ssh"
        kernel.run("%attach --kill")
    finally:
        kernel.close()


def test_an_unreachable_box_is_a_clear_error_and_the_kernel_lives(tmp_path):
    kernel = exec_kernel(tmp_path, "ssh -F /dev/null -o BatchMode=yes -o ConnectTimeout=5 -p 1 127.0.0.1")
    try:
        first = kernel.run("echo hi")
        assert first.status == "error" and first.error["ename"] == "SandboxUnavailable"
        assert "ssh -F /dev/null" in first.error["evalue"] and "port 1" in first.error["evalue"]  # command, stderr
        assert kernel.run("%help").status == "ok"  # the kernel is alive and answers
    finally:
        kernel.close()


def test_a_box_without_python3_is_a_clear_error(tmp_path):
    kernel = exec_kernel(tmp_path, "env PATH=/nonexistent")
    try:
        first = kernel.run("echo hi")
        assert first.status == "error" and first.error["ename"] == "SandboxUnavailable"
        assert "has no python3" in first.error["evalue"] and "env PATH=/nonexistent python3" in first.error["evalue"]
    finally:
        kernel.close()


@pytest.mark.parametrize("prefix", ["", "   "])
def test_an_exec_provider_without_a_command_says_how_to_set_it(tmp_path, prefix):
    kernel = exec_kernel(tmp_path, prefix)
    try:
        assert "OWSANDBOX_EXEC" in kernel.run("echo hi").error["evalue"]
    finally:
        kernel.close()


def test_a_daemon_that_died_in_the_box_is_started_again_by_the_next_relay(sshd, tmp_path):
    """Nobody else in an ssh box notices its daemon die: the next relay starts one, and the client
    reports the command that was running as of unknown outcome."""
    from owsandbox.host.executor import RunnerExecutor
    from owsandbox.host.providers.exec import ExecProvider
    from owsandbox.host.workspace import RunnerWorkspace

    (tmp_path / "kept").mkdir()
    workspace = RunnerWorkspace(ExecProvider(prefix=sshd, box_cwd=str(tmp_path)), str(tmp_path))
    try:
        ex = RunnerExecutor(workspace.client)
        ex.run("cd kept")
        daemon = int(ex.run("echo $PPID")["output"])
        os.kill(daemon, 9)
        first = ex.run("echo ${PWD##*/}")  # sent before the client could know: never run twice, so unknown
        assert first["output"] == "kept\n" or "outcome of this command is unknown" in first["error"]
        assert ex.run("echo ${PWD##*/}")["output"] == "kept\n"  # a new daemon, the shell in its last folder
        assert workspace.client.restarts == 1
    finally:
        workspace.close()
