"""Providers by name. `direct` runs shells in this process; the others start a daemon in a box.

`auto` (the default) is `bwrap` where bubblewrap works on this machine, else `local`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Provider
from .bwrap import BwrapProvider, auto_enforcement, auto_provider, bwrap_problem
from .exec import ExecProvider
from .local import LocalProvider


def opensandbox_provider(*args: Any, **options: Any) -> Provider:
    """The OpenSandbox provider, imported when asked for (it brings in websockets)."""
    from .opensandbox import OpenSandboxProvider

    return OpenSandboxProvider(*args, **options)


opensandbox_provider.enforcement = "the OpenSandbox sandbox"  # type: ignore[attr-defined]

RUNNER_PROVIDERS: dict[str, Callable[..., Provider]] = {
    "auto": auto_provider,
    "bwrap": BwrapProvider,
    "exec": ExecProvider,
    "local": LocalProvider,
    "opensandbox": opensandbox_provider,
}
KNOWN = ("direct", *RUNNER_PROVIDERS)


def enforcement_of(name: str) -> str:
    """What the named provider enforces, known before it starts (for banners)."""
    if name == "auto":
        return auto_enforcement()
    factory: Any = RUNNER_PROVIDERS.get(name)
    return getattr(factory, "enforcement", "unknown")


__all__ = ["KNOWN", "RUNNER_PROVIDERS", "BwrapProvider", "ExecProvider", "LocalProvider", "Provider",
           "bwrap_problem", "enforcement_of", "opensandbox_provider"]
