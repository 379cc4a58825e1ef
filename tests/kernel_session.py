"""A real owsandbox kernel driven through jupyter_client, for tests: start, run cells, stop."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

from owsandbox.kernel.cell.notes import is_note

from .conftest import KERNEL_NAME
from .waiting import wait_until

START_ATTEMPTS = 3  # a kernel that dies before it is ready is started again (new ports) at most twice


@dataclass
class CellRun:
    reply: dict[str, Any]
    outputs: list[dict[str, Any]] = field(default_factory=list)  # iopub messages, in order
    seconds: float = 0.0

    @property
    def status(self) -> str:
        return self.reply["content"]["status"]

    def text(self, name: str = "stdout") -> str:
        return "".join(m["content"]["text"] for m in self.outputs
                       if m["msg_type"] == "stream" and m["content"]["name"] == name)

    def of_type(self, msg_type: str) -> list[dict[str, Any]]:
        """The contents of `msg_type` outputs; the kernel's own notes are not displays of the cell's."""
        return [m["content"] for m in self.outputs if m["msg_type"] == msg_type and not is_note(m["content"])]

    def notes(self) -> str:
        """The kernel's notes (paging footers, limits, hints), one per line."""
        return "".join(m["content"]["data"]["text/plain"] + "\n" for m in self.outputs
                       if m["msg_type"] == "display_data" and is_note(m["content"]))

    @property
    def error(self) -> dict[str, Any]:
        errors = self.of_type("error")
        assert len(errors) == 1, self.outputs
        return errors[0]


