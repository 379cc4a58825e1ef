"""The daemon's named shells: which are up, and the pids file.

A shell that exits (a typed `exit`, a crash) stays named here, dead, until the next command that
names it starts a new one or `shell.close` forgets it: a file call naming it still starts from its
last folder. Where a new shell starts is the client's to say (`cwd`): the host's session owns each
shell's folder, and sends it with every `shell.run`, so a shell that exited, or a box that restarted
and knows nothing, starts it where it was. The shells' pids are written to a file beside the socket, because each
shell leads a session of its own and nothing else ties it to the daemon: if the daemon is killed,
whoever cleans up still finds them (`read_pids`). The direct executor keeps its shells here too, with
no pids file.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ...protocol import INVALID_PARAMS, UNKNOWN_SHELL, RunnerError
from ..log import getLogger
from .bash import DEFAULT_OUTPUT_LIMIT, Shell

log = getLogger(__name__)

PIDS_FILE = "shells.pids"


def read_pids(folder: str) -> list[int]:
    """The pids of the shells a registry wrote down in `folder` ([] when there is no such file)."""
    try:
        with open(os.path.join(folder, PIDS_FILE)) as f:
            return [int(line) for line in f if line.strip().isdigit()]
    except (OSError, ValueError):
        return []


class ShellRegistry:
    def __init__(self, cwd: str, log_dir: str | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
                 definitions_dir: str | None = None, pids_folder: str | None = None) -> None:
        self.cwd = cwd  # where a shell starts when it is given no folder and has none yet
        self.log_dir = log_dir
        self.output_limit = output_limit
        self.definitions_dir = definitions_dir  # complete.py reads the shells' functions and aliases there
        self.pids_folder = pids_folder
        self._shells: dict[str, Shell] = {}  # by name: up, or exited and not replaced yet
        self._lock = threading.Lock()

    def get(self, name: str) -> Shell | None:
        """The shell named `name`, if it is up (or exited, and not replaced yet)."""
        with self._lock:
            return self._shells.get(name)

    def named(self, name: str) -> Shell:
        """The shell named `name`; UNKNOWN_SHELL when it is not up."""
        shell = self.running(name)
        if shell is None:
            raise RunnerError(UNKNOWN_SHELL, f"no shell named '{name}'")
        return shell

    def running(self, name: str) -> Shell | None:
        """The shell named `name` if it is up and alive, else None (nothing is started)."""
        shell = self.get(name)
        return shell if shell is not None and shell.alive else None

    def folder(self, name: str) -> str | None:
        """The folder of the shell named `name` (its last, if it exited); None for a name not known."""
        shell = self.get(name)
        return None if shell is None else shell.cwd

    def start(self, name: str, cwd: str | None = None) -> Shell:
        """The shell named `name`, started if it is not up: in `cwd` (relative to the registry's folder),
        else in the registry's folder."""
        with self._lock:
            shell = self._shells.get(name)
            if shell is not None and shell.alive:
                return shell
        start_in = cwd or self.cwd
        if not os.path.isabs(start_in):
            start_in = os.path.join(self.cwd, start_in)
        if not os.path.isdir(start_in):
            raise RunnerError(INVALID_PARAMS, f"param 'cwd': no such folder: {start_in}")
        definitions_dir = self.definitions_dir
        if definitions_dir is not None:
            try:
                os.makedirs(definitions_dir, mode=0o700, exist_ok=True)
            except OSError:
                definitions_dir = None  # completion goes without the shell's functions and aliases
        shell = Shell(name, start_in, log_dir=self.log_dir, output_limit=self.output_limit,
                      on_exit=self._exited, definitions_dir=definitions_dir)
        with self._lock:
            self._shells[name] = shell
        self._write_pids()
        return shell

    def close(self, name: str) -> Shell:
        """End the shell named `name` and forget it; UNKNOWN_SHELL when it is not up (one that exited
        is forgotten all the same)."""
        with self._lock:
            shell = self._shells.pop(name, None)
        if shell is None or not shell.alive:
            raise RunnerError(UNKNOWN_SHELL, f"no shell named '{name}'")
        shell.close()
        return shell

    def _up(self) -> list[Shell]:
        with self._lock:
            return [shell for shell in self._shells.values() if shell.alive]

    def describe(self) -> list[dict[str, Any]]:
        shells = self._up()
        return [shell.describe() for shell in sorted(shells, key=lambda s: s.name)]

    def kill_all(self) -> None:
        for shell in self._up():  # an exited shell's pid may be another process's by now
            shell.kill()

    def close_all(self) -> None:
        """End every shell and wait for each; the registry is empty after."""
        with self._lock:
            shells = [shell for shell in self._shells.values() if shell.alive]
            self._shells.clear()
        for shell in shells:
            shell.close()

    def _exited(self, shell: Shell) -> None:
        log.info("shell %s (pid %s) exited with status %s in %s", shell.name, shell.pid, shell.exit_status, shell.cwd)
        self._write_pids()  # it stays named, dead, for its folder (see the module's note)

    def _write_pids(self) -> None:
        if self.pids_folder is None:
            return
        pids = sorted(shell.pid for shell in self._up())
        path = os.path.join(self.pids_folder, PIDS_FILE)
        try:
            with open(path + ".tmp", "w") as f:
                f.write("".join(f"{pid}\n" for pid in pids))
            os.replace(path + ".tmp", path)
        except OSError:
            pass
