"""What the providers of a box reached only by running programs in it have in common: `exec` (a
command prefix: `ssh HOST`, `docker exec -i C`) and `opensandbox` (an execd pipe session).

Such a box has no folder of the host's and nobody in it to start or watch the daemon, so:

* the box's bootstrap (`box/bootstrap.py`) starts and stops the daemon. Its source, read from that
  file, is the program the provider runs with the box's Python, with the arguments from `_args`
  and the standard-library modules the runner needs (a partial Python is named: `missing_modules`);
  it asks for the zipapp when this version is not in the box yet (`_upload`, once per version).
* the daemon lives detached in a private runtime folder of the box and lingers after its last
  client, so a dropped connection or a restarting kernel (`release`) finds it again; `destroy`
  stops it and removes its folder.
* each pipe is a relay (`attach`) that starts the daemon again in its folder if it died
  (`_relay_argv`), since nobody else in the box would notice.

A subclass says how a program runs in its box: `_run_bootstrap` (the bootstrap's answer),
`open_runner` (a relay), `_disconnect` (what it keeps open here), and its rows for `describe`.
"""

from __future__ import annotations

import abc
import base64
import functools
import hashlib
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

from ...box import bootstrap
from ...logs import log_level_args
from ...settings import Settings, settings_of
from ..bundle import box_stdlib_modules, zipapp_bytes
from .base import Provider


class BoxError(RuntimeError):
    """The box could not be reached or used; the message names the command and its stderr."""


@functools.lru_cache(maxsize=1)
def bootstrap_source() -> str:
    """The program sent to the box's Python: the source of `box/bootstrap.py`."""
    return Path(bootstrap.__file__).read_text(encoding="utf-8")


def bootstrap_argv(args: dict[str, Any]) -> list[str]:
    """The bootstrap's arguments (`bootstrap.main`'s argv): `args` in JSON, and the modules to look for."""
    return [json.dumps(args), ",".join(box_stdlib_modules())]


def missing_modules(output: str, python: str) -> str | None:
    """The error for a box whose Python lacks modules the runner needs, from the bootstrap's output
    (its `LACKING_MARK` line); None when it printed nothing of the kind."""
    for line in output.splitlines():
        if line.startswith(bootstrap.LACKING_MARK):
            names = line[len(bootstrap.LACKING_MARK):].split()
            which = f"the {names[0]} module" if len(names) == 1 else "the modules " + ", ".join(names)
            return (f"the box's {python} lacks {which} of the standard library, which the runner needs "
                    f"(Debian's and Ubuntu's python3-minimal has only part of it): install python3 in the box")
    return None


