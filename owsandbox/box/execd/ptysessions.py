"""Processes behind the execd-compatible endpoint: one bash per session, with a replay ring.

A session outlives the WebSocket that watches it: a client detaches and later comes back asking for
the output `since` a byte offset. So every output byte, watched or not, goes into a ring of the last
1 MiB with a monotonic counter shared by stdout and stderr (a REPLAY mixes both streams, so a
resume cursor has to count both), and a pump thread drains the process all the time: a detached
process never blocks on output. While a client is attached, the pump hands it each chunk under the
session lock, the same lock under which a new client takes its replay and attaches, so nothing is
lost or doubled between the replay and the live frames.

In pipe mode a line that the program wrote whole reaches the ring whole: a read that ends inside a
line goes on reading that pipe while it has bytes ready, before the other pipe is read. A replay has
nothing that tells stdout from stderr, so the other stream's bytes in the middle of a line would cut
it in two there, and a client resuming from that line's start would read neither half as a record.
(A pump that a busy machine left behind finds a pipe holding more than CHUNK_BYTES, and its read of
CHUNK_BYTES ends wherever it ends.) Standard library only; `pty` and `uuid` are imported by the first
session, as the daemon of a box that never has one does not need them.
"""

from __future__ import annotations

import fcntl
import functools
import os
import selectors
import signal
import struct
import subprocess
import termios
import threading
import time
from typing import Protocol

from ..procstat import session_members

