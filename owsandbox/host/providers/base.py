"""What every provider is: a way to start the daemon in a box and to open a pipe to it.

Everything else — the protocol, resume, shells, files — is shared, so a provider is small. `Provider`
is the contract, in the manner of jupyter_client's `KernelProvisionerBase`: each method says who
calls it and when. A provider must make the box (`create`), open pipes to its daemon
(`open_runner`), restart the daemon (`restart_daemon`) and end it all (`destroy`); the rest has
defaults that fit a box with nothing more to say.

Its life, as `RunnerWorkspace` and the kernel's `Sandbox` lead it: made by the factory its name
resolves to (`providers.resolve`), `create()` once, `open_runner()` for the first connection and
every reconnection, the kernel's questions (`headline`, `describe`, `limit_counters`, ...) while it
runs, and at the end `destroy()` (shutdown) or `release()` (a kernel restart, which finds the box
again by the same key: `reused`).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

from ..isolation.network import NetworkNotChanged

if TYPE_CHECKING:
    from ...channel import ExecdEndpoint
    from ..client import Transport
    from ..isolation.resources import LimitReport


class Provider(abc.ABC):
    #: The name users choose the provider by (`OWSANDBOX_PROVIDER`), shown by `%sandbox`.
    name = "provider"
    #: What isolates the box, in words for banners and `%sandbox` ("none" for nothing). Read from the
    #: class, before anything starts, by `providers.enforcement_of` for the kernel's banner.
    enforcement = "none"
    #: Whether the box sees the host's files at the host's paths (`local`; `bwrap`, which binds the
    #: workspace at its own path). Read by `RunnerWorkspace` once the daemon has said hello: commands
    #: of a provider that shares them run in the host's folder; those of one that does not (`exec`,
    #: `opensandbox`) run in the folder the box's daemon started in (hello's `cwd`), and that is the
    #: folder the kernel sends with every command (`Sandbox.cwd`), so a path of the host never goes
    #: into a box that does not have it. Read again by `%sandbox` (`Sandbox.describe`), which then
    #: shows the host's folder apart. A provider that does not say is taken not to share them.
    shares_host_files = False
    #: Whether `create()` found a daemon already running for this provider's key (a kernel that
    #: restarted finds the one its predecessor released). Set by `create()`; read right after it by the
    #: kernel's `Sandbox`, which then closes the old shells so that the new kernel starts with fresh ones.
    reused = False
    #: Why the `auto` factory chose a provider that does not isolate (bubblewrap does not work here),
    #: in words for people; None when it was chosen by name or isolates. Set by `auto` when it makes
    #: the provider; read by the provider's `headline` and `describe`, which say it plainly.
    fallback_reason: str | None = None
    #: Why this provider's network cannot be switched while its box runs, and how to get one instead, in
    #: words for people: what the default `set_network` answers `%network on|off` with.
    network_fixed = "this sandbox's network is set when it is made and cannot be switched while it runs"

    @abc.abstractmethod
    def create(self) -> None:
        """Make the box and start its daemon, or find the daemon already running for this key (and
        set `reused`). Called by `RunnerWorkspace` once, before the first connection; an exception
        is the reason the sandbox could not start (the kernel shows it in every cell)."""

    @abc.abstractmethod
    def open_runner(self) -> Transport:
        """A new pipe to the daemon (a relay running `attach`). Called by `RunnerClient` for the first
        connection and for every reconnection after a cut pipe, on the client's threads, possibly while
        `restart_daemon` runs: a provider serialises the two. A daemon found gone may be started again
        here (the client then sees a new instance and reports the lost command)."""

    @abc.abstractmethod
    def restart_daemon(self) -> None:
        """Stop the daemon and start a new one, as a sandbox restart would. Called by tests and tools
        that play a sandbox restart (test_runner_delivery, the security suite's box_attacker); the
        kernel never calls it (it learns of restarts from the client)."""

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

    def execd_socket(self, hello: dict[str, Any]) -> str:
        """A Unix socket on this machine that reaches the box's execd endpoint (named in hello). Called
        by the default `execd_endpoint`, whenever `%attach` needs the endpoint."""
        return hello["execd"]["unix_socket"]

    def execd_endpoint(self, hello: dict[str, Any]) -> ExecdEndpoint:
        """Where `%attach` reaches the box's execd, with the headers it needs: by default the daemon's
        own endpoint (named in hello) through `execd_socket`; a box that has an execd of its own says so.
        Called by the kernel each time `%attach` starts a program in the box or attaches to one again."""
        from ...channel import ExecdEndpoint
        from ...channel.endpoint import TOKEN_HEADER

        return ExecdEndpoint(unix_socket=self.execd_socket(hello), headers={TOKEN_HEADER: hello["execd"]["token"]})

    def limit_counters(self) -> dict[str, int]:
        """Called by the kernel before and after each cell: counts of limit events (`oom_kills`,
        `refused_forks`) read where the box cannot write them; {} when nothing counts them."""
        return {}

    def limit_report(self) -> LimitReport | None:
        """Called by the kernel after each cell, to name a limit the cell hit: the limits in words and
        whether an OOM kill is counted, or None without limits."""
        return None

    def after_cell(self) -> str | None:
        """Called by the kernel at each cell's end, on a worker thread: a note for the cell's output
        when the host did something about what the cell left (box-made git settings moved aside), or None."""
        return None

    def describe(self) -> dict[str, Any]:
        """Every fact about the box worth showing, as a table's rows. Called by `%sandbox` (through
        `Sandbox.describe`) and by `RunnerWorkspace.describe`, once the box runs."""
        return {"provider": self.name, "enforcement": self.enforcement}

    def headline(self) -> list[str]:
        """Called by the kernel at its first cell, once the box runs: the few facts a person must
        know about where their commands run (joined with ` · ` on one line); `describe` has the rest."""
        return [self.name]

    def set_network(self, on: bool) -> str:
        """Called by the kernel for `%network on|off`, on a magic's thread, while the box runs: turn its
        outbound network on or off and say, in words, what it has now. A provider that cannot raises
        NetworkNotChanged with `network_fixed`, its reason."""
        raise NetworkNotChanged(self.network_fixed)

    def network_state(self) -> str | None:
        """Called by the kernel after a failing command: `none` when the box has no network (a failed
        name lookup then gets a hint), `outbound` when it has, None when the provider cannot tell."""
        return None
