"""What every provider is: a way to start the daemon in a box and to open a pipe to it.

Everything else — the protocol, resume, shells, files — is shared, so a provider is small. `Provider`
is the lifecycle contract, in the manner of jupyter_client's `KernelProvisionerBase`: each method says
who calls it and when. A provider must make the box (`create`), open pipes to its daemon
(`open_runner`) and end it all (`destroy`). What the kernel may ask of the box while it runs
(`headline`, `describe`, `limit_counters`, `set_network`, the `snapshot_site` capability, ...) is a
separate interface, `questions.BoxQuestions`, with defaults that fit a box with nothing more to say;
every provider answers it too.

Its life, as `RunnerWorkspace` and the kernel's `Sandbox` lead it: made by the factory its name
resolves to (`providers.resolve`), `create()` once, `open_runner()` for the first connection and
every reconnection, the kernel's questions while it runs, and at the end `destroy()` (shutdown) or
`release()` (a kernel restart, which finds the box again by the same key: `reused`).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from ..isolation.network import NetworkNotChanged
from .questions import BoxQuestions, SnapshotSite

if TYPE_CHECKING:
    from ..client import Transport

__all__ = ["BoxQuestions", "NetworkNotChanged", "Provider", "SnapshotSite"]


class Provider(BoxQuestions, abc.ABC):
    #: Whether `create()` found a daemon already running for this provider's key (a kernel that
    #: restarted finds the one its predecessor released). Set by `create()`; read right after it by the
    #: kernel's `Sandbox`, which then closes the old shells so that the new kernel starts with fresh ones.
    reused = False

    @abc.abstractmethod
    def create(self) -> None:
        """Make the box and start its daemon, or find the daemon already running for this key (and
        set `reused`). Called by `RunnerWorkspace` once, before the first connection; an exception
        is the reason the sandbox could not start (the kernel shows it in every cell)."""

    @abc.abstractmethod
    def open_runner(self) -> Transport:
        """A new pipe to the daemon (a relay running `attach`). Called by `RunnerClient` for the first
        connection and for every reconnection after a cut pipe, on the client's threads, possibly while
        the box is stopped or its daemon restarted: a provider serialises these. A daemon found gone may
        be started again here (the client then sees a new instance and reports the lost command)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Stop everything this provider started and remove what it made; may be called more than once.
        Called by `RunnerWorkspace.close` when the kernel shuts down, by `RunnerWorkspace` when the
        first connection fails after `create()`, and by the default `release`."""

    def release(self) -> None:
        """Let go of the box but leave its daemon running (it lingers) for a kernel that restarts, which
        finds it again by the same key. Called by `RunnerWorkspace.release` when the kernel restarts
        (`Sandbox.close(restart=True)`), after the client has closed. By default: `destroy()`, for a
        provider whose box cannot outlive it."""
        self.destroy()
