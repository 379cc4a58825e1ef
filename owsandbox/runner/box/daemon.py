"""The daemon inside the sandbox: one Unix socket, one client at a time, answers kept until acked.

The newest connection wins (a reconnecting client replaces a pipe that died without telling
anyone). Requests that may take long run on threads of their own; control requests (hello, resume,
interrupt, list) are answered at once on the connection's thread, so Stop never waits behind work.
Every answer to work goes through the outbox with a `seq` and is replayed on `session.resume`;
a request id seen twice runs once.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from . import complete, fsops, params, procs, searchchild
from . import protocol as P
from .daemonctl import AlreadyServing, listen_unix
from .execd import ExecdServer
from .outbox import ANSWERED, NEW, Outbox, RequestLedger
from .shells import DEFAULT_OUTPUT_LIMIT, Shell
from .terminal import DEFAULT_COLS, DEFAULT_ROWS

RUNNER_VERSION = "0.1.0"
_CONTROL = {"runner.hello", "session.resume", "shell.interrupt", "shell.list"}


class Connection:
    """One client pipe. Sends are serialised; a failed send closes the connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.closed = False

    def send(self, frame: bytes) -> bool:
        with self.lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(frame)
                return True
            except OSError:
                self._close_locked()
                return False

    def close(self) -> None:
        with self.lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()