RING_BYTES = 1024 * 1024
CHUNK_BYTES = 32 * 1024  # the most data in one STDOUT/STDERR frame
LINE_FOLLOW_BYTES = RING_BYTES  # how far a read follows an unfinished line before the other pipe may be read
KIND_STDIN = 0x00
KIND_STDOUT = 0x01
KIND_STDERR = 0x02
KIND_REPLAY = 0x03
SIGNALS = {name: getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGKILL", "SIGQUIT", "SIGHUP")}
DEFAULT_COLS, DEFAULT_ROWS = 80, 24
_EXIT_POLL_S = 0.5  # how often the pump looks whether bash exited while something else holds its output
_AFTER_EXIT_S = 1.0  # how long output that is ready is still taken once bash has exited


def _rest_of_line(fd: int, data: bytes) -> bytes:
    """What pipe `fd` holds right now of the line `data` ends inside (b"" when `data` ends a line): read
    until a read ends at a line's end, the pipe is empty, or LINE_FOLLOW_BYTES were taken. A line the
    program wrote in one write of up to PIPE_BUF bytes is in the pipe whole, so it is never cut."""
    more: list[bytes] = []
    taken = 0
    last = data
    while not last.endswith(b"\n") and taken < LINE_FOLLOW_BYTES:
        try:
            last = os.read(fd, CHUNK_BYTES)
        except OSError:  # empty for now (BlockingIOError), or gone: the selector says which next
            break
        if not last:
            break
        more.append(last)
        taken += len(last)
    return b"".join(more)


class ReplayRing:
    """The last `capacity` bytes of a byte stream, addressed by their offset in the whole stream."""

    def __init__(self, capacity: int = RING_BYTES) -> None:
        self.capacity = capacity
        self.total = 0  # bytes ever appended: the offset of the next byte
        self._data = bytearray()

    @property
    def oldest(self) -> int:
        """The offset of the oldest byte still kept."""
        return self.total - len(self._data)

    def append(self, data: bytes) -> None:
        self.total += len(data)
        if len(data) >= self.capacity:
            self._data = bytearray(data[-self.capacity :])
            return
        self._data += data
        excess = len(self._data) - self.capacity
        if excess > 0:
            del self._data[:excess]

    def read_from(self, since: int) -> tuple[int, bytes]:
        """(offset, bytes from offset to the end). `offset > since` means the bytes before it are lost."""
        if since >= self.total:
            return self.total, b""
        start = max(since, self.oldest)
        return start, bytes(self._data[start - self.oldest :])


class Client(Protocol):
    """What a session needs from the WebSocket attached to it. None of these may block."""

    def send_output(self, kind: int, data: bytes) -> None: ...

    def send_exit(self, exit_code: int) -> None: ...

    def wait_drained(self) -> None:
        """Block (never under the session lock) until the client has room for more output."""


class StartFailed(Exception):
    """The process could not be started."""

    code = "START_FAILED"


class SessionGone(StartFailed):
    """The session was deleted while a client was connecting to it."""

    code = "SESSION_GONE"


def _set_window(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _exit_code(returncode: int) -> int:
    """execd's exit code: the status, or -1 when a signal ended the process."""
    return -1 if returncode < 0 else returncode


class PtySession:
    """One bash, started by the first WebSocket that connects, in PTY or pipe mode."""

    def __init__(self, session_id: str, cwd: str, command: str | None = None,
                 ring_bytes: int = RING_BYTES) -> None:
        self.session_id = session_id
        self.cwd = cwd
        self.command = command
        self.lock = threading.Lock()  # ring, client, process state
        self.ring = ReplayRing(ring_bytes)
        self.mode: str | None = None  # "pty" or "pipe", fixed by the connection that starts the process
        self.client: Client | None = None
        self.exit_code: int | None = None
        self.done = threading.Event()  # set once the process ended and its output was drained
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdin_fd: int | None = None
        self._master_fd: int | None = None
        self._stdin_lock = threading.Lock()  # one writer at a time
        self._fd_lock = threading.Lock()  # the descriptors above, `_writing`, `_input_closed`
        self._writing = False
        self._input_closed = False
        self._deleted = False

    # -- state ------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._proc is not None

    @property
    def running(self) -> bool:
        return self._proc is not None and not self.done.is_set()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def describe(self) -> dict[str, object]:
        with self.lock:
            return {"session_id": self.session_id, "running": self.running, "output_offset": self.ring.total,
                    "command": self.command, "cwd": self.cwd, "exit_code": self.exit_code}

    def argv(self) -> list[str]:
        argv = ["bash", "--norc", "--noprofile"]
        return argv + ["-c", self.command] if self.command else argv

    # -- starting ---------------------------------------------------------------------------

    def restarts_when_ended(self) -> bool:
        """Whether a connection to an ended session starts its program again, with the same ring: not
        here (the connection reads the exit); a subclass may."""
        return False

    def start_locked(self, use_pty: bool) -> None:
        """Start the process (the caller holds `lock`); raises StartFailed."""
        if self._proc is not None and self.done.is_set() and not self._deleted and self.restarts_when_ended():
            self._proc, self.mode, self.exit_code = None, None, None
            self.done = threading.Event()
            with self._fd_lock:
                self._input_closed = False
        if self._proc is not None:
            return
        if self._deleted:
            raise SessionGone(f"session {self.session_id} was deleted")
        try:
            if use_pty:
                self._start_pty()
            else:
                self._start_pipes()
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise StartFailed(f"could not start {self.argv()[0]} in {self.cwd}: {exc}") from exc
        threading.Thread(target=self._pump, name=f"pty-{self.session_id[:8]}", daemon=True).start()

    def _start_pipes(self) -> None:
        proc = subprocess.Popen(self.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=self.cwd, start_new_session=True, bufsize=0)
        assert proc.stdin is not None
        self._proc, self.mode, self._stdin_fd = proc, "pipe", proc.stdin.fileno()

    def _start_pty(self) -> None:
        import pty

        master, slave = pty.openpty()
        try:
            _set_window(slave, DEFAULT_COLS, DEFAULT_ROWS)
            env = dict(os.environ)
            env.setdefault("TERM", "xterm-256color")
            # After setsid (start_new_session), make the slave the controlling terminal, as a login
            # terminal would be: job control, Ctrl-C through the line discipline and `tty` all need it.
            proc = subprocess.Popen(self.argv(), stdin=slave, stdout=slave, stderr=slave, cwd=self.cwd, env=env,
                                    start_new_session=True,
                                    preexec_fn=functools.partial(fcntl.ioctl, 0, termios.TIOCSCTTY, 0))
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self._proc, self.mode, self._master_fd, self._stdin_fd = proc, "pty", master, master

    # -- output -----------------------------------------------------------------------------

    def _pump(self) -> None:
        proc = self._proc
        assert proc is not None
        selector = selectors.DefaultSelector()
        if self._master_fd is not None:
            selector.register(self._master_fd, selectors.EVENT_READ, KIND_STDOUT)
        else:
            assert proc.stdout is not None and proc.stderr is not None
            for stream, kind in ((proc.stdout, KIND_STDOUT), (proc.stderr, KIND_STDERR)):
                os.set_blocking(stream.fileno(), False)  # our end only: `_rest_of_line` reads what is there
                selector.register(stream.fileno(), selectors.EVENT_READ, kind)
        try:
            self._drain(selector, proc)
        finally:
            selector.close()
        returncode = proc.wait()
        self._finish(_exit_code(returncode))

    def _drain(self, selector: selectors.BaseSelector, proc: subprocess.Popen[bytes]) -> None:
        """Read until every stream is at its end, or until bash has exited and nothing more is ready
        (a background job that kept bash's output open does not keep the session running)."""
        exited_at: float | None = None
        while selector.get_map():
            events = selector.select(0 if exited_at is not None else _EXIT_POLL_S)
            if exited_at is not None and (not events or time.monotonic() - exited_at > _AFTER_EXIT_S):
                return
            if not events:
                exited_at = time.monotonic() if proc.poll() is not None else None
                continue
            for key, _ in events:
                try:
                    data = os.read(key.fd, CHUNK_BYTES)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:  # EIO: the terminal's other side is closed
                    data = b""
                if data and self._master_fd is None:
                    data += _rest_of_line(key.fd, data)
                if data:
                    self._output(key.data, data)
                else:
                    selector.unregister(key.fd)

    def _output(self, kind: int, data: bytes) -> None:
        with self.lock:
            self.ring.append(data)
            client = self.client
            if client is not None:
                for start in range(0, len(data), CHUNK_BYTES):
                    client.send_output(kind, data[start:start + CHUNK_BYTES])
        if client is not None:
            client.wait_drained()

    def _finish(self, exit_code: int) -> None:
        proc = self._proc
        assert proc is not None
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        with self._fd_lock:
            self._input_closed = True
            if not self._writing:  # else the writer closes them when its write returns
                self._close_input_locked()
        with self.lock:
            self.exit_code = exit_code
            self.done.set()
            client, self.client = self.client, None
            if client is not None:
                client.send_exit(exit_code)

    # -- attaching --------------------------------------------------------------------------

    def attach_locked(self, client: Client, since: int) -> tuple[Client | None, tuple[int, bytes] | None]:
        """Attach `client` (the caller holds `lock`): (the client it replaces, (offset, replay) or None)."""
        offset, data = self.ring.read_from(since)
        replay = (offset, data) if data else None
        old = self.client
        if not self.done.is_set():
            self.client = client
        return old, replay

    def detach(self, client: Client) -> None:
        with self.lock:
            if self.client is client:
                self.client = None

    # -- input and control ------------------------------------------------------------------

    def write_stdin(self, data: bytes) -> None:
        """Write all of `data` to the process's stdin (the terminal in PTY mode); raises OSError."""
        with self._stdin_lock:
            with self._fd_lock:
                fd = self._stdin_fd
                if fd is None or self._input_closed:
                    raise BrokenPipeError("the process has ended; its stdin is closed")
                self._writing = True
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            finally:
                with self._fd_lock:
                    self._writing = False
                    if self._input_closed:
                        self._close_input_locked()

    def _close_input_locked(self) -> None:
        """Close stdin (the terminal in PTY mode); the caller holds `_fd_lock`."""
        proc = self._proc
        if self._master_fd is not None:
            os.close(self._master_fd)
        elif proc is not None and proc.stdin is not None:
            proc.stdin.close()
        self._master_fd = self._stdin_fd = None

    def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's window size (pipe mode has no terminal: nothing to do)."""
        with self._fd_lock:
            if self._master_fd is not None:
                _set_window(self._master_fd, cols, rows)

    def signal(self, signum: int) -> None:
        """Send `signum` to the process group."""
        if self._proc is not None and not self.done.is_set() and self._group_is_ours():
            try:
                os.killpg(self._proc.pid, signum)
            except OSError:
                pass

    def _group_is_ours(self) -> bool:
        """Whether the group and session named by bash's pid are still this session's. While any
        process is in them, the kernel does not give that number to a new process; so once bash is
        reaped, a live process with its pid means the number was reused and the group is gone."""
        proc = self._proc
        return proc is not None and (proc.returncode is None or not os.path.exists(f"/proc/{proc.pid}"))

    def kill(self, grace: float = 2.0) -> None:
        """End the process group and whatever else runs in its session: SIGTERM, then SIGKILL.
        The session can no longer be started."""
        with self.lock:
            self._deleted = True
            proc = self._proc
        if proc is None:
            return
        if self.mode == "pty":
            self.signal_everything(signal.SIGHUP)  # the terminal hangs up: an interactive bash ignores SIGTERM
        self.signal_everything(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        self.signal_everything(signal.SIGKILL)

    def signal_everything(self, signum: int) -> None:
        """Send `signum` to the process group and to every process of the session."""
        if self._proc is None or not self._group_is_ours():
            return
        pid = self._proc.pid
        try:
            os.killpg(pid, signum)
        except OSError:
            pass
        for member in session_members(pid):  # jobs and children that left the group but not the session
            try:
                os.kill(member, signum)
            except OSError:
                pass


class SessionTable:
    """Sessions by id; deleting one kills its processes and forgets it."""

    def __init__(self, kill_grace: float = 2.0, session_class: type[PtySession] = PtySession) -> None:
        self.kill_grace = kill_grace
        self.session_class = session_class
        self._sessions: dict[str, PtySession] = {}
        self._lock = threading.Lock()

    def create(self, cwd: str, command: str | None) -> PtySession:
        import uuid

        session = self.session_class(str(uuid.uuid4()), cwd, command)
        with self._lock:
            self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str) -> PtySession | None:
        with self._lock:
            return self._sessions.get(session_id)

    def all(self) -> list[PtySession]:
        with self._lock:
            return list(self._sessions.values())

    def delete(self, session_id: str) -> bool:
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        session.kill(self.kill_grace)
        return True

    def kill_all(self) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            if session.mode == "pty":
                session.signal_everything(signal.SIGHUP)
            session.signal_everything(signal.SIGTERM)
        deadline = time.monotonic() + self.kill_grace
        for session in sessions:
            session.kill(max(0.0, deadline - time.monotonic()))
