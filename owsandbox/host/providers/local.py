"""The `local` provider: the daemon as a process on this machine, with no isolation.

It runs the very zipapp that other providers copy into their boxes, so what is tested here is what
runs there. The daemon lives in a session of its own (Stop in a terminal does not reach it). By
default it leaves with its parent (`--exit-with-parent`). Given a `key` (the kernel's id), its
folder is stable and it lingers a while after its last client instead, so a restarting kernel finds
it again with its long-running programs; `destroy()` ends it for good.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ...box.daemonctl import serving
from ...box.procstat import descendants, pid_alive, session_members
from ...logs import log_level_args
from ...protocol.paths import inside
from ...settings import Settings, settings_of
from ..bundle import build_runner_zipapp
from ..privatedir import runtime_root
from ..transport import PipeTransport
from .base import Provider


class _Launcher:
    """Starts daemons from one thread that lives as long as the process.

    A "die with parent" signal (bubblewrap's --die-with-parent, PR_SET_PDEATHSIG) fires when the
    *thread* that forked the child ends, not the process. The kernel creates its sandbox on a
    short-lived thread, so daemons are forked here instead.
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def spawn(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="daemon-launcher", daemon=True)
                self._thread.start()
        done: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._jobs.put((argv, kwargs, done))
        result = done.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def _run(self) -> None:
        while True:
            argv, kwargs, done = self._jobs.get()
            try:
                done.put(subprocess.Popen(argv, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.put(exc)


_LAUNCHER = _Launcher()


CLAIM_FILE = "kernel.lock"  # in a keyed state folder: locked (shared) by each kernel that uses it, while it does


def claimed(folder: Path) -> bool:
    """Whether a kernel holds `folder` (its lock on CLAIM_FILE: released by the system when the kernel ends)."""
    try:
        fd = os.open(folder / CLAIM_FILE, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def sweep_dead_state(root: Path, keep: str) -> None:
    """Remove the folders of keyed daemons that are gone (a kernel that was killed leaves one behind
    once its daemon stops lingering). Only folders this provider made (they hold daemon.json), and never
    one a kernel still holds: a box killed under a live kernel is restarted by that kernel, in that folder."""
    for folder in root.iterdir():
        record = folder / "daemon.json"
        if folder.name == keep or not record.is_file() or claimed(folder):
            continue
        try:
            info = json.loads(record.read_text())
            pid = info.get("init_pid", info.get("pid"))
        except (OSError, ValueError, AttributeError):
            continue
        if pid_alive(pid) or serving(str(folder)):
            continue  # alive, or still served (a daemon whose record is older than it)
        for cgroup in (info.get("limits") or {}).get("folders", {}).values():
            try:
                os.rmdir(cgroup)  # the sandbox's own cgroups, empty once it is gone
            except OSError:
                pass
        shutil.rmtree(folder, ignore_errors=True)


class LocalProvider(Provider):
    name = "local"
    enforcement = "none"
    network_fixed = ("there is no sandbox here (no isolation): commands use this machine's network as you do, and "
                     "nothing turns it off for them")
    shares_host_files = True  # the daemon runs on this machine (bwrap binds the workspace at its own path)
    snapshots_refused = ("it runs commands on this machine with your permissions, in no box: nothing could stop "
                         "what a cell started while the files go back, and a restore would write wherever your own "
                         "files are. Use the bwrap or container provider")

    def __init__(self, cwd: str | os.PathLike[str] | None = None, runner_path: str | os.PathLike[str] | None = None,
                 relay_silence_seconds: float = 60.0, python: str | None = None, start_timeout: float = 20.0,
                 daemon_args: list[str] | None = None, key: str | None = None, linger_seconds: float = 30.0,
                 settings: Settings | None = None) -> None:
        self.settings = settings_of(settings)
        self.cwd = str(Path(cwd or os.getcwd()).resolve())
        self.runner_path = str(runner_path) if runner_path else None
        self.relay_silence_seconds = relay_silence_seconds
        self.python = python or sys.executable
        self.start_timeout = start_timeout
        self.daemon_args = list(daemon_args or [])
        self.key = key
        self.linger_seconds = linger_seconds
        self.state_dir: str | None = None
        self.socket_path = ""
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_pid: int | None = None
        self.daemon_info: dict[str, Any] = {}
        self._lifecycle = threading.RLock()  # a restart of the box and a reconnecting client may race

    def create(self) -> None:
        # checked once: it may warn
        root = runtime_root(avoid=self.cwd) if self.runner_path is None or self.key else Path()
        if self.runner_path is None:
            # In the private runtime folder, never under the home folder (~/.cache), which a workspace may be or
            # hold: the host runs this file for every relay, so a box that could rewrite it would run outside.
            # With the bytecode of the Python that runs it: its daemon and relays start without compiling, and
            # idle smaller (bundle.py).
            self.runner_path = str(build_runner_zipapp(root / "runners", python=self.python))
        if self.key:
            sweep_dead_state(root, keep=self.key)
            folder = root / self.key
            folder.mkdir(mode=0o700, exist_ok=True)
            self.state_dir = str(folder)
            self._claim_state(folder)
        else:
            temporary = os.path.realpath(tempfile.gettempdir())  # not in the workspace (a notebook in /tmp)
            self.state_dir = tempfile.mkdtemp(prefix="owsandbox-", dir=str(runtime_root(avoid=self.cwd))
                                              if inside(temporary, self.cwd) else None)
        self.socket_path = os.path.join(self.state_dir, "run", "runner.sock")
        if self.key and self._adopt_running_daemon():
            self.reused = True
            return
        self._start_daemon()

    def _record(self) -> dict[str, Any] | None:
        """The host's own record of the daemon (daemon.json in the state folder), or None."""
        assert self.state_dir
        try:
            info = json.loads(Path(self.state_dir, "daemon.json").read_text())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def _adopt_running_daemon(self) -> bool:
        assert self.state_dir
        info = self._record()
        if info is None or not serving(self.state_dir) or not pid_alive(info.get("pid")):
            return False
        self.daemon_info, self.daemon_pid = info, info["pid"]
        return True

    def _start_daemon(self) -> None:
        assert self.state_dir and self.runner_path
        lifetime = ["--linger", str(self.linger_seconds)] if self.key else ["--exit-with-parent"]
        serve = ["serve", "--socket", self.socket_path, "--cwd", self.cwd, *lifetime, *log_level_args(self.settings),
                 *self.daemon_args]
        log = self._open_log()
        try:
            self.daemon = _LAUNCHER.spawn(self.daemon_argv(serve), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=log, start_new_session=True)
        finally:
            os.close(log)
        self.daemon_pid = self.daemon.pid
        self.daemon_info = self._await_ready()
        Path(self.state_dir, "daemon.json").write_text(json.dumps(self.daemon_info))

    def _open_log(self) -> int:
        """The daemon's log, for appending: never through a link someone put in its place."""
        assert self.state_dir
        return os.open(os.path.join(self.state_dir, "daemon.log"),
                       os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    def daemon_argv(self, serve: list[str]) -> list[str]:
        """The command that starts the daemon; isolating providers wrap it."""
        assert self.runner_path
        return [self.python, "-S", self.runner_path, *serve]

    def _await_ready(self) -> dict[str, Any]:
        assert self.daemon and self.daemon.stdout
        fd = self.daemon.stdout.fileno()
        deadline = time.monotonic() + self.start_timeout
        buffer = b""
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(remaining, 0))
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                self._stop_daemon()
                raise RuntimeError(f"the runner daemon did not start: {self._log_tail() or 'no message'}")
            buffer += chunk
        self.daemon.stdout.close()
        return json.loads(buffer.split(b"\n", 1)[0])

    def _log_tail(self) -> str:
        if not self.state_dir:
            return ""
        try:
            return Path(self.state_dir, "daemon.log").read_text(errors="replace").strip()[-2000:]
        except OSError:
            return ""

    def open_runner(self) -> PipeTransport:
        assert self.runner_path, "create() first"
        with self._lifecycle:
            if not pid_alive(self.daemon_pid):
                # The daemon died (killed, or the machine ran out of memory): start a new one, as a
                # sandbox would restart. The client sees a new instance and reports the lost command.
                self._stop_daemon()
                self._start_daemon()
        return PipeTransport([self.python, "-S", self.runner_path, "attach", "--socket", self.socket_path,
                              "--silence-seconds", str(self.relay_silence_seconds)])

    def _stop_daemon(self) -> None:
        daemon, self.daemon = self.daemon, None
        pid, self.daemon_pid = self.daemon_pid, None
        if pid is None:
            return
        family = descendants(pid) + self._recorded_shells()  # shells lead sessions of their own
        if pid_alive(pid):
            os.kill(pid, signal.SIGTERM)  # it ends its shells and removes its socket
            deadline = time.monotonic() + 5
            while pid_alive(pid) and time.monotonic() < deadline:
                if daemon is not None:
                    try:
                        daemon.wait(0.05)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    time.sleep(0.02)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        if daemon is not None:
            daemon.wait()
        # Anything left behind goes too, and is waited for: a destroyed sandbox runs nothing.
        members = session_members(pid) + [m for shell in self._recorded_shells() for m in session_members(shell)]
        leftovers = [p for p in set(family + members) if pid_alive(p)]
        for member in leftovers:
            try:
                os.kill(member, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in leftovers) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _recorded_shells(self) -> list[int]:
        """The shells the daemon wrote down (they outlive a daemon that was killed), still bash."""
        from ...box.shell.registry import read_pids  # with the box's shell code: not needed to start a kernel

        found = []
        for pid in read_pids(os.path.dirname(self.socket_path)):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "bash":
                        found.append(pid)
            except OSError:
                continue
        return found

    def _claim_state(self, folder: Path) -> None:
        """Hold the keyed state folder while this kernel uses it (`claimed`), so no other start sweeps it."""
        if getattr(self, "_claim", None) is None:
            fd = os.open(folder / CLAIM_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
            self._claim: int | None = fd

    def _unclaim_state(self) -> None:
        fd, self._claim = getattr(self, "_claim", None), None
        if fd is not None:
            os.close(fd)

    def release(self) -> None:
        """Leave the daemon running (it lingers for a restarting kernel); forget it here."""
        if self.daemon is not None and self.daemon.stdout is not None:
            self.daemon.stdout.close()
        self.daemon = None
        self._unclaim_state()

    def destroy(self) -> None:
        with self._lifecycle:
            self._stop_daemon()
        self._unclaim_state()
        if self.state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            self.state_dir = None

    def headline(self) -> list[str]:
        return ["local", self.fallback_reason or "no isolation: commands run on this machine with your permissions"]

    def describe(self) -> dict[str, Any]:
        info = {**super().describe(), "cwd": self.cwd, "socket": self.socket_path, "daemon_pid": self.daemon_pid}
        if self.fallback_reason:
            info["note"] = self.fallback_reason
        return info
