"""Snapshots of a sandbox's workspace: the store's file work (store.py and its parts) done by this
machine on its own side of the workspace, with the box stopped around a restore.

Only a provider whose workspace is a folder of this machine bound into a box that the host can stop
whole takes snapshots (it offers a `snapshot_site`): `bwrap` (its PID namespace's init killed, then a
new box) and `container` (the container removed, then a new one). A restore stops the box first,
because a program still running in it (a background job, a double-forked daemon) could write while
the files go back, and the new box comes with an empty /tmp, as a restored lab should. The others are
refused, each with its reason (`snapshots_refused`).

The baseline a kernelspec names (`OWSANDBOX_BASELINE`, `owsandbox install --baseline`) is a snapshot
name or a folder of this machine (a course's starting files), which is taken into the store as
`@baseline` at each restore (cheaply: unchanged files are not read again).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import settings
from .hostpaths import locate
from .store import BASELINE, RestoreReport, SaveReport, Scope, SnapshotError, SnapshotInfo, SnapshotStore

if TYPE_CHECKING:
    from ..providers.questions import BoxQuestions

BASELINE_ENV = settings.BASELINE


class SnapshotsRefused(SnapshotError):
    """This provider takes no snapshots; the message says why."""


@dataclass
class Target:
    """A sandbox's workspace as snapshots see it: its folder here, what of it the box may write, and how
    to stop the box around a restore."""

    workspace: str
    scope: Scope
    stopped: Callable[[], AbstractContextManager[Any]]


def target_of(provider: BoxQuestions) -> Target:
    """The snapshot target of a running provider (its `snapshot_site`), or SnapshotsRefused naming why not."""
    site = provider.snapshot_site()
    if site is None:
        raise SnapshotsRefused(f"snapshots are not available with the {provider.name} provider: "
                               f"{provider.snapshots_refused}")
    folder = os.path.realpath(site.folder)
    return Target(folder, Scope.of_guard(site.guard, folder), site.stopped)


def baseline_setting(env: settings.Settings | Mapping[str, str] | None = None) -> str | None:
    """OWSANDBOX_BASELINE of the settings, or of the variables given (None: this process's)."""
    return settings.settings_of(env).baseline or None


class SandboxSnapshots:
    """save, restore, list and drop for one running provider's workspace."""

    def __init__(self, provider: Any, limit: int | None = None,
                 env: settings.Settings | Mapping[str, str] | None = None) -> None:
        self.target = target_of(provider)
        self.store = SnapshotStore.for_workspace(self.target.workspace, limit, env)
        self.env = env

    def save(self, name: str) -> SaveReport:
        return self.store.save(name, self.target.workspace, self.target.scope)

    def restore(self, name: str) -> RestoreReport:
        """Stop the box, put the files back, start a new box."""
        self.store.require(name)  # before the box is stopped for nothing
        scope = self.target.scope  # what the box that ran could write (the new one is scanned anew)
        with self.target.stopped():
            return self.store.restore(name, self.target.workspace, scope)

    def restore_baseline(self) -> RestoreReport:
        setting = baseline_setting(self.env)
        if setting is None:
            raise SnapshotError(f"this kernel names no baseline: a kernelspec gives one, {BASELINE_ENV}, with "
                                "owsandbox install --baseline DIR (a folder of the lab's starting files) or "
                                "owsandbox install --baseline NAME (a snapshot)")
        if not setting.startswith("/"):
            return self.restore(setting)
        workspace = self.target.workspace
        folder, below = locate(os.path.abspath(setting), workspace)
        if below is not None:
            raise SnapshotError(f"the baseline folder {setting} is inside the workspace, where the box can change it: "
                                "keep a course's starting files outside the students' workspaces")
        if not os.path.isdir(folder):
            raise SnapshotError(f"the baseline folder {folder} ({BASELINE_ENV}) is not a folder here")
        self.store.save(BASELINE, folder)
        return self.restore(BASELINE)

    def list(self) -> list[SnapshotInfo]:
        return self.store.list()

    def drop(self, name: str) -> int:
        return self.store.drop(name)

    def usage(self) -> int:
        return self.store.usage()
