"""The kernel's sandbox: chosen at start, created in the background, closed at shutdown.

Creating a sandbox takes a moment (a daemon to start, a relay to open); `kernel_info` must not wait
for it, so it starts on a thread when the kernel starts and the first cell waits for it. A sandbox
that could not start is reported to every cell with the reason, and the kernel stays alive.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from functools import cached_property
from pathlib import Path
from typing import Any

from .. import protocol as P
from ..host.api import SandboxAPI
from ..host.client import RunnerClient
from ..host.isolation.resources import LimitTooSmall
from ..host.providers import bwrap_problem, enforcement_of, resolve
from ..host.workspace import DEFAULT_PROVIDER, PROVIDER_ENV, RunnerWorkspace
from ..settings import Settings, SettingsError
from .footprint import give_back_freed_memory

log = logging.getLogger(__name__)



class SandboxUnavailable(Exception):
    """The sandbox could not be created or reached; the message says why."""


class Sandbox:
    def __init__(self, cwd: str | None = None, provider: str | None = None, key: str | None = None,
                 settings: Settings | None = None) -> None:
        """`settings`: the kernel's (None: this process's environment now). An invalid setting is this
        sandbox's error, said to every cell, as a sandbox that could not start is."""
        self.key = key
        problem: str | None = None
        if settings is None:
            try:
                settings = Settings.from_env(os.environ)
            except SettingsError as exc:
                settings, problem = Settings(), f"the sandbox cannot start: {exc}"
        self.settings = settings
        # The notebook's folder on this machine, and the folder commands start in, in the box: the same
        # until a box that does not share the host's files says where it started (see `_start`).
        self.host_cwd = str(Path(cwd or settings.workspace or os.getcwd()).resolve())
        self.cwd = self.host_cwd
        self.provider_name = provider or settings.provider or DEFAULT_PROVIDER
        self._workspace: RunnerWorkspace | None = None
        self._error: str | None = problem
        self._ready = threading.Event()
        self._closed = False
        self._closing = threading.Lock()  # a second close waits for the first to finish
        self.started_at = time.time()
        self._box_started: dict[str, float] = {}  # the box's instance id -> when it started (epoch seconds)
        if problem is not None:
            self._ready.set()
            return
        try:
            self._factory = resolve(self.provider_name, source=PROVIDER_ENV)
        except ValueError as exc:
            self._error = str(exc)
            self._ready.set()

    @cached_property
    def enforcement(self) -> str:
        """What isolates the box, known before it starts (for the banner): asked when first needed, so that
        `auto`'s probe of bubblewrap (a process of its own) runs beside the kernel's start, on the thread
        that starts the box, rather than before the kernel can answer."""
        return enforcement_of(self.provider_name)

    def isolation_note(self) -> str:
        """One plain sentence on what the sandbox isolates."""
        if self.enforcement != "none":
            return f"isolated by {self.enforcement}"
        why = ""
        if self.provider_name == "auto":
            why = f" ({bwrap_problem()})"
        return f"no isolation{why}: commands run on this machine with your permissions"

    def start_in_background(self) -> None:
        if not self._ready.is_set():
            threading.Thread(target=self._start, name="sandbox-start", daemon=True).start()

    def _start(self) -> None:
        options: dict[str, Any] = {"key": self.key} if self.key else {}
        options["settings"] = self.settings
        try:
            workspace = RunnerWorkspace(self._factory(cwd=self.host_cwd, **options), self.host_cwd)
            self._box_seen(workspace.client)
            if workspace.provider.reused:
                self._fresh_shells(workspace)
        except (P.RunnerError, OSError, RuntimeError, ValueError) as exc:
            named = f"{type(exc).__name__}: " if isinstance(exc, LimitTooSmall) else ""
            self._error = f"the {self.provider_name} sandbox could not start: {named}{exc}"
            log.error("%s", self._error)
        else:
            with self._closing:  # a close that came meanwhile either sees this box or is seen here
                closed = self._closed
                if not closed:
                    self.cwd = workspace.cwd  # before the workspace shows: nothing may send the host's folder
                    self._workspace = workspace
            if closed:
                workspace.close()
        finally:
            self._ready.set()
        give_back_freed_memory()  # what the start allocated and freed (footprint.py)

    @property
    def ready(self) -> bool:
        return self._workspace is not None

    def wait(self, timeout: float = 60.0) -> RunnerWorkspace:
        if self._workspace is not None:
            return self._workspace
        if not self._ready.wait(timeout):
            raise SandboxUnavailable(f"the {self.provider_name} sandbox did not start within {timeout:g} s")
        if self._workspace is None:
            raise SandboxUnavailable(self._error or "the sandbox is closed")
        return self._workspace

    @property
    def client(self) -> RunnerClient:
        return self.wait().client

    def folder_of(self, shell: str) -> str:
        """Where `shell` runs its next command: its folder after its last one, which the client's session
        keeps (and sends, so a shell that has to start again, after `exit` or a sandbox restart, starts
        there), else the sandbox's folder."""
        return self.known_folder(shell) or self.cwd

    def known_folder(self, shell: str) -> str | None:
        """The shell's folder after its last command; None for a shell that has run none here."""
        workspace = self._workspace
        return workspace.client.folder_of(shell) if workspace is not None else None

    def shell_folders(self) -> dict[str, str]:
        """Every shell that has run a command here, and its folder."""
        workspace = self._workspace
        return workspace.client.shell_folders() if workspace is not None else {}

    def place_shell(self, shell: str, folder: str) -> None:
        """Start `shell` in `folder` the next time the box has to start it."""
        self.client.place_shell(shell, folder)

    def headline(self) -> list[str]:
        """The first cell's line: the provider's few facts (see `Provider.headline`)."""
        return self.wait(0).provider.headline()

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"provider": self.provider_name, "enforcement": self.enforcement, "cwd": self.cwd}
        if self._workspace is not None:
            client = self._workspace.client
            info.update(self._workspace.provider.describe())
            if not self._workspace.provider.shares_host_files:
                info.update(cwd=self.cwd, **{"host folder": self.host_cwd})  # the notebook's, not in the box
            info.update(instance_id=client.instance_id, restarts=client.restarts, reconnects=client.reconnects,
                        runner_pid=client.hello.get("pid"), runner_version=client.hello.get("runner_version"),
                        os=client.hello.get("os"), bash=client.hello.get("shell"),
                        kept=self._workspace.provider.reused)
            since = self._box_seen(client)
            info.update(uptime_s=round(time.time() - since, 1),
                        up_since=time.strftime("%H:%M:%S", time.localtime(since)))
        elif self._error:
            info["error"] = self._error
        return info

    def _box_seen(self, client: RunnerClient) -> float:
        """When the box the client talks to started (its hello's uptime, taken when the hello came: at the
        start, or first seen here after a restart of the box). A box kept from the kernel before a restart
        is older than this kernel, and `%sandbox` says so."""
        instance = str(client.instance_id)
        if instance not in self._box_started:
            said = client.hello.get("uptime_s")
            uptime = float(said) if isinstance(said, (int, float)) and 0 <= said < 1e9 else 0.0
            self._box_started = {instance: time.time() - uptime}  # only the current box's is kept
        return self._box_started[instance]

    @staticmethod
    def _fresh_shells(workspace: RunnerWorkspace) -> None:
        """A restarted kernel starts with fresh shells; programs started with %attach live on."""
        for shell in workspace.client.hello.get("shells", []):
            try:
                SandboxAPI.over(workspace.client).close_shell(shell["name"])
            except P.RunnerError as exc:
                log.warning("shell %s of the previous kernel not closed: %s", shell["name"], exc)

    def close(self, restart: bool = False) -> None:
        """End the sandbox, or with `restart`, leave it for the kernel that comes next."""
        with self._closing:
            self._closed = True
            workspace, self._workspace = self._workspace, None
            if workspace is None:
                return
            if restart:
                self._fresh_shells(workspace)
                workspace.release()
            else:
                workspace.close()

    def settle(self) -> None:
        """Return once a close under way has finished (at once when none is)."""
        with self._closing:
            pass

    def end(self) -> None:
        """Close for good, and wait for a start under way (it closes the box it made, seeing it closed)."""
        self.close()
        self._ready.wait()
