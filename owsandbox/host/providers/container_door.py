"""How a process of this machine other than the kernel reaches a container's execd endpoint: the host's
record of the box's door, in the container's state folder.

A container's daemon serves its execd endpoint on a Unix socket inside the box, which only the engine
reaches: the kernel goes in through `ENGINE exec -i NAME PYTHON -S RUNNER forward --socket SOCKET`, a
bridge of its own (exec.py). The Jupyter server that proxies `%preview` runs that same command itself,
one per connection, from this record, which the container provider writes each time the box's daemon is
started or found (`write`): the engine's program and the settings that point it at its daemon or store,
as the kernel found them; the container's name; and what the box said of its daemon (its Python, the
runner, the socket and the execd token). The record is in this machine's private folder of the
container, never mounted in the box, so the box cannot change which program runs here nor which
container it reaches; what the box said only names things inside the box, passed to the engine as plain
words (no shell reads them), and the token is the box's own daemon's. `read` checks every field and
refuses, with words, a record it cannot trust.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

RECORD = "execd.json"
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")  # as the exec provider passes its words
_TOKEN = re.compile(r"[A-Za-z0-9_\-]{16,200}")  # secrets.token_urlsafe's alphabet
ENGINES = ("podman", "docker")


class DoorRefused(ValueError):
    """A record of a container's door that cannot be used; the message says why."""


@dataclass(frozen=True)
class ContainerDoor:
    """The command that relays bytes to a container's execd endpoint, and the token it wants."""

    engine: str  # the engine's program, an absolute path on this machine
    container: str
    python: str  # in the box, as are the runner and the socket
    runner: str
    socket: str
    token: str = field(repr=False)
    engine_env: Mapping[str, str] = field(default_factory=dict)  # DOCKER_HOST, CONTAINERS_CONF, ...

    def argv(self) -> list[str]:
        """One relay (`forward`: one connection's bytes each way, then it ends)."""
        return [self.engine, "exec", "-i", self.container, self.python, "-S", self.runner, "forward",
                "--socket", self.socket]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The engine's environment: `base` (this process's) with the engine's own settings the kernel's."""
        from .container import ENGINE_SETTINGS

        env = {name: value for name, value in (os.environ if base is None else base).items()
               if name not in ENGINE_SETTINGS}
        env.update(self.engine_env)
        return env

    @property
    def headers(self) -> dict[str, str]:
        from ...channel.endpoint import TOKEN_HEADER

        return {TOKEN_HEADER: self.token}


def write(state_dir: str | os.PathLike[str], door: ContainerDoor) -> None:
    """Record `door` in the container's state folder, whole (a reader never sees half)."""
    folder = Path(state_dir)
    fresh = folder / (RECORD + ".new")
    fresh.write_text(json.dumps({"engine": door.engine, "engine_env": dict(door.engine_env),
                                 "container": door.container, "python": door.python, "runner": door.runner,
                                 "socket": door.socket, "execd_token": door.token}))
    fresh.replace(folder / RECORD)


def read(folder: Path) -> ContainerDoor:
    """The door recorded in `folder`, a container's state folder (named after its container); DoorRefused."""
    from .container import ENGINE_SETTINGS

    path = folder / RECORD
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DoorRefused(f"{folder.name}'s box has not said yet how to reach it ({path} is missing): it is "
                          "starting, or was started by an older owsandbox (restart the kernel)") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise DoorRefused(f"{path} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise DoorRefused(f"{path} is not a record of a container's door")
    engine, env = data.get("engine"), data.get("engine_env")
    if not (isinstance(engine, str) and os.path.isabs(engine) and os.path.basename(engine) in ENGINES):
        raise DoorRefused(f"{path} names no engine (an absolute path to podman or docker): {engine!r}")
    if not os.access(engine, os.X_OK):
        raise DoorRefused(f"the engine {engine} that {folder.name}'s box runs on is no longer a program here")
    if not (isinstance(env, dict) and all(name in ENGINE_SETTINGS and isinstance(value, str)
                                          for name, value in env.items())):
        raise DoorRefused(f"{path} has engine settings other than the engine's own ({', '.join(ENGINE_SETTINGS)})")
    if data.get("container") != folder.name:
        raise DoorRefused(f"{path} names the container {data.get('container')!r}, not {folder.name}, whose "
                          "folder it is in")
    words = [data.get(name) for name in ("python", "runner", "socket")]
    if not all(isinstance(word, str) and _PLAIN_WORD.fullmatch(word) for word in words):
        raise DoorRefused(f"{path} names the box's python, runner or socket in characters the engine's exec "
                          "cannot pass as plain words")
    token = data.get("execd_token")
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise DoorRefused(f"{path} has no execd token")
    return ContainerDoor(engine, folder.name, *words, token=token, engine_env=env)  # type: ignore[arg-type]
