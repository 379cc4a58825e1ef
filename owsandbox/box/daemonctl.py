"""Starting and stopping a detached daemon in a box that is reached only through commands.

Two callers need this: the box's bootstrap (`bootstrap.py`, which the `exec` provider runs over ssh
or `docker exec` and the OpenSandbox provider in an execd session) and a relay that finds its daemon
gone (`attach --start`). Each imports this module from the zipapp it has just made sure of, so the
box has one way to do it. A state folder holds `run/runner.sock`, `ready.json` (the daemon's first
line: its pid and execd endpoint) and `daemon.log`. Every listening Unix socket is made one way too
(`listen_unix`): the daemon's, its execd endpoint's, those a host hands a box, and the host's forward
bridge to an `exec` box's endpoint.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from .procstat import pid_alive


class DaemonError(RuntimeError):
    """The daemon did not start; the message carries the end of its log."""


def socket_path(folder: str) -> str:
    return os.path.join(folder, "run", "runner.sock")


def serving(folder: str) -> bool:
    """Whether a daemon listens on the folder's socket."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(socket_path(folder))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def recorded(folder: str) -> dict[str, Any]:
    """The first line the daemon printed, or {} when there is none."""
    try:
        with open(os.path.join(folder, "ready.json")) as f:
            info = json.loads(f.readline())
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


class AlreadyServing(OSError):
    """Another server answers on the socket's path."""


def listen_unix(path: str, backlog: int = 64) -> socket.socket:
    """A listening Unix socket at `path`, readable and writable by this user only (its folder is the
    caller's). A socket file nobody answers on is left behind by a server that died and is replaced;
    one that answers is another server's, and is refused."""
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)
        else:
            raise AlreadyServing(f"a server is already listening on {path}")
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(path)
    except BaseException:
        listener.close()
        raise
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    listener.listen(backlog)
    return listener


def ours(pid: int, folder: str) -> bool:
    """Alive and still this folder's daemon (a pid can be reused after it died)."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return socket_path(folder).encode() in f.read().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc to read: the pid alone said it is alive
        return True


def start(folder: str, serve_args: list[str], runner: str | None = None, timeout: float = 20.0) -> dict[str, Any]:
    """Make sure a daemon serves `folder`: `{"daemon": its first line, "reused": bool}`.

    A new daemon runs in its own session, so it outlives the command that started it. Starters are
    serialised by a lock in the folder: a relay that finds no daemon (`attach --start`) and a provider
    restarting one can ask at the same moment, and only one of them may start it.
    """
    import fcntl

    os.makedirs(os.path.dirname(socket_path(folder)), mode=0o700, exist_ok=True)
    with open(os.path.join(folder, "start.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start_locked(folder, serve_args, runner, timeout)


def _start_locked(folder: str, serve_args: list[str], runner: str | None, timeout: float) -> dict[str, Any]:
    if serving(folder):
        return {"daemon": recorded(folder), "reused": True}
    ready = os.path.join(folder, "ready.json")
    log_path = os.path.join(folder, "daemon.log")
    if os.path.exists(ready):
        os.unlink(ready)
    argv = [sys.executable, "-S", runner or sys.argv[0], "serve", "--socket", socket_path(folder), *serve_args]
    with open(ready, "wb") as stdout, open(log_path, "ab") as log:
        daemon = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=log,
                                  start_new_session=True, close_fds=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(ready) as f:
            line = f.readline()
        if line.endswith("\n"):
            return {"daemon": json.loads(line), "reused": False}
        if daemon.poll() is not None:
            break
        time.sleep(0.01)
    try:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-2000:].strip()
    except OSError:
        tail = ""
    raise DaemonError("the runner daemon did not start: " + (tail or "no message"))


def stop(folder: str, remove: bool = False, grace: float = 5.0) -> None:
    """End the folder's daemon (TERM, which ends its shells; KILL after `grace`), and remove the folder."""
    pid = recorded(folder).get("pid")
    if isinstance(pid, int) and ours(pid, folder):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while ours(pid, folder) and time.monotonic() < deadline:
            time.sleep(0.02)
        if ours(pid, folder):
            os.kill(pid, signal.SIGKILL)
    if remove:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
