"""One terminal into the box: a PTY session made, attached, fed both ways, and deleted at the end.

The session is the execd API's own (`POST /pty` with a command, `GET /pty/{id}/ws` in PTY mode, `DELETE
/pty/{id}`), so a terminal needs nothing of the endpoint that `%attach` does not: keys go as STDIN
frames, exactly the bytes typed; the box's terminal output comes back in STDOUT frames and goes to
the user's terminal as it is, as ssh shows a remote machine's (that is what a terminal is for); a
window change (SIGWINCH) becomes a `resize` control frame, which the box's terminal turns into its
own SIGWINCH. Whatever ends the terminal (the shell exits, the user's terminal hangs up, SIGTERM,
an error), the session is deleted, which ends every process still in it.

Threads: websockets' own reader; one thread here that writes what the box sends to the user's
terminal; and the caller's, which waits on the user's keys and on signals (through the signal
wake-up descriptor, so a signal can never be lost between two waits).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from ..channel.control import ExecdControl, session_path
from ..channel.endpoint import ExecdEndpoint
from ..channel.errors import ExecdError, ExecdUnreachable
from ..channel.execdws import (
    KEEPALIVE_SECONDS,
    REPLAY,
    STDERR,
    STDIN,
    STDOUT,
    Exited,
    ServerError,
    decode_frame,
    encode_frame,
    open_sync,
    parse_control,
)
from .boxshell import shell_command
from .rawterm import raw_mode, window_size

OPEN_TIMEOUT_SECONDS = 15.0
CONTROL_TIMEOUT_SECONDS = 15.0
READ_BYTES = 65536
LOST_CONNECTION = 255  # the exit status when the shell's end was never heard of, as ssh's
_READER_DONE = 0  # the byte the output thread writes to the wake-up pipe (no signal has number 0)
_STOPPING = frozenset({signal.SIGHUP, signal.SIGTERM})


class TerminalError(RuntimeError):
    """The terminal could not be opened or was cut off; the message says what happened."""


@dataclass
class Outcome:
    """How a terminal ended: the shell's exit status, or why it ended without one."""

    exit_code: int
    problem: str | None = None


