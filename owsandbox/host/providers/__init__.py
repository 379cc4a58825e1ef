"""Providers by name. `direct` runs shells in this process; the others start a daemon in a box.

`container` makes a container per kernel from an image (Podman or Docker).
`auto` (the default) is `bwrap` where bubblewrap works on this machine, else `local`. A name becomes
a provider in one place, `resolve`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, overload

from .base import Provider
from .bwrap import BwrapProvider, auto_enforcement, auto_provider, bwrap_problem
from .local import LocalProvider

if TYPE_CHECKING:
    from .container import ContainerProvider
    from .exec import ExecProvider


class _Deferred:
    """The factory of a provider whose module is imported when the provider is first asked for, so a
    kernel imports only the provider it uses (and its dependencies) when it starts."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def provider_class(self) -> type[Provider]:
        return getattr(importlib.import_module(self.module, __name__), self.name)

    def __call__(self, *args: Any, **options: Any) -> Provider:
        return self.provider_class()(*args, **options)

    @property
    def enforcement(self) -> str:
        return self.provider_class().enforcement


_DEFERRED = {"ContainerProvider": _Deferred(".container", "ContainerProvider"),
             "ExecProvider": _Deferred(".exec", "ExecProvider")}


def __getattr__(name: str) -> Any:
    deferred = _DEFERRED.get(name)
    if deferred is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return deferred.provider_class()


def opensandbox_provider(*args: Any, **options: Any) -> Provider:
    """The OpenSandbox provider, imported when asked for (it brings in websockets, and the OpenSandbox SDK
    when it creates the sandbox): in a sandbox that exists, or one it creates (`opensandbox.make_provider`)."""
    from .opensandbox import make_provider

    return make_provider(*args, **options)


opensandbox_provider.enforcement = "the OpenSandbox sandbox"  # type: ignore[attr-defined]

#: No provider: commands run in the caller's process (`open_workspace` only; the kernel always has a box).
DIRECT = "direct"
RUNNER_PROVIDERS: dict[str, Callable[..., Provider]] = {
    "auto": auto_provider,
    "bwrap": BwrapProvider,
    "container": _DEFERRED["ContainerProvider"],
    "exec": _DEFERRED["ExecProvider"],
    "local": LocalProvider,
    "opensandbox": opensandbox_provider,
}
KNOWN = (DIRECT, *RUNNER_PROVIDERS)


@overload
def resolve(name: str, *, direct: Literal[False] = False, source: str | None = None) -> Callable[..., Provider]: ...
@overload
def resolve(name: str, *, direct: bool, source: str | None = None) -> Callable[..., Provider] | None: ...
def resolve(name: str, *, direct: bool = False, source: str | None = None) -> Callable[..., Provider] | None:
    """The factory of the provider called `name`: `factory(cwd=FOLDER, **options)` makes it (`key`,
    and the provider's own options). Called by `open_workspace` and by the kernel's `Sandbox` when it
    is made, before anything starts.

    `direct` is a name only for a caller that can run commands in its own process (`direct=True`):
    it resolves to None there. Any other name that is not a provider's is a ValueError that names the
    known providers (those the caller can use) and, given `source`, where the name came from."""
    if direct and name == DIRECT:
        return None
    factory = RUNNER_PROVIDERS.get(name)
    if factory is None:
        known = KNOWN if direct else tuple(RUNNER_PROVIDERS)
        origin = f" (from {source})" if source else ""
        raise ValueError(f"unknown sandbox provider '{name}'{origin}; known providers: {', '.join(known)}")
    return factory


def enforcement_of(name: str) -> str:
    """What the named provider enforces, known before it starts (for banners)."""
    if name == "auto":
        return auto_enforcement()
    factory: Any = RUNNER_PROVIDERS.get(name)
    return getattr(factory, "enforcement", "unknown")


__all__ = ["DIRECT", "KNOWN", "RUNNER_PROVIDERS", "BwrapProvider", "ContainerProvider", "ExecProvider", "LocalProvider",
           "Provider", "bwrap_problem", "enforcement_of", "opensandbox_provider", "resolve"]
