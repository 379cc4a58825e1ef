"""The `local` provider: the daemon as a child process on this machine, with no isolation.

It runs the very zipapp that other providers copy into their boxes, so what is tested here is what
runs there. The daemon lives in a session of its own (Stop in a terminal does not reach it) and
leaves when its parent goes (`--exit-with-parent`).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..box.shells import session_members
from ..bundle import build_runner_zipapp
from ..transport import PipeTransport
from .base import Provider


class LocalProvider(Provider):
    name = "local"
    enforcement = "none"

    def __init__(self, cwd: str | os.PathLike[str] | None = None, runner_path: str | os.PathLike[str] | None = None,
                 relay_silence_seconds: float = 60.0, python: str | None = None, start_timeout: float = 20.0,
                 daemon_args: list[str] | None = None) -> None:
        self.cwd = str(Path(cwd or os.getcwd()).resolve())
        self.runner_path = str(runner_path) if runner_path else None
        self.relay_silence_seconds = relay_silence_seconds
        self.python = python or sys.executable
        self.start_timeout = start_timeout
        self.daemon_args = list(daemon_args or [])
        self.state_dir: str | None = None
        self.socket_path = ""
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_info: dict[str, Any] = {}

    def create(self) -> None:
        if self.runner_path is None:
            self.runner_path = str(build_runner_zipapp())
        self.state_dir = tempfile.mkdtemp(prefix="owsandbox-")
        self.socket_path = os.path.join(self.state_dir, "run", "runner.sock")
        self._start_daemon()

    def _start_daemon(self) -> None:
        assert self.state_dir and self.runner_path
        log = open(os.path.join(self.state_dir, "daemon.log"), "ab")  # noqa: SIM115 - handed to the child
        try:
            self.daemon = subprocess.Popen(
                [self.python, "-S", self.runner_path, "serve", "--socket", self.socket_path, "--cwd", self.cwd,
                 "--exit-with-parent", *self.daemon_args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
            )
        finally:
            log.close()
        self.daemon_info = self._await_ready()

    def _await_ready(self) -> dict[str, Any]:
        assert self.daemon and self.daemon.stdout
        fd = self.daemon.stdout.fileno()
        deadline = time.monotonic() + self.start_timeout
        buffer = b""
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(remaining, 0))
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                self._stop_daemon()
                raise RuntimeError(f"the runner daemon did not start: {self._log_tail() or 'no message'}")
            buffer += chunk
        self.daemon.stdout.close()
        return json.loads(buffer.split(b"\n", 1)[0])

    def _log_tail(self) -> str:
        if not self.state_dir:
            return ""
        try:
            return Path(self.state_dir, "daemon.log").read_text(errors="replace").strip()[-2000:]
        except OSError:
            return ""

    def open_runner(self) -> PipeTransport:
        assert self.runner_path, "create() first"
        if self.daemon is None or self.daemon.poll() is not None:
            # The daemon died (killed, or the machine ran out of memory): start a new one, as a
            # sandbox would restart. The client sees a new instance and reports the lost command.
            self._stop_daemon()
            self._start_daemon()
        return PipeTransport([self.python, "-S", self.runner_path, "attach", "--socket", self.socket_path,
                              "--silence-seconds", str(self.relay_silence_seconds)])

    def _stop_daemon(self) -> None:
        daemon, self.daemon = self.daemon, None
        if daemon is None:
            return
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)  # it ends its shells and removes its socket
            try:
                daemon.wait(5)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        # Anything its shells left behind in their sessions goes too.
        for pid in session_members(daemon.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def restart_daemon(self) -> None:
        self._stop_daemon()
        self._start_daemon()

    def destroy(self) -> None:
        self._stop_daemon()
        if self.state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            self.state_dir = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "cwd": self.cwd, "socket": self.socket_path,
                "daemon_pid": self.daemon.pid if self.daemon else None}
