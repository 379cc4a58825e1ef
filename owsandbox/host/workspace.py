"""A workspace is where commands run: a folder, a provider, and an executor for it.

`open_workspace` picks the provider by argument or by `OWSANDBOX_PROVIDER`, so the same code runs
commands in this process (`direct`) or in a sandbox's daemon (`local`, and the isolating providers).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import settings
from ..settings import Settings, settings_of
from .client import RunnerClient
from .executor import DirectExecutor, RunnerExecutor
from .providers import Provider, resolve

DEFAULT_PROVIDER = "auto"
PROVIDER_ENV = settings.PROVIDER


class DirectWorkspace:
    def __init__(self, cwd: str | os.PathLike[str] | None = None) -> None:
        self.cwd = str(Path(cwd or os.getcwd()).resolve())
        self.executor = DirectExecutor(self.cwd)

    def describe(self) -> dict[str, Any]:
        return {"provider": "direct", "enforcement": "none", "cwd": self.cwd}

    def close(self) -> None:
        self.executor.close()


class RunnerWorkspace:
    """A provider's box with a client connected to its daemon. `host_cwd` is the folder on this
    machine it was opened for; `cwd` the folder commands start in, in the box: the same folder when
    the provider shares the host's files, else the one the box's daemon started in."""

    def __init__(self, provider: Provider, cwd: str, ping_seconds: float = 5.0) -> None:
        self.provider = provider
        self.host_cwd = cwd
        provider.create()
        try:
            self.client = RunnerClient(provider.open_runner, ping_seconds=ping_seconds)
            self.client.connect()
        except BaseException:
            provider.destroy()
            raise
        self.cwd = cwd if provider.shares_host_files else str(self.client.hello["cwd"])
        self.executor = RunnerExecutor(self.client, cwd=self.cwd)

    def describe(self) -> dict[str, Any]:
        return {**self.provider.describe(), "cwd": self.cwd, "instance_id": self.client.instance_id,
                "restarts": self.client.restarts}

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.provider.destroy()

    def release(self) -> None:
        """Disconnect but leave the sandbox running where the provider can (a restarting kernel)."""
        self.client.close()
        self.provider.release()


def open_workspace(cwd: str | os.PathLike[str] | None = None, provider: str | None = None,
                   settings: Settings | None = None, **options: Any) -> DirectWorkspace | RunnerWorkspace:
    """`settings`: the caller's (None: this process's environment now)."""
    given = settings_of(settings)
    name = provider or given.provider or DEFAULT_PROVIDER
    folder = str(Path(cwd or os.getcwd()).resolve())
    factory = resolve(name, direct=True)
    if factory is None:
        return DirectWorkspace(folder)
    return RunnerWorkspace(factory(cwd=folder, settings=given, **options), folder)