class Daemon:
    def __init__(self, socket_path: str, cwd: str | None = None, log_dir: str | None = None,
                 max_frame_bytes: int = P.DEFAULT_MAX_FRAME_BYTES,
                 output_limit: int = DEFAULT_OUTPUT_LIMIT, listen_fd: int | None = None,
                 execd_fd: int | None = None) -> None:
        self.socket_path = os.path.abspath(socket_path)
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.log_dir = log_dir or os.path.join(os.path.dirname(self.socket_path), "logs")
        self.definitions_dir = os.path.join(os.path.dirname(self.socket_path), "definitions")  # complete.py
        self.max_frame_bytes = max_frame_bytes
        self.output_limit = output_limit
        self.instance_id = uuid.uuid4().hex
        self.started = time.time()
        self.outbox = Outbox()
        self.ledger = RequestLedger()
        self._state = threading.Lock()  # outbox, ledger, connection
        self._conn: Connection | None = None
        self._shells: dict[str, Shell] = {}
        self._last_folders: dict[str, str] = {}
        self._shells_lock = threading.Lock()
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        # Sockets made by whoever started the box: it connects to files the box cannot replace.
        self._given_listener = socket.socket(fileno=listen_fd) if listen_fd is not None else None
        given_execd = socket.socket(fileno=execd_fd) if execd_fd is not None else None
        self._workers = threading.BoundedSemaphore(64)
        self.execd = ExecdServer(secrets.token_urlsafe(24),
                                 unix_path=os.path.join(os.path.dirname(self.socket_path), "execd.sock"), cwd=self.cwd,
                                 unix_listener=given_execd)

    # -- socket -----------------------------------------------------------------------------

    def listen(self) -> None:
        folder = os.path.dirname(self.socket_path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        if self._given_listener is not None:
            self._listener = self._given_listener
            self.execd.start()
            return
        try:
            self._listener = listen_unix(self.socket_path, backlog=16)
        except AlreadyServing:
            raise SystemExit(f"a runner daemon is already serving {self.socket_path}") from None
        self.execd.start()  # long-running programs for %attach, in the same private folder

    def serve_forever(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                raise
            conn = Connection(sock)
            with self._state:
                old, self._conn = self._conn, conn
            if old is not None:
                old.close()  # the newest connection wins
            threading.Thread(target=self._read_connection, args=(conn,), daemon=True).start()

    def shutdown(self) -> None:
        self._stopping.set()
        try:
            self.execd.stop()
        except Exception:  # noqa: BLE001 - the shells must still go
            pass
        with self._shells_lock:
            shells = list(self._shells.values())
        for shell in shells:
            shell.kill()
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        if self._given_listener is None:
            try:
                os.unlink(self.socket_path)
            except OSError:
                pass
        with self._state:
            conn = self._conn
        if conn is not None:
            conn.close()

    def _read_connection(self, conn: Connection) -> None:
        splitter = P.LineSplitter(self.max_frame_bytes)
        while not conn.closed:
            try:
                data = conn.sock.recv(262144)
            except OSError:
                break
            if not data:
                break
            for line in splitter.feed(data):
                if isinstance(line, P.Oversize):
                    self._reject_oversize(conn, line)
                    continue
                message = P.decode(line)
                if message is not None:
                    self._handle(conn, message)
        with self._state:
            if self._conn is conn:
                self._conn = None
        conn.close()

    def _reject_oversize(self, conn: Connection, line: P.Oversize) -> None:
        request_id = P.sniff_id(line.head)
        conn.send(P.encode(P.error(request_id, P.INVALID_REQUEST,
                                   f"frame of {line.size} bytes is larger than the limit of "
                                   f"{self.max_frame_bytes} bytes; nothing was run")))

    # -- sending ----------------------------------------------------------------------------

    def _send_live(self, frame: bytes) -> None:
        conn = self._conn
        if conn is not None:
            conn.send(frame)

    def _answer(self, request_id: Any, value: Any = None, err: P.RunnerError | None = None) -> None:
        message = P.error(request_id, err.code, err.message, err.data) if err else P.result(request_id, value)

        def frame_for(seq: int) -> bytes:
            message["seq"] = seq
            return P.encode(message)

        with self._state:
            seq, frame = self.outbox.add(frame_for, request_id)
            self.ledger.answered(request_id, seq)
            conn = self._conn
        if conn is not None:
            conn.send(frame)

    # -- dispatch ---------------------------------------------------------------------------

    def _handle(self, conn: Connection, message: dict[str, Any]) -> None:
        method = message.get("method")
        request_id = message.get("id")
        raw_params = message.get("params", {})
        if not isinstance(method, str):
            if "result" not in message and "error" not in message:
                conn.send(P.encode(P.error(request_id, P.INVALID_REQUEST, "a request needs a 'method' string")))
            return
        if not isinstance(raw_params, dict):
            if request_id is not None:
                conn.send(P.encode(P.error(request_id, P.INVALID_PARAMS, "'params' must be an object")))
            return
        if request_id is None:
            self._notification(method, raw_params)
            return
        if method in _CONTROL:
            self._control(conn, request_id, method, raw_params)
            return
        with self._state:
            state, seq = self.ledger.begin(request_id)
            replay = self.outbox.frame_for(seq) if state == ANSWERED and seq is not None else None
        if state == ANSWERED:
            if replay is None:  # answered, but the answer is no longer kept: say so, run nothing
                replay = P.encode(P.error(request_id, P.UNKNOWN_TASK,
                                          f"request '{request_id}' already ran and its answer is no longer kept; "
                                          "its outcome is unknown"))
            conn.send(replay)
            return
        if state != NEW:
            return  # running already: its answer comes when it is done
        handler = self._work_handler(method)
        if handler is None:
            self._answer(request_id, err=P.RunnerError(P.METHOD_NOT_FOUND, f"unknown method '{method}'"))
            return
        if method == "shell.run" and self._try_run_inline(request_id, raw_params):
            return
        threading.Thread(target=self._run_handler, args=(request_id, handler, raw_params), daemon=True).start()

    def _run_handler(self, request_id: Any, handler: Callable[[Any, dict[str, Any]], Any],
                     raw_params: dict[str, Any]) -> None:
        with self._workers:
            try:
                value = handler(request_id, raw_params)
            except P.RunnerError as err:
                self._answer(request_id, err=err)
            except Exception as exc:  # noqa: BLE001 - the daemon keeps serving
                self._answer(request_id, err=P.RunnerError(P.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"))
            else:
                if value is not _DEFERRED:
                    self._answer(request_id, value)

    def _work_handler(self, method: str) -> Callable[[Any, dict[str, Any]], Any] | None:
        if method == "shell.run":
            return self._shell_run
        if method == "shell.close":
            return lambda _id, p: self._shell_close(p)
        if method == "shell.input":
            return lambda _id, p: self._shell_input(p)
        if method == "shell.complete":
            return lambda _id, p: self._shell_complete(p, complete.shell_complete)
        if method == "shell.inspect":
            return lambda _id, p: self._shell_complete(p, complete.shell_inspect)
        # searchchild's fs.search replaces fsops': a regex can hold the GIL for minutes, so it runs in a child
        table: dict[str, Callable[[dict[str, Any], str], Any]] = {**fsops.HANDLERS, **procs.HANDLERS,
                                                                  **searchchild.HANDLERS}
        file_handler = table.get(method)
        if file_handler is None:
            return None
        return lambda _id, p: file_handler(p, self._base_folder(p))

    def _notification(self, method: str, raw_params: dict[str, Any]) -> None:
        if method == "session.ack":
            seq = raw_params.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool):
                with self._state:
                    self.outbox.ack(seq)
        # `$/ping` and unknown notifications need nothing: a ping only keeps the relay awake.

    def _control(self, conn: Connection, request_id: Any, method: str, raw_params: dict[str, Any]) -> None:
        try:
            if method == "runner.hello":
                value = self._hello(raw_params)
            elif method == "session.resume":
                value = self._resume(conn, raw_params)
            elif method == "shell.interrupt":
                value = self._shell_interrupt(raw_params)
            else:
                value = {"shells": self.list_shells()}
            conn.send(P.encode(P.result(request_id, value)))
        except P.RunnerError as err:
            conn.send(P.encode(P.error(request_id, err.code, err.message, err.data)))
        except Exception as exc:  # noqa: BLE001
            conn.send(P.encode(P.error(request_id, P.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")))

    # -- methods ----------------------------------------------------------------------------

    def _hello(self, p: dict[str, Any]) -> dict[str, Any]:
        version = params.get(p, "protocol_version", int)
        if version != P.PROTOCOL_VERSION:
            raise P.RunnerError(P.VERSION_MISMATCH,
                                f"this runner speaks protocol version {P.PROTOCOL_VERSION}, the client {version}")
        with self._state:
            last_seq = self.outbox._next_seq - 1
        return {
            "protocol_version": P.PROTOCOL_VERSION,
            "runner_version": RUNNER_VERSION,
            "instance_id": self.instance_id,
            "pid": os.getpid(),
            "os": f"{platform.system()} {platform.release()}",
            "machine": platform.machine(),
            "python": platform.python_version(),
            "shell": _bash_version(),
            "cwd": self.cwd,
            "shells": self.list_shells(),
            "last_seq": last_seq,
            "max_frame_bytes": self.max_frame_bytes,
            "output_limit": self.output_limit,
            "log_dir": self.log_dir,
            # where `%attach` keeps its registry of programs and cursors: in the box, beside the logs
            "attach_registry": os.path.join(os.path.dirname(self.log_dir), "attach.json"),
            "uptime_s": round(time.time() - self.started, 3),
            "execd": self.execd.address(),
        }

    def _resume(self, conn: Connection, p: dict[str, Any]) -> dict[str, Any]:
        last_seq = params.get(p, "last_seq", int)
        with self._state:
            frames, gap = self.outbox.replay(last_seq)
        for frame in frames:
            conn.send(frame)
        return {"instance_id": self.instance_id, "replayed": len(frames), "gap": gap}

    def _base_folder(self, p: dict[str, Any]) -> str:
        name = params.get(p, "shell", str, None)
        if name is None:
            return self.cwd
        with self._shells_lock:
            shell = self._shells.get(name)
            if shell is not None:
                return shell.cwd
            if name in self._last_folders:
                return self._last_folders[name]
        raise P.RunnerError(P.UNKNOWN_SHELL, f"no shell named '{name}'")

    def _get_shell(self, name: str, cwd: str | None) -> Shell:
        with self._shells_lock:
            shell = self._shells.get(name)
            if shell is not None and shell.alive:
                return shell
            start_in = self._last_folders.get(name) or cwd or self.cwd
        if not os.path.isabs(start_in):
            start_in = os.path.join(self.cwd, start_in)
        if not os.path.isdir(start_in):
            raise P.RunnerError(P.INVALID_PARAMS, f"param 'cwd': no such folder: {start_in}")
        try:
            os.makedirs(self.definitions_dir, mode=0o700, exist_ok=True)
            definitions_dir: str | None = self.definitions_dir
        except OSError:
            definitions_dir = None  # completion goes without the shell's functions and aliases
        shell = Shell(name, start_in, log_dir=self.log_dir, output_limit=self.output_limit,
                      on_exit=self._shell_exited, definitions_dir=definitions_dir)
        with self._shells_lock:
            self._shells[name] = shell
            self._last_folders[name] = shell.cwd
        self._note_shells()
        return shell

    def _note_shells(self) -> None:
        """Write the shells' pids beside the socket: if this daemon is killed, whoever cleans up can
        still find them (each shell leads a session of its own, so nothing else ties them to us)."""
        with self._shells_lock:
            pids = sorted(shell.pid for shell in self._shells.values())
        path = os.path.join(os.path.dirname(self.socket_path), "shells.pids")
        try:
            with open(path + ".tmp", "w") as f:
                f.write("".join(f"{pid}\n" for pid in pids))
            os.replace(path + ".tmp", path)
        except OSError:
            pass

    def _shell_exited(self, shell: Shell) -> None:
        with self._shells_lock:
            if self._shells.get(shell.name) is shell:
                del self._shells[shell.name]
                self._last_folders[shell.name] = shell.cwd
        self._note_shells()

    def _run_params(self, p: dict[str, Any]) -> tuple[str, str, str | None, dict[str, Any]]:
        name = params.get(p, "shell", str, "main")
        command = params.get(p, "command", str)
        cwd = params.get(p, "cwd", str, None)
        options = {"timeout_s": params.number(p, "timeout_s", None, minimum=0),
                   "output_limit": params.get(p, "output_limit", int, None),
                   "terminal": params.get(p, "terminal", bool, False),
                   "stdin": params.get(p, "stdin", bool, False),
                   "cols": params.get(p, "cols", int, DEFAULT_COLS), "rows": params.get(p, "rows", int, DEFAULT_ROWS)}
        stderr = params.get(p, "stderr", str, "apart")
        if stderr not in ("apart", "merge"):
            raise P.RunnerError(P.INVALID_PARAMS, f"param 'stderr' must be 'apart' or 'merge', not {stderr!r}")
        options["merge"] = stderr == "merge"
        for size in ("cols", "rows"):
            if not 2 <= options[size] <= 1000:
                raise P.RunnerError(P.INVALID_PARAMS, f"param '{size}' must be between 2 and 1000")
        if options["output_limit"] is not None and options["output_limit"] < 2:
            raise P.RunnerError(P.INVALID_PARAMS, "param 'output_limit' must be at least 2")
        return name, command, cwd, options

    def _try_run_inline(self, request_id: Any, p: dict[str, Any]) -> bool:
        """Start a command on a shell that is already up without a thread hop; False to go the long way."""
        try:
            name, command, _cwd, options = self._run_params(p)
        except P.RunnerError as err:
            self._answer(request_id, err=err)
            return True
        with self._shells_lock:
            shell = self._shells.get(name)
        if shell is None or not shell.alive:
            return False
        self._start(request_id, shell, command, options)
        return True

    def _shell_run(self, request_id: Any, p: dict[str, Any]) -> object:
        name, command, cwd, options = self._run_params(p)
        self._start(request_id, self._get_shell(name, cwd), command, options)
        return _DEFERRED

    def _start(self, request_id: Any, shell: Shell, command: str, options: dict[str, Any]) -> None:
        name = shell.name

        def on_live(frame: dict[str, Any]) -> None:
            if frame.pop("input_wanted", False):
                method = "shell.input_wanted"
            else:
                method = "shell.progress" if frame.pop("progress", False) else "shell.output"
            frame.update(id=request_id, shell=name)
            self._send_live(P.encode(P.notification(method, frame)))

        def on_done(result: dict[str, Any]) -> None:
            result["shell"] = name
            with self._shells_lock:
                self._last_folders[name] = shell.cwd
            self._answer(request_id, result)

        try:
            shell.run(command, on_done, on_live, **options)
        except P.RunnerError as err:
            self._answer(request_id, err=err)

    def _shell_interrupt(self, p: dict[str, Any]) -> dict[str, Any]:
        name = params.get(p, "shell", str, "main")
        with self._shells_lock:
            shell = self._shells.get(name)
        if shell is None:
            raise P.RunnerError(P.UNKNOWN_SHELL, f"no shell named '{name}'")
        return {"shell": name, "interrupted": shell.interrupt()}

    def _shell_input(self, p: dict[str, Any]) -> dict[str, Any]:
        name = params.get(p, "shell", str, "main")
        eof = params.get(p, "eof", bool, False)
        text = None if eof else params.get(p, "text", str)
        with self._shells_lock:
            shell = self._shells.get(name)
        if shell is None:
            raise P.RunnerError(P.UNKNOWN_SHELL, f"no shell named '{name}'")
        shell.write_input(text)
        return {"shell": name, "written": True}

    def _shell_close(self, p: dict[str, Any]) -> dict[str, Any]:
        name = params.get(p, "shell", str)
        with self._shells_lock:
            shell = self._shells.pop(name, None)
            self._last_folders.pop(name, None)
        if shell is None:
            raise P.RunnerError(P.UNKNOWN_SHELL, f"no shell named '{name}'")
        shell.close()
        return {"shell": name, "closed": True}

    def _shell_complete(self, p: dict[str, Any],
                        answer: Callable[[dict[str, Any], str, Callable[[], str | None]], Any]) -> Any:
        """Completion or inspection for a shell, by a fresh bash in its folder (complete.py), with the
        functions and aliases the shell writes if it is idle; a shell not started yet has the defaults."""
        name = params.get(p, "shell", str, "main")
        with self._shells_lock:
            shell = self._shells.get(name)
            cwd = shell.cwd if shell is not None else self._last_folders.get(name, self.cwd)

        def definitions() -> str | None:
            if shell is None:
                return None
            shell.write_definitions()
            return shell.definitions_path

        return answer(p, cwd, definitions)

    def list_shells(self) -> list[dict[str, Any]]:
        with self._shells_lock:
            shells = list(self._shells.values())
        return [shell.describe() for shell in sorted(shells, key=lambda s: s.name)]


_DEFERRED = object()
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
            if daemon._conn is not None:
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
    ready = {"ready": True, "socket": daemon.socket_path, "pid": os.getpid(), "instance_id": daemon.instance_id}
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