class TerminalSession:
    """An interactive shell in the box on the user's terminal (`stdin_fd`, `stdout_fd`)."""

    def __init__(self, endpoint: ExecdEndpoint, *, stdin_fd: int = 0, stdout_fd: int = 1, term: str | None = None,
                 colorterm: str | None = None, cwd: str | None = None) -> None:
        self.endpoint = endpoint
        self.stdin_fd = stdin_fd
        self.stdout_fd = stdout_fd
        self.term = term
        self.colorterm = colorterm
        self.cwd = cwd
        self.session_id: str | None = None
        self._control = ExecdControl(endpoint, timeout=CONTROL_TIMEOUT_SECONDS)
        self._exit_code: int | None = None
        self._problem: str | None = None
        self._size = window_size(stdout_fd)

    def run(self) -> Outcome:
        """Open the terminal, hand the user's terminal over to it until it ends, and delete the session."""
        cols, rows = self._size
        command = shell_command(self.term, cols, rows, self.colorterm)
        try:
            self.session_id = self._control.create(cwd=self.cwd, command=command)
        except ExecdError as exc:
            raise TerminalError(f"the sandbox did not open a terminal: {exc}") from exc
        try:
            with raw_mode(self.stdin_fd):
                self._pump(self._open())
        finally:
            self._delete()
        if self._exit_code is not None and self._exit_code >= 0:
            return Outcome(self._exit_code, self._problem)
        if self._exit_code is not None:  # execd's -1: a signal ended the shell
            return Outcome(LOST_CONNECTION, self._problem or "the shell was killed: the kernel's sandbox has ended, "
                                                             "or something in it ended the shell")
        return Outcome(LOST_CONNECTION, self._problem or "the connection to the sandbox closed before the shell "
                                                          "ended: the kernel's sandbox has ended, or is restarting")

    # -- opening and closing ----------------------------------------------------------------

    def _open(self) -> ClientConnection:
        assert self.session_id is not None
        try:
            return open_sync(self.endpoint, session_path(self.session_id, "/ws"), {"pty": "1"},
                             open_timeout=OPEN_TIMEOUT_SECONDS, keepalive=KEEPALIVE_SECONDS, max_size=None)
        except ExecdError as exc:
            raise TerminalError(f"the sandbox's terminal did not connect: {exc}") from exc

    def _delete(self) -> None:
        """Forget the session in the box, which ends whatever still runs in it (jobs left behind too)."""
        if self.session_id is None:
            return
        try:
            self._control.delete(self.session_id)
        except ExecdUnreachable:
            pass  # the sandbox is gone, and the session's processes with it
        except ExecdError as exc:
            self._problem = self._problem or f"the terminal's session {self.session_id} could not be deleted: {exc}"

    # -- the two directions -----------------------------------------------------------------

    def _pump(self, ws: ClientConnection) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        output = threading.Thread(target=self._show_output, args=(ws, wake_w), name="terminal-output", daemon=True)
        try:
            with _signals_to(wake_w):
                output.start()
                self._send_input(ws, wake_r)
        finally:
            ws.close_socket()  # ends the output thread's wait, if the input side ended first
            output.join(2.0)
            os.close(wake_r)
            os.close(wake_w)

    def _send_input(self, ws: ClientConnection, wake_r: int) -> None:
        """Keys to the box, window changes as resizes, until the output side ends or the user's terminal goes."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.stdin_fd, selectors.EVENT_READ, "keys")
            selector.register(wake_r, selectors.EVENT_READ, "wake")
            while True:
                for key, _ in selector.select():
                    if key.data == "wake":
                        if not self._on_wake(ws, wake_r):
                            return
                        continue
                    try:
                        data = os.read(self.stdin_fd, READ_BYTES)
                    except OSError:  # EIO: the user's terminal hung up
                        data = b""
                    if not data:
                        self._problem = self._problem or "the terminal this ran in went away"
                        return
                    try:
                        ws.send(encode_frame(STDIN, data))
                    except ConnectionClosed:
                        return  # the output side says why

    def _on_wake(self, ws: ClientConnection, wake_r: int) -> bool:
        """Handle what woke the input side; False once the terminal is to end."""
        try:
            woken = os.read(wake_r, 256)
        except BlockingIOError:
            return True
        if _READER_DONE in woken or any(number in woken for number in _STOPPING):
            if any(number in woken for number in _STOPPING):
                self._problem = self._problem or "ended by a signal (the terminal hung up, or was told to stop)"
            return False
        if signal.SIGWINCH in woken:
            size = window_size(self.stdout_fd)
            if size != self._size:
                self._size = size
                try:
                    ws.send(json.dumps({"type": "resize", "cols": size[0], "rows": size[1]}))
                except ConnectionClosed:
                    return False
        return True

    def _show_output(self, ws: ClientConnection, wake_w: int) -> None:
        """What the box's terminal writes, to the user's terminal as it is; the shell's exit status."""
        try:
            for message in ws:
                if isinstance(message, str):
                    self._on_control(message)
                    continue
                try:
                    frame = decode_frame(message)
                except ExecdError:
                    continue  # nothing execd sends a client
                if frame.kind in (STDOUT, STDERR, REPLAY):
                    _write_all(self.stdout_fd, frame.data)
        except ConnectionClosed:
            pass
        except OSError as exc:  # the user's terminal is gone
            self._problem = self._problem or f"could not write to this terminal: {exc}"
        finally:
            with contextlib.suppress(OSError):
                os.write(wake_w, bytes([_READER_DONE]))

    def _on_control(self, text: str) -> None:
        control = parse_control(text)
        if isinstance(control, Exited):
            self._exit_code = control.exit_code
        elif isinstance(control, ServerError):
            self._problem = f"the sandbox's terminal reported {control.code}: {control.message}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@contextlib.contextmanager
def _signals_to(wake_w: int) -> Iterator[None]:
    """SIGWINCH, SIGHUP and SIGTERM written to `wake_w` (as their numbers) instead of acted on, while the
    terminal runs; off the main thread (a benchmark's driver, say) signals are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = (signal.SIGWINCH, *_STOPPING)
    previous = {number: signal.signal(number, lambda *_: None) for number in wanted}
    old_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        for number, handler in previous.items():
            signal.signal(number, handler)
