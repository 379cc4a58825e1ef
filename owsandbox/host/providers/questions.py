"""What the kernel may ask of a running box's provider, apart from its lifecycle (`base.Provider`).

The lifecycle (`create`, `open_runner`, `destroy`, `release`) is led by `RunnerWorkspace` alone; the
kernel, its magics (`%sandbox`, `%network`, `%attach`, `%snapshot`) and the snapshot code only ask
what is here, on the provider of a box that runs. Every question has an answer that fits a box with
nothing more to say, so a provider overrides only what it knows. What a provider may be unable to do
is asked as a capability (`snapshot_site()`: None, with `snapshots_refused` saying why), never read
off the provider's class.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..isolation.network import NetworkNotChanged

if TYPE_CHECKING:
    from ...channel import ExecdEndpoint
    from ..isolation.guard import Guard
    from ..isolation.resources import LimitReport


@dataclass(frozen=True)
class SnapshotSite:
    """A workspace snapshots can take: a folder of this machine, bound into a box the host can stop whole."""

    folder: str  # the workspace, on this machine
    guard: Guard | None  # what of it the box may write (isolation/guard.py), None when nothing is held back
    stopped: Callable[[], AbstractContextManager[Any]]  # the box ended while the caller works, then a new box


class BoxQuestions:
    """The questions, with their default answers; each says who asks and when."""

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
    #: Why the `auto` factory chose a provider that does not isolate (bubblewrap does not work here),
    #: in words for people; None when it was chosen by name or isolates. Set by `auto` when it makes
    #: the provider; read by the provider's `headline` and `describe`, which say it plainly.
    fallback_reason: str | None = None
    #: Why this provider's network cannot be switched while its box runs, and how to get one instead, in
    #: words for people: what the default `set_network` answers `%network on|off` with.
    network_fixed = "this sandbox's network is set when it is made and cannot be switched while it runs"
    #: Why this provider takes no snapshots of its workspace, in words for people: what `%snapshot`
    #: answers when `snapshot_site()` is None (snapshots/stopped.py).
    snapshots_refused = "it does not say how to stop its box while the host puts the files back"

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

    def snapshot_site(self) -> SnapshotSite | None:
        """Called by the snapshot code (snapshots/stopped.py) for `%snapshot`, while the box runs: the
        workspace as a folder of this machine and how to stop the box whole around a restore, or None
        when this provider cannot offer that (`snapshots_refused` says why)."""
        return None
