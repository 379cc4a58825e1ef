"""The daemon inside the sandbox: its parts wired together, and `serve`, which runs it.

The parts have one job each: the socket server (`server.py`: the Unix socket, the newest connection
wins), the dispatcher (`dispatch.py`: the method table, params, control at once and work on threads),
the shell registry (`shell/registry.py`: named shells, their last folders, the pids file) and the
records (`outbox.py`: answers kept until acked, a request id run once). `Daemon` owns what they
share: the folders, the instance id, the execd endpoint for `%attach`, and what `runner.hello` says.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import protocol as P
from .dispatch import Dispatcher
from .execd.endpoint import ExecdServer
from .footprint import keep_address_space_small
from .hardening import keep_to_itself, make_undumpable
from .log import getLogger
from .outbox import Records
from .server import Connection, SocketServer
from .shell.bash import DEFAULT_OUTPUT_LIMIT
from .shell.registry import ShellRegistry

log = getLogger(__name__)


def _token_urlsafe(nbytes: int) -> str:
    """`secrets.token_urlsafe`, without importing `secrets` (and `random`, which it imports) for it."""
    import base64

    return base64.urlsafe_b64encode(os.urandom(nbytes)).rstrip(b"=").decode("ascii")

RUNNER_VERSION = "0.1.0"


class Daemon:
    def __init__(self, socket_path: str, cwd: str | None = None, log_dir: str | None = None,
                 max_frame_bytes: int = P.DEFAULT_MAX_FRAME_BYTES,
                 output_limit: int = DEFAULT_OUTPUT_LIMIT, listen_fd: int | None = None,
                 execd_fd: int | None = None) -> None:
        self.socket_path = os.path.abspath(socket_path)
        folder = os.path.dirname(self.socket_path)
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.log_dir = log_dir or os.path.join(folder, "logs")
        self.max_frame_bytes = max_frame_bytes
        self.output_limit = output_limit
        self.instance_id = os.urandom(16).hex()  # os.urandom, not uuid or secrets: their imports cost memory
        self.started = time.time()
        self.records = Records()
        self.shells = ShellRegistry(self.cwd, log_dir=self.log_dir, output_limit=output_limit,
                                    definitions_dir=os.path.join(folder, "definitions"), pids_folder=folder)
        self.server = SocketServer(self.socket_path, self._on_message, max_frame_bytes, listen_fd)
        self.dispatcher = Dispatcher(self.records, self.shells, self.server.send_live, self.describe,
                                     self.instance_id)
        # Given, like the daemon's own socket, by a host that makes the files the box cannot replace.
        given_execd = socket.socket(fileno=execd_fd) if execd_fd is not None else None
        self.execd = ExecdServer(_token_urlsafe(24), unix_path=os.path.join(folder, "execd.sock"),
                                 cwd=self.cwd, unix_listener=given_execd)

    def _on_message(self, conn: Connection, message: dict[str, Any]) -> None:
        self.dispatcher.handle(conn, message)

    def listen(self) -> None:
        self.server.listen()
        self.execd.start()  # long-running programs for %attach, in the same private folder

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def shutdown(self) -> None:
        try:
            self.execd.stop()
        except Exception:  # noqa: BLE001 - the shells must still go
            log.exception("the execd endpoint did not stop cleanly")
        # The client's pipe goes first: an answer born of the dying shells ("the shell exited") must
        # not reach a client that is to learn that the outcome of its command is unknown.
        self.server.close()
        self.shells.kill_all()

    def describe(self) -> dict[str, Any]:
        """What `runner.hello` answers."""
        return {
            "protocol_version": P.PROTOCOL_VERSION,
            "runner_version": RUNNER_VERSION,
            "instance_id": self.instance_id,
            "pid": os.getpid(),
            # os.uname() and sys.version, as `platform` reads them (its module is 0.1 MiB of a daemon)
            "os": f"{os.uname().sysname} {os.uname().release}",
            "machine": os.uname().machine,
            "python": sys.version.split()[0],
            "shell": _bash_version(),
            "cwd": self.cwd,
            "shells": self.shells.describe(),
            "last_seq": self.records.last_seq,
            "max_frame_bytes": self.max_frame_bytes,
            "output_limit": self.output_limit,
            "log_dir": self.log_dir,
            # where `%attach` keeps its registry of programs and cursors: in the box, beside the logs
            "attach_registry": os.path.join(os.path.dirname(self.log_dir), "attach.json"),
            "uptime_s": round(time.time() - self.started, 3),
            "execd": self.execd.address(),
        }


_BASH_VERSION: str | None = None


def _bash_version() -> str:
    global _BASH_VERSION
    if _BASH_VERSION is None:
        import subprocess

        try:
            out = subprocess.run(["bash", "-c", "echo $BASH_VERSION"], capture_output=True, text=True, timeout=10)
            _BASH_VERSION = f"bash {out.stdout.strip()}"
        except (OSError, subprocess.SubprocessError):
            _BASH_VERSION = "bash (version unknown)"
    return _BASH_VERSION


def _watch_parent(on_orphaned: Callable[[], None]) -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.25)
        on_orphaned()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _watch_clients(daemon: Daemon, linger: float, on_alone: Callable[[], None]) -> None:
    """Stop after `linger` seconds with no client: a kernel that restarts comes back within that."""

    def watch() -> None:
        alone_since: float | None = None
        while True:
            time.sleep(min(linger / 4, 1.0))
            if daemon.server.has_client:
                alone_since = None
            elif alone_since is None:
                alone_since = time.monotonic()
            elif time.monotonic() - alone_since >= linger:
                on_alone()
                return

    threading.Thread(target=watch, name="linger-watch", daemon=True).start()


def serve(socket_path: str, cwd: str | None, exit_with_parent: bool, log_dir: str | None = None,
          max_frame_bytes: int = P.DEFAULT_MAX_FRAME_BYTES, output_limit: int = DEFAULT_OUTPUT_LIMIT,
          linger: float = 0, listen_fd: int | None = None, execd_fd: int | None = None,
          end_namespace: bool = False) -> int:
    # Before anything else: out of reach of the cells (/proc/<pid>/fd, ptrace, pidfd_getfd), and the
    # host's sockets kept from every process the daemon starts.
    not_guarded = make_undumpable()
    if not_guarded:
        log.warning("the daemon could not make itself non-dumpable (%s): same-user processes can reach its files",
                    not_guarded)
    keep_to_itself(listen_fd, execd_fd)
    keep_address_space_small()  # under rlimits, the memory limit bounds the daemon's address space too
    daemon = Daemon(socket_path, cwd, log_dir, max_frame_bytes, output_limit, listen_fd, execd_fd)
    daemon.listen()
    threading.Thread(target=_bash_version, name="bash-version", daemon=True).start()  # for hello, ahead of it
    done = threading.Event()

    def stop(*_args: Any) -> None:
        daemon.shutdown()
        done.set()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop)
    if exit_with_parent:
        _watch_parent(stop)
    if linger > 0:
        _watch_clients(daemon, linger, stop)
    # Tell whoever started us that the socket is ready, then keep stdout for nothing else.
    # The execd token goes to the host here, once, so that the host's own record of the sandbox lets a
    # terminal (`owsandbox shell`) reach the endpoint without taking the kernel's place on the runner socket.
    ready = {"ready": True, "socket": daemon.socket_path, "pid": os.getpid(), "instance_id": daemon.instance_id,
             "execd_token": daemon.execd.token}
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    server = threading.Thread(target=daemon.serve_forever, name="accept", daemon=True)
    server.start()
    while not done.wait(1.0):
        pass
    if end_namespace:
        # The sandbox's init waits for every process in the namespace, so a double-forked or setsid
        # program would keep the sandbox alive after its kernel is gone: end them all on the way out.
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    return 0
