"""Running one command and getting a plain result back, the same way in or out of a sandbox.

What `owsandbox run` (a workspace's `executor`) and the runner's tests use; the kernel talks to the
runner client itself (it needs live output, prompts, displays and paging). `RunnerExecutor` runs a
command on a named shell through the runner client; `DirectExecutor` runs it on the daemon's own
shell code in this process. Both return one shape — `command, cwd, exit_code, outcome, output,
timed_out, truncated`, plus `error` (and `log_path` when output was spilled) — so a caller cannot tell
them apart by their results.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .. import protocol as P
from ..protocol import messages as M
from .api import SandboxAPI
from .client import RunnerClient
from .session import Session

ANSWER_GRACE_SECONDS = 30.0  # past a command's own timeout, how long its answer may take to come back
RESULT_KEYS = ("command", "cwd", "exit_code", "outcome", "output", "timed_out", "truncated")


def executor_result(raw: dict[str, Any]) -> dict[str, Any]:
    """The executor's shape, from a `shell.run` record."""
    result = {key: raw.get(key) for key in RESULT_KEYS}
    if raw.get("error") is not None:
        result["error"] = raw["error"]
    if raw.get("log_path"):
        result["log_path"] = raw["log_path"]
    return result


def error_result(command: str, cwd: str | None, message: str) -> dict[str, Any]:
    return {"command": command, "cwd": cwd, "exit_code": None, "outcome": None, "output": "", "timed_out": False,
            "truncated": False, "error": message}


class RunnerExecutor:
    """Commands on one named shell of a runner daemon. The client's session keeps the shell's folder
    after each command: a restarted daemon knows nothing of the old one's shells, and starts this one there."""

    def __init__(self, client: RunnerClient, cwd: str | None = None, shell: str = "main",
                 answer_grace: float = ANSWER_GRACE_SECONDS) -> None:
        self.client = client
        self.answer_grace = answer_grace
        self.cwd = cwd  # where the shell starts the first time
        self.shell = shell

    def run(self, command: str, timeout: float | None = None) -> dict[str, Any]:
        params = M.RunParams(shell=self.shell, command=command)
        if self.cwd is not None:
            params["cwd"] = self.cwd
        if timeout is not None:
            params["timeout_s"] = timeout
        wait = None if timeout is None else timeout + self.answer_grace
        try:
            raw = SandboxAPI.over(self.client).run(params, timeout=wait)
        except P.RunnerError as err:
            return error_result(command, self.client.folder_of(self.shell) or self.cwd, err.message)
        except TimeoutError:
            return error_result(command, self.client.folder_of(self.shell) or self.cwd,
                                f"the runner did not answer within {wait:g} s of asking (the command's timeout "
                                f"was {timeout:g} s); the command may still be running on shell {self.shell!r}")
        return executor_result(dict(raw))

    def interrupt_now(self) -> bool:
        try:
            return SandboxAPI.over(self.client).interrupt_and_wait(self.shell)
        except (P.RunnerError, TimeoutError):
            return False


class DirectExecutor:
    """The shell `main` in this process, kept as the daemon keeps its shells: no daemon, no isolation."""

    def __init__(self, cwd: str | None = None) -> None:
        from ..box.shell.registry import ShellRegistry  # the box's shells, here: imported only for `direct`

        self.cwd = os.path.abspath(cwd or os.getcwd())
        self._shells = ShellRegistry(self.cwd)
        self._session = Session()  # the shell's folder, as a client's session keeps it

    def run(self, command: str, timeout: float | None = None) -> dict[str, Any]:
        done = threading.Event()
        box: dict[str, Any] = {}

        def on_done(result: M.RunResult) -> None:
            box.update(result)
            done.set()

        try:
            shell = self._shells.start("main", self._session.run_params({"shell": "main"}).get("cwd"))
            shell.run(command, on_done, None, timeout)
        except P.RunnerError as err:
            return error_result(command, self._session.folders.get("main") or self.cwd, err.message)
        done.wait()
        self._session.ran(box)
        return executor_result(box)

    def close(self) -> None:
        self._shells.close_all()
