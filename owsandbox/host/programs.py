"""The programs this machine runs for a sandbox (bubblewrap, pasta, ip, nsenter, podman, docker), found
on PATH without the folders a box may write.

A kernel's PATH often holds folders of its workspace: the environment a user activated (a `.venv` the
box made, which the guard leaves writable on purpose), a relative entry (the kernel's folder is the
notebook's), `~/.local/bin` on a JupyterHub whose workspace is the home. A `bwrap` or a `git` the box
planted there would run on this machine, outside every box, as soon as the kernel looked the program
up. So the host never looks in them: relative entries, and entries inside the workspace (the kernel's
folder, or OWSANDBOX_WORKSPACE) are dropped before the lookup, whatever the guard makes of them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable

from .. import settings
from ..protocol.paths import inside

_MARKED: set[str] = set()  # workspaces of the boxes this process made (providers mark theirs)


def mark_box_writable(folder: str) -> None:
    """A folder a box of this process may write (a provider's workspace): never looked in for programs."""
    real = os.path.realpath(folder)
    if real != "/":
        _MARKED.add(real)


def box_writable_roots(extra: Iterable[str] = ()) -> list[str]:
    """Folders a box may write into, as this machine sees them: the kernel's folder, the workspace
    setting, the workspaces providers marked, and `extra`; `/` never counts (a refused workspace)."""
    found = [os.getcwd(), settings.read(settings.WORKSPACE), *_MARKED, *extra]
    return [os.path.realpath(folder) for folder in found if folder and os.path.realpath(folder) != "/"]


def trusted_path(path: str | None = None, avoid: Iterable[str] = ()) -> str:
    """PATH (or `path`) without relative entries and without entries inside a box-writable folder."""
    roots = box_writable_roots(avoid)
    kept = []
    for entry in (os.environ.get("PATH", os.defpath) if path is None else path).split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue
        real = os.path.realpath(entry)
        if any(inside(real, root) for root in roots):
            continue
        kept.append(entry)
    return os.pathsep.join(kept)


def host_program(name: str, avoid: Iterable[str] = ()) -> str | None:
    """The full path of program `name` as this machine should run it, or None (see the module)."""
    if os.sep in name:
        return name if not any(inside(os.path.realpath(name), root) for root in box_writable_roots(avoid)) \
            else None
    return shutil.which(name, path=trusted_path(avoid=avoid))
