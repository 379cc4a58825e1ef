"""A restart of a box's daemon, as a sandbox restart would do it, for the tests that play one.

The product never restarts a daemon on purpose (the kernel learns of a restart from the client, which
sees a new instance), so this is no part of the provider contract: it is done here with each
provider's own steps, under the lock by which a provider serialises its lifecycle with a client
reconnecting meanwhile.
"""

from __future__ import annotations

from typing import Any

from owsandbox.host.providers.boxed import ProgramBoxProvider
from owsandbox.host.providers.local import LocalProvider


def restart_daemon(provider: Any) -> None:
    """Stop `provider`'s daemon and start a new one (`local` and `bwrap`; `exec`, `container`, `opensandbox`)."""
    with provider._lifecycle:
        if isinstance(provider, LocalProvider):
            provider._stop_daemon()
            provider._start_daemon()
        elif isinstance(provider, ProgramBoxProvider):
            provider._run_bootstrap(provider._args("stop", remove=False))
            provider._start()
        else:
            raise TypeError(f"no daemon restart for a {type(provider).__name__}")
