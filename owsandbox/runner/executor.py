"""Running one command and getting a plain result back, the same way in or out of a sandbox.

`RunnerExecutor` runs it on a named shell through the runner client; `DirectExecutor` runs it on
the same shell code in this process. Both return the in-process executor's shape — `command, cwd,
exit_code, outcome, output, timed_out, truncated`, plus `error` (and `log_path` when output was spilled) —
so a caller cannot tell them apart by their results.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from .box import protocol as P
from .box.shells import Shell
from .client import RunnerClient

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
    def __init__(self, client: RunnerClient, cwd: str | None = None, shell: str = "main",
                 on_output: Callable[[str], None] | None = None, timeout: float | None = None) -> None:
        self.client = client
        self.cwd = cwd
        self.folder: str | None = None  # the shell's folder after its last command: a restart starts it there
        self.shell = shell
        self.on_output = on_output
        self.timeout = timeout

    def run(self, command: str, timeout: float | None = None) -> dict[str, Any]:
        timeout = timeout if timeout is not None else self.timeout
        params: dict[str, Any] = {"shell": self.shell, "command": command}
        if self.folder or self.cwd is not None:
            params["cwd"] = self.folder or self.cwd
        if timeout is not None:
            params["timeout_s"] = timeout

        def on_frame(frame: dict[str, Any]) -> None:
            if self.on_output is not None and frame.get("method") == "shell.output":
                self.on_output(frame.get("text", ""))

        try:
            raw = self.client.call("shell.run", params, on_notification=on_frame)
        except P.RunnerError as err:
            return error_result(command, self.folder or self.cwd, err.message)
        self.folder = raw.get("cwd") or self.folder
        return executor_result(raw)

    def interrupt_now(self) -> bool:
        try:
            return bool(self.client.call("shell.interrupt", {"shell": self.shell}, timeout=10).get("interrupted"))
        except (P.RunnerError, TimeoutError):
            return False


class DirectExecutor:
    """Named shells in this process: no daemon, no isolation."""

    def __init__(self, cwd: str | None = None, shell: str = "main",
                 on_output: Callable[[str], None] | None = None, timeout: float | None = None) -> None:
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.shell = shell
        self.on_output = on_output
        self.timeout = timeout
        self._shells: dict[str, Shell] = {}
        self._lock = threading.Lock()

    def _get_shell(self) -> Shell:
        with self._lock:
            shell = self._shells.get(self.shell)
            if shell is None or not shell.alive:
                start_in = shell.cwd if shell is not None else self.cwd
                shell = Shell(self.shell, start_in)
                self._shells[self.shell] = shell
            return shell

    def run(self, command: str, timeout: float | None = None) -> dict[str, Any]:
        timeout = timeout if timeout is not None else self.timeout
        done = threading.Event()
        box: dict[str, Any] = {}

        def on_done(result: dict[str, Any]) -> None:
            box.update(result)
            done.set()

        def on_live(frame: dict[str, Any]) -> None:
            if self.on_output is not None:
                self.on_output(frame.get("text", ""))

        shell = self._get_shell()
        try:
            shell.run(command, on_done, on_live, timeout)
        except P.RunnerError as err:
            return error_result(command, shell.cwd, err.message)
        done.wait()
        return executor_result(box)

    def interrupt_now(self) -> bool:
        shell = self._shells.get(self.shell)
        return shell.interrupt() if shell is not None else False

    def close(self) -> None:
        with self._lock:
            shells = list(self._shells.values())
            self._shells.clear()
        for shell in shells:
            shell.close()
