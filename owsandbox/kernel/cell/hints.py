"""One-line hints after a failing command, for failures whose cause is the sandbox, not the command.

A box without network fails name lookups with messages that say nothing of the sandbox ("Temporary
failure in name resolution", "Could not resolve host"); a newcomer would debug their URL. When the
box has no network and a failing command's output ends with such a message, the cell gets a note
saying so and how to ask for network.
"""

from __future__ import annotations

import re
from typing import Any

_LOOKUP_FAILED = re.compile(
    r"Temporary failure in name resolution|Could not resolve host|Name or service not known|"
    r"unable to resolve host address|No address associated with hostname|getaddrinfo (?:ENOTFOUND|EAI_AGAIN|failed)|"
    r"nodename nor servname|Could not resolve '|Failed to resolve|Resolving timed out|"
    r"Network is unreachable|No route to host", re.IGNORECASE)
_TAIL_CHARS = 16384  # a lookup failure is in the last lines a command printed

NO_NETWORK_HINT = ("[this sandbox has no network, so names do not resolve; %network on turns outbound network on "
                   "while it runs (bubblewrap), or start the kernel with OWSANDBOX_NETWORK=1 (owsandbox install --env "
                   "OWSANDBOX_NETWORK=1); %sandbox says more]")


def network_hint(result: dict[str, Any], network: str | None) -> str | None:
    """The hint for a command that failed on a box without network, or None."""
    if network != "none" or result.get("exit_code") in (0, None):
        return None
    tail = (result.get("output") or "")[-_TAIL_CHARS:]
    return NO_NETWORK_HINT if _LOOKUP_FAILED.search(tail) else None
