"""Which ports of a sandbox are previewed: a record the kernel keeps in the sandbox's state folder.

`%preview PORT` adds the port, `%preview stop PORT` takes it out; the server's proxy serves only the
ports in it. The state folder is the host's (private to this user, never mounted in the box), so the
box cannot add a port to the record; it could only have served its own ports anyway, as the relay
connects inside the box. Written whole to a temporary file and renamed, so a reader never sees half.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

RECORD = "previews.json"


def read(state_dir: str | Path) -> dict[int, dict[str, Any]]:
    """The previewed ports, each with its `path` and `started` (a Unix time); {} without a record."""
    try:
        data = json.loads((Path(state_dir) / RECORD).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"the previews record {Path(state_dir) / RECORD} cannot be read: {exc}") from None
    ports = data.get("ports") if isinstance(data, dict) else None
    if not isinstance(ports, dict):
        return {}
    return {int(port): info for port, info in ports.items() if port.isdigit() and isinstance(info, dict)}


def _write(state_dir: str | Path, ports: dict[int, dict[str, Any]]) -> None:
    folder = Path(state_dir)
    fd, temporary = tempfile.mkstemp(prefix=".previews-", dir=folder)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump({"ports": {str(port): info for port, info in sorted(ports.items())}}, out)
        os.replace(temporary, folder / RECORD)
    except BaseException:
        os.unlink(temporary)
        raise


def add(state_dir: str | Path, port: int, path: str) -> None:
    """Record `port` with a new secret: the capability in the preview's path (handlers.py), so a new
    `%preview` of a port ends the old links."""
    ports = read(state_dir)
    ports[port] = {"path": path, "started": time.time(), "secret": secrets.token_urlsafe(24)}
    _write(state_dir, ports)


def remove(state_dir: str | Path, port: int) -> bool:
    """Take `port` out of the record; whether it was in it."""
    ports = read(state_dir)
    if ports.pop(port, None) is None:
        return False
    _write(state_dir, ports)
    return True
