"""Starting and stopping a detached daemon the way a box reached only through commands does it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from owsandbox.box import daemonctl

from .processes import pid_alive, wait_gone
from .waiting import patience, wait_until


@pytest.fixture
def folder():
    base = tempfile.mkdtemp(prefix="ows-dc-")  # short: a Unix socket path has at most 107 bytes
    state = os.path.join(base, "key")
    try:
        yield state
    finally:
        info = daemonctl.recorded(state)
        if isinstance(info.get("pid"), int) and daemonctl.ours(info["pid"], state):
            os.kill(info["pid"], 9)
        subprocess.run(["rm", "-rf", base], check=False)


def test_start_serves_the_folder_then_reuses_it_and_stop_ends_it(folder, zipapp, tmp_path):
    first = daemonctl.start(folder, ["--cwd", str(tmp_path), "--linger", "30"], str(zipapp))
    pid = first["daemon"]["pid"]
    assert first["reused"] is False and daemonctl.serving(folder) and daemonctl.ours(pid, folder)
    assert json.loads(Path(folder, "ready.json").read_text())["pid"] == pid
    again = daemonctl.start(folder, ["--cwd", str(tmp_path)], str(zipapp))
    assert again == {"daemon": first["daemon"], "reused": True}
    daemonctl.stop(folder, remove=True)
    assert wait_gone([pid]) == [] and not os.path.exists(folder)


def test_a_daemon_that_cannot_start_is_an_error_carrying_its_log(folder, zipapp):
    with pytest.raises(daemonctl.DaemonError) as err:
        daemonctl.start(folder, ["--no-such-option"], str(zipapp), timeout=20)
    message = str(err.value)
    assert message.startswith("the runner daemon did not start: ") and "--no-such-option" in message


def test_stop_leaves_alone_a_process_that_took_over_a_recorded_pid(folder):
    """ready.json may name a pid that has since been reused by something else."""
    os.makedirs(folder)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        Path(folder, "ready.json").write_text(json.dumps({"pid": stranger.pid}) + "\n")
        assert not daemonctl.ours(stranger.pid, folder)
        daemonctl.stop(folder, grace=0.1)
        assert pid_alive(stranger.pid) and stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_relay_that_cannot_start_a_daemon_says_so_and_exits_2(folder, zipapp):
    sock = daemonctl.socket_path(folder)
    relay = [sys.executable, "-S", str(zipapp), "attach", "--socket", sock, "--start", "--no-such-option"]
    done = subprocess.run(relay, input=b"", capture_output=True, timeout=60)
    assert done.returncode == 2 and done.stdout == b""
    assert b"cannot start a runner at " + sock.encode() in done.stderr and b"--no-such-option" in done.stderr


def test_a_process_whose_first_thread_ended_is_alive_while_another_thread_runs():
    """/proc shows such a leader as a zombie; its other threads still hold its files (a daemon being
    killed looks like this for a moment, and its socket still answers)."""
    program = ("import ctypes, sys, threading, time\n"
               "work = lambda: (time.sleep(0.3), print('worker', flush=True), time.sleep(600))\n"
               "threading.Thread(target=work).start()\n"
               "print('leader', flush=True)\n"
               "ctypes.CDLL(None).pthread_exit(None)\n")
    child = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "leader\n"
        assert child.stdout.readline() == "worker\n"

        def state() -> str:
            with open(f"/proc/{child.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]

        wait_until(lambda: state() == "Z", patience(5), "the first thread to end")  # nothing announces it
        assert daemonctl.pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not daemonctl.pid_alive(child.pid)