class KernelSession:
    def __init__(self, workspace: Path, env: dict[str, str] | None = None, kernel_name: str = KERNEL_NAME,
                 connection_file: str | None = None, stderr: Any = None, **manager: Any) -> None:
        """`manager`: more settings of the KernelManager (`transport="ipc", ip=PATH` for a kernel in another
        network namespace, which the test's TCP cannot reach)."""
        self.workspace = workspace
        self.closed = False
        # display id → the text of its latest display or update read on iopub, whichever cell's reading met it:
        # an %attach display's updates belong to the cell that attached, and arrive while later cells run
        self.displays: dict[str, str] = {}
        self.shutdown = "not yet shut down"
        kernel_env = {**os.environ, **(env or {})}
        launch = {"cwd": str(workspace), "env": kernel_env, **({"stderr": stderr} if stderr else {})}
        self._launch = launch
        # A kernel that died before it was ready is started again by a new manager, on new ports: they
        # are chosen free, then bound by the kernel a moment later, and on a busy machine another
        # process can take one in between ("Address already in use"). A manager's own restart, even
        # with `newports`, keeps the ports its local provisioner cached (jupyter_server issue 481).

        def start() -> None:
            self.km = KernelManager(kernel_name=kernel_name, **manager)
            if connection_file is not None:  # named kernel-*.json, as Jupyter's servers name them
                self.km.connection_file = connection_file
            self.km.start_kernel(**launch)
            self._connect()

        def start_again() -> None:
            self.km.shutdown_kernel(now=True)
            start()

        start()
        try:
            self._ready_or_started_again(start_again, "the kernel")
        except BaseException:
            self.km.shutdown_kernel(now=True)
            raise
        self.drain()

    def restart(self, now: bool = False) -> None:
        """The manager's restart, as Jupyter's servers make it; the new kernel is ready when this returns.

        The new kernel binds the ports the old one had (jupyter_client keeps them, `newports` or not: see
        above), and on a busy machine another process can take one in between. A new kernel that dies
        before it is ready is started again on new ports by the same manager, with the same connection
        file (so the same sandbox key): a restart still, for the sandbox kept for it."""

        def start_again() -> None:
            self.km.shutdown_kernel(now=True, restart=True)  # the dead one's leftovers; the sandbox stays
            self.km.shell_port = self.km.iopub_port = self.km.stdin_port = self.km.hb_port = 0
            self.km.control_port = 0
            self.km.cleanup_connection_file()  # written again, at the same path, with the new ports
            self.km.start_kernel(**self._launch)
            self._connect()

        self.km.restart_kernel(now=now)
        self._ready_or_started_again(start_again, "the restarted kernel")
        self.drain()

    def _connect(self) -> None:
        self.kc = self.km.client()
        self.kc.start_channels()

    def _ready_or_started_again(self, start_again: Callable[[], None], what: str) -> None:
        """Wait for the kernel to be ready; one that died first is started again (`start_again`), at most
        START_ATTEMPTS times in all. One that is alive and not ready is a failure: it is not retried."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self.kc.wait_for_ready(timeout=60)
                return
            except Exception:
                self.kc.stop_channels()  # left running, its heartbeat would go on connecting
                if attempt == START_ATTEMPTS or self.km.is_alive():
                    raise
            print(f"{what} died before it was ready; starting it again on new ports (attempt {attempt + 1})")
            start_again()

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid  # type: ignore[union-attr]

    def drain(self) -> None:
        while True:
            try:
                self._read_iopub(0.2)
            except Exception:  # noqa: BLE001 - queue empty
                return

    def _read_iopub(self, timeout: float) -> dict[str, Any]:
        """The next iopub message; a display's text is kept in `displays` on the way."""
        msg = self.kc.get_iopub_msg(timeout=timeout)
        if msg["msg_type"] in ("display_data", "update_display_data"):
            display_id = (msg["content"].get("transient") or {}).get("display_id")
            if display_id:
                self.displays[display_id] = msg["content"].get("data", {}).get("text/plain", "")
        return msg

    def send(self, code: str, subshell_id: str | None = None, allow_stdin: bool = False) -> str:
        """Send a cell; with `allow_stdin`, its prompts come as input requests (`kc.get_stdin_msg`)."""
        msg = self.kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                                      "user_expressions": {}, "allow_stdin": allow_stdin,
                                                      "stop_on_error": False})
        if subshell_id is not None:
            msg["header"]["subshell_id"] = subshell_id
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def collect(self, msg_id: str, timeout: float = 60, on_output=None) -> CellRun:
        """Outputs of `msg_id` until it goes idle, then its reply."""
        started = time.monotonic()
        run = CellRun(reply={})
        while True:
            msg = self._read_iopub(timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            if msg["msg_type"] not in ("status", "execute_input"):
                run.outputs.append(msg)
                if on_output is not None:
                    on_output(msg)
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                run.reply = reply
                break
        run.seconds = time.monotonic() - started
        return run

    def collect_all(self, msg_ids: list[str], timeout: float = 60) -> dict[str, CellRun]:
        """Outputs and replies of several cells running at once, read on this one thread."""
        runs = {msg_id: CellRun(reply={}) for msg_id in msg_ids}
        idle: set[str] = set()
        while len(idle) < len(runs):
            msg = self._read_iopub(timeout)
            parent = msg["parent_header"].get("msg_id")
            if parent not in runs:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle.add(parent)
            elif msg["msg_type"] not in ("status", "execute_input"):
                runs[parent].outputs.append(msg)
        while any(not run.reply for run in runs.values()):
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") in runs:
                runs[reply["parent_header"]["msg_id"]].reply = reply
        return runs

    def wait_for(self, wanted: Any, timeout: float = 30, what: str = "the message") -> dict[str, Any]:
        """Read iopub until `wanted(message)` is true; that message (an event, not a guess)."""

        def next_wanted() -> dict[str, Any] | None:
            try:
                msg = self._read_iopub(0.1)  # blocks until a message comes
            except Exception:  # noqa: BLE001 - nothing yet
                return None
            return msg if wanted(msg) else None

        return wait_until(next_wanted, timeout, what, interval=0)

    def run(self, code: str, timeout: float = 60) -> CellRun:
        return self.collect(self.send(code), timeout)

    def run_on(self, subshell_id: str, code: str, timeout: float = 60) -> CellRun:
        """A cell on a kernel subshell (ipykernel 7): its id in the request's header."""
        return self.collect(self.send(code, subshell_id=subshell_id), timeout)

    def control(self, msg_type: str, content: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
        msg = self.kc.session.msg(msg_type, content)
        self.kc.control_channel.send(msg)
        while True:
            reply = self.kc.control_channel.get_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.kc.stop_channels()
        finally:
            started = time.monotonic()
            self.km.shutdown_kernel(now=False)
            # how it went, for a test's message: "ShutdownRequest" when the kernel left by itself, else
            # the signal jupyter_client had to send it after waiting
            self.shutdown = f"{self.km._shutdown_status.name} after {time.monotonic() - started:.1f} s"
