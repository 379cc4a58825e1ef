"""What the processes of an idle kernel hold: after a first cell, none of the modules that only another
method, a mistake on the command line, Python debugging or an `%attach` needs. Each process is a real
one, run with Python's own list of what it imports (`-X importtime`, or PYTHONPROFILEIMPORTTIME where
the kernel or a provider starts it), so a change that makes one of them import such a module again
fails here. benchmarks/kernel_start.py measures what they cost (idle PSS)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from owsandbox.host.bundle import build_runner_zipapp
from owsandbox.host.providers.local import LocalProvider

from .conftest import running
from .kernel_session import KernelSession

#: Never in an idle box's daemon: the command line's argparse (and what it imports), the file, process,
#: usage and completion methods' modules, dataclasses (inspect), secrets (random), uuid, urllib.parse
#: (ipaddress), hashlib and hmac (OpenSSL), pty, pkgutil, logging (traceback, tokenize), platform, ast.
DAEMON_DEFERRED = ["argparse", "gettext", "shutil", "owsandbox.box.files.ops", "owsandbox.box.files.search",
                   "owsandbox.box.procs", "owsandbox.box.usage", "owsandbox.box.shell.complete", "dataclasses",
                   "inspect", "secrets", "random", "uuid", "urllib.parse", "ipaddress", "hashlib", "hmac", "pty",
                   "pkgutil", "logging", "traceback", "tokenize", "platform", "ast"]
#: Never in a relay: it copies bytes, with `_socket`; its command line is read without argparse.
RELAY_DEFERRED = ["argparse", "socket", "selectors", "enum", "re", "typing", "logging", "json",
                  "owsandbox.protocol", "owsandbox.box.daemonctl", "owsandbox.box.daemon"]
#: Never in an idle kernel: ipykernel's interruptible pdb (and IPython's debugger), psutil.
KERNEL_DEFERRED = ["pdb", "bdb", "IPython.core.debugger", "psutil"]


def imported(text: str) -> set[str]:
    """The modules named by Python's import-time lines in `text`."""
    return {line.rsplit("|", 1)[1].strip() for line in text.splitlines()
            if line.startswith("import time:") and "self [us]" not in line}


def test_an_idle_daemon_after_a_first_cell_holds_none_of_the_deferred_modules(tmp_path, monkeypatch):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # the daemon's stderr is its daemon.log
    provider = LocalProvider(cwd=workspace, runner_path=build_runner_zipapp(tmp_path / "dist", python=sys.executable))
    with running(provider) as (_, client):
        assert client.call("shell.run", {"command": "true"}, timeout=30)["exit_code"] == 0
        modules = imported(Path(provider.state_dir or "", "daemon.log").read_text())
    assert {"owsandbox.box.daemon", "owsandbox.box.shell.bash", "subprocess"} <= modules
    assert sorted(modules & set(DAEMON_DEFERRED)) == []


def test_a_relay_that_has_carried_bytes_both_ways_holds_none_of_the_deferred_modules(tmp_path):
    runner = build_runner_zipapp(tmp_path / "dist", python=sys.executable)
    path = str(tmp_path / "runner.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    relay = subprocess.Popen([sys.executable, "-X", "importtime", "-S", str(runner), "attach", "--socket", path,
                              "--silence-seconds", "60"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        listener.settimeout(30)
        daemon, _ = listener.accept()
        with daemon:
            assert relay.stdin is not None and relay.stdout is not None
            relay.stdin.write(b"to the daemon\n")
            relay.stdin.flush()
            daemon.settimeout(30)
            assert daemon.recv(100) == b"to the daemon\n"
            daemon.sendall(b"to the client\n")
            assert relay.stdout.read1(100) == b"to the client\n"
            relay.stdin.close()  # the client's end: the relay leaves
            relay.wait(30)
            assert relay.stderr is not None
            err = relay.stderr.read()
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()
        listener.close()
    modules = imported(err.decode())
    assert relay.returncode == 0 and {"owsandbox.box.relay", "_socket"} <= modules
    assert sorted(modules & set(RELAY_DEFERRED)) == []


def test_an_idle_kernel_after_a_first_cell_holds_none_of_the_deferred_modules(tmp_path):
    log = tmp_path / "kernel.log"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with log.open("w") as stderr:
        kernel = KernelSession(workspace, env={"PYTHONPROFILEIMPORTTIME": "1"}, stderr=stderr)
        try:
            assert kernel.run("true").status == "ok"
            modules = imported(log.read_text())
        finally:
            kernel.close()
    assert {"owsandbox.kernel.kernel", "ipykernel.kernelapp"} <= modules
    assert sorted(modules & set(KERNEL_DEFERRED)) == []


@pytest.mark.unit
def test_the_import_lines_are_read_as_python_writes_them():
    text = ("import time: self [us] | cumulative | imported package\n"
            "import time:       183 |        183 |   _io\n"
            "import time:      1510 |       4411 |     owsandbox.box.relay\n"
            "something else | x\n")
    assert imported(text) == {"_io", "owsandbox.box.relay"}
