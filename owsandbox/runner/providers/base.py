"""What every provider is: a way to start the daemon in a box and to open a pipe to it.

Everything else — the protocol, resume, shells, files — is shared, so a provider is small.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..transport import PipeTransport

if TYPE_CHECKING:
    from ...channel import ExecdEndpoint


class Provider:
    name = "provider"
    enforcement = "none"

    def create(self) -> None:
        """Make the box and start its daemon."""
        raise NotImplementedError

    def open_runner(self) -> PipeTransport:
        """A new pipe to the daemon (a relay running `attach`)."""
        raise NotImplementedError

    def restart_daemon(self) -> None:
        """Stop the daemon and start a new one, as a sandbox restart would."""
        raise NotImplementedError

    def destroy(self) -> None:
        """Stop everything this provider started and remove what it made."""
        raise NotImplementedError

    def execd_socket(self, hello: dict[str, Any]) -> str:
        """A Unix socket on this machine that reaches the box's execd endpoint (named in hello)."""
        return hello["execd"]["unix_socket"]

    def execd_endpoint(self, hello: dict[str, Any]) -> ExecdEndpoint:
        """Where `%attach` reaches the box's execd, with the headers it needs: by default the daemon's
        own endpoint (named in hello) through `execd_socket`; a box that has an execd of its own says so."""
        from ...channel import ExecdEndpoint
        from ...channel.endpoint import TOKEN_HEADER

        return ExecdEndpoint(unix_socket=self.execd_socket(hello), headers={TOKEN_HEADER: hello["execd"]["token"]})

    def limit_counters(self) -> dict[str, int]:
        """Called by the kernel before and after each cell: counts of limit events (`oom_kills`,
        `refused_forks`) read where the box cannot write them; {} when nothing counts them."""
        return {}

    def limit_summary(self) -> dict[str, str] | None:
        """Called by the kernel to name a limit a cell hit: the limits in words, or None without limits."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"provider": self.name, "enforcement": self.enforcement}
