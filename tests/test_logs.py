"""owsandbox's own logs: silent by default, on with OWSANDBOX_LOG, on the kernel's stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from owsandbox.host.providers.local import LocalProvider

from .conftest import running
from .kernel_session import KernelSession
from .waiting import wait_until

SAY = ("from owsandbox.logs import configure; configure(); import logging; "
       "logging.getLogger('owsandbox.kernel.example').debug('debug words'); "
       "logging.getLogger('owsandbox.kernel.example').warning('warning words')")


BOTH = ["debug words", "warning words"]


@pytest.mark.parametrize("setting, shown", [("", ["warning words"]), ("debug", BOTH), ("DEBUG", BOTH),
                                            ("nonsense", ["warning words"])])
def test_the_level_comes_from_owsandbox_log(setting: str, shown: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", SAY], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "OWSANDBOX_LOG": setting})
    lines = [line for line in done.stderr.splitlines() if line.startswith("[owsandbox ")]
    assert [line.rsplit("] ", 1)[1] for line in lines] == shown, done.stderr
    assert lines[-1] == "[owsandbox WARNING owsandbox.kernel.example] warning words"


def test_a_completion_that_finds_nothing_leaves_a_trace_in_the_kernels_log(tmp_path):
    log = tmp_path / "kernel.log"
    with log.open("w") as stderr:
        kernel = KernelSession(tmp_path, env={"OWSANDBOX_LOG": "debug"}, stderr=stderr)
        try:
            assert kernel.run("true").status == "ok"
            kernel.kc.complete("ls /no/such/folder/x", 19)
            assert kernel.kc.get_shell_msg(timeout=30)["content"]["matches"] == []
        finally:
            kernel.close()
    text = log.read_text()
    said = "[owsandbox DEBUG owsandbox.kernel.editing.completion] no paths to complete in /no/such/folder/"
    assert said in text, text


@pytest.mark.parametrize("setting", ["debug", ""])
def test_the_box_logs_at_the_hosts_level_in_its_daemon_log(monkeypatch, zipapp, workspace, setting):
    monkeypatch.setenv("OWSANDBOX_LOG", setting)
    provider = LocalProvider(cwd=workspace, runner_path=zipapp)
    with running(provider) as (_, client):
        assert client.call("shell.run", {"command": "exit 3"}, timeout=30)["outcome"] == "shell_exited"
        daemon_log = Path(provider.state_dir, "daemon.log")
        if setting:
            wait_until(lambda: "shell main" in daemon_log.read_text(), 10, "the shell's exit in daemon.log")
        text = daemon_log.read_text()
    assert ("[owbox DEBUG owsandbox.box.server] a client connected" in text) == bool(setting), text
    assert ("[owbox INFO owsandbox.box.shell.registry] shell main" in text) == bool(setting), text
