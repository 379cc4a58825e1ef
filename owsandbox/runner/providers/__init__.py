"""Providers by name. `direct` runs shells in this process; the others start a daemon in a box."""

from __future__ import annotations

from .base import Provider
from .local import LocalProvider

RUNNER_PROVIDERS: dict[str, type[Provider]] = {"local": LocalProvider}
KNOWN = ("direct", *RUNNER_PROVIDERS)

__all__ = ["KNOWN", "RUNNER_PROVIDERS", "LocalProvider", "Provider"]