class ProgramBoxProvider(Provider):
    """A box reached only by running programs in it (see the module's docstring)."""

    network_fixed = ("the box has its own network, which owsandbox does not control: its commands reach what the "
                     "box reaches")

    shares_host_files = False  # the box's folders are its own: commands start in OWSANDBOX_BOX_CWD or its home

    def __init__(self, cwd: str | os.PathLike[str] | None, *, python: str, key: str | None, linger_seconds: float,
                 relay_silence_seconds: float, box_cwd: str | None, timeout: float,
                 runtime_dir: str | None = None, settings: Settings | None = None) -> None:
        self.settings = settings_of(settings)
        self.python = python
        self.key = key or f"k-{uuid.uuid4().hex[:16]}"
        self.linger_seconds = linger_seconds
        self.relay_silence_seconds = relay_silence_seconds
        # The folder in the box: OWSANDBOX_BOX_CWD, else the given one (a box rarely has our paths: "" = home).
        self.cwd = box_cwd if box_cwd is not None else self.settings.box_cwd
        self.local_cwd = str(cwd or os.getcwd())
        self.runtime_dir = runtime_dir  # None: the box's $XDG_RUNTIME_DIR, else /tmp
        self.timeout = timeout
        self.socket_path = ""
        self.runner_path = ""
        self.daemon_info: dict[str, Any] = {}
        self.box_folder = ""  # where the daemon started; a relay starts it there again if it died
        self.uploads = 0  # how many times this provider copied the zipapp into the box
        self._zipapp_cache: tuple[str, bytes] | None = None
        self._lifecycle = threading.RLock()  # a restart of the daemon and a reconnecting client may race

    # -- what a subclass says -----------------------------------------------------------------

    @abc.abstractmethod
    def _run_bootstrap(self, args: dict[str, Any]) -> dict[str, Any]:
        """Run the bootstrap in the box with `args` (see `bootstrap_argv`), giving it the zipapp
        (`_upload`) when it asks; its answer, or BoxError saying what failed and where."""

    @abc.abstractmethod
    def _disconnect(self) -> None:
        """Close what this provider keeps open here to reach the box (relays, bridges); the box's
        daemon stays."""

    # -- talking to the box -----------------------------------------------------------------

    def _zipapp(self) -> tuple[str, bytes]:
        if self._zipapp_cache is None:
            self._zipapp_cache = zipapp_bytes()
        return self._zipapp_cache

    def _args(self, action: str, **extra: Any) -> dict[str, Any]:
        """The bootstrap's arguments for `action` (`start`, `stop`)."""
        name, data = self._zipapp()
        return {"action": action, "key": self.key, "runner_name": name, "sha256": hashlib.sha256(data).hexdigest(),
                "cwd": self.cwd, "linger": self.linger_seconds, "runtime_dir": self.runtime_dir,
                "start_timeout": 20, "serve_args": log_level_args(self.settings), **extra}

    def _upload(self) -> bytes:
        """What the bootstrap reads when it asks for the zipapp: `<length>\\n` and the zipapp in base64."""
        _, data = self._zipapp()
        payload = base64.b64encode(data)
        self.uploads += 1
        return b"%d\n" % len(payload) + payload

    def _python_not_found(self, status: int | None, stderr: str) -> bool:
        """Whether a bootstrap that gave no answer failed for want of the box's Python."""
        return status == 127 or ("not found" in stderr and self.python in stderr)

    def _relay_argv(self, python: str) -> list[str]:
        """The relay (`attach`) to the daemon, run in the box by `python`; a daemon that died meanwhile
        (nobody else in the box would notice) is started again, in its folder."""
        assert self.runner_path, "create() first"
        start = ["--start", "--cwd", self.box_folder, "--linger", f"{self.linger_seconds:g}",
                 *log_level_args(self.settings)] if self.box_folder else []
        return [python, "-S", self.runner_path, "attach", "--socket", self.socket_path,
                "--silence-seconds", f"{self.relay_silence_seconds:g}", *start]

    # -- the provider -----------------------------------------------------------------------

    def create(self) -> None:
        with self._lifecycle:
            self._start()

    def _start(self) -> None:
        self._started(self._run_bootstrap(self._args("start")))

    def _started(self, answer: dict[str, Any]) -> None:
        """Take in the bootstrap's answer to `start`."""
        self.socket_path, self.runner_path = answer["socket"], answer["runner"]
        self.daemon_info = answer.get("daemon", {})
        self.reused = bool(answer.get("reused"))
        self.box_folder = answer.get("cwd") or ""

    def release(self) -> None:
        """Leave the daemon lingering in the box for a kernel that restarts."""
        self._disconnect()

    def destroy(self) -> None:
        self._disconnect()
        with self._lifecycle:
            try:
                self._run_bootstrap(self._args("stop", remove=True))
            except BoxError:
                pass  # an unreachable box cannot be tidied; its daemon leaves after lingering

    def _box_rows(self) -> dict[str, Any]:
        """`describe`'s rows about the daemon in the box."""
        return {"socket": self.socket_path, "runner": self.runner_path, "box cwd": self.cwd or "~"}

    def _starts_in(self) -> str:
        """`headline`'s words on where commands start."""
        return f"starts in {self.box_folder or '~'} of the box"
