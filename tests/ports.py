"""A loopback port for a test: one nobody listens on now (to start a server that cannot report the
port it got, or to have an address where nothing answers)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may still take it first)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
