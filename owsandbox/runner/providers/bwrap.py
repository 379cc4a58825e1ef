"""The `bwrap` provider: the daemon and every shell inside a bubblewrap sandbox.

What a person expects of the word sandbox on one machine: the workspace folder is writable, the
system is read-only, `/tmp` is private, home folders (and the secrets in them, `~/.ssh`, `~/.aws`)
are not there, there is no network unless asked for, processes live in their own PID namespace
and die with the kernel. The daemon's socket sits in a private folder bound into the box at the same
path, so the relay runs outside and reaches it across the network namespace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache
from typing import Any

from .local import LocalProvider

NETWORK_ENV = "OWSANDBOX_NETWORK"


@lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """None when bubblewrap can make a sandbox here, else why not."""
    binary = shutil.which("bwrap")
    if binary is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        done = subprocess.run([binary, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
                               "--unshare-net", "--die-with-parent", "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not run: {exc}"
    if done.returncode != 0:
        return f"bwrap cannot make a sandbox here: {done.stderr.decode(errors='replace').strip()}"
    return None


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


class BwrapProvider(LocalProvider):
    name = "bwrap"
    enforcement = "bubblewrap"

    def __init__(self, cwd: str | os.PathLike[str] | None = None, network: bool | None = None,
                 **options: Any) -> None:
        super().__init__(cwd, **options)
        self.network = network if network is not None else os.environ.get(NETWORK_ENV, "") in ("1", "true", "yes")
        self.hidden = self._hidden_folders()

    @staticmethod
    def _hidden_folders() -> list[str]:
        folders = {os.path.expanduser("~"), "/home", "/root"}
        return sorted(f for f in folders if f and f != "/" and os.path.isdir(f))

    def create(self) -> None:
        problem = bwrap_problem()
        if problem is not None:
            raise RuntimeError(problem)
        super().create()

    def daemon_argv(self, serve: list[str]) -> list[str]:
        assert self.state_dir and self.runner_path
        # The box sees the runner in its own folder: home folders, where a cache would be, are hidden.
        inside_runner = os.path.join(self.state_dir, os.path.basename(self.runner_path))
        if not os.path.exists(inside_runner):
            shutil.copyfile(self.runner_path, inside_runner)
        python = os.path.realpath(self.python)
        return [*self.bwrap_args(python), "--", python, "-S", inside_runner, *serve]

    def bwrap_args(self, python: str) -> list[str]:
        assert self.state_dir
        args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox", "--new-session"]
        if not self.network:
            args.append("--unshare-net")
        if not self.key:
            args.append("--die-with-parent")  # with a key, the daemon lingers for a restarting kernel
        for folder in self.hidden:
            args += ["--tmpfs", folder]
        # What must stay visible inside a hidden folder comes back: the interpreter, the workspace.
        prefix = os.path.realpath(sys.base_prefix)
        if any(_inside(python, folder) or _inside(prefix, folder) for folder in self.hidden):
            args += ["--ro-bind", prefix, prefix]
        args += ["--bind", self.cwd, self.cwd, "--bind", self.state_dir, self.state_dir, "--chdir", self.cwd]
        args += ["--setenv", "HOME", os.path.expanduser("~"), "--setenv", "OWSANDBOX_SANDBOX", "bwrap"]
        return args

    def describe(self) -> dict[str, Any]:
        mounts = {"/": "read-only", "/tmp": "private (empty)", self.cwd: "read-write (the workspace)"}
        for folder in self.hidden:
            mounts[folder] = "hidden (empty)"
        return {**super().describe(), "network": "on" if self.network else "none", "mounts": mounts,
                "pid namespace": "own", "dies with": "the kernel" if not self.key else "its last client (linger)"}


def auto_provider(cwd: str | os.PathLike[str] | None = None, **options: Any) -> LocalProvider:
    """`bwrap` where it works here; else `local`, saying plainly that nothing is isolated."""
    problem = bwrap_problem()
    if problem is None:
        return BwrapProvider(cwd, **options)
    options.pop("network", None)
    provider = LocalProvider(cwd, **options)
    provider.fallback_reason = f"no isolation: {problem}, so the sandbox is the local machine"
    return provider


def auto_enforcement() -> str:
    return BwrapProvider.enforcement if bwrap_problem() is None else LocalProvider.enforcement
