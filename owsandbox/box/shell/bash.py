"""Named, persistent bash shells that run one command at a time and can be stopped without dying.

Each shell is `bash -i --norc --noprofile --noediting` on pipes, in a session of its own. Interactive mode is
what makes Stop keep state: SIGINT to the shell's process group aborts the running command line
and bash goes on reading with its folder and variables intact, where a non-interactive bash would
die. A command is sent as `eval $'...'`, so a syntax error cannot swallow what follows. With a
terminal (terminal.py), its stdin and output are the shell's two terminals, and a read of the terminal
is reported or given end-of-input; without one, it reads an empty stdin and writes to the pipes.
After it, a separate line prints an end marker on the channels its stdout and stderr took (through
descriptors saved at start, so a command that redirects its own output cannot hide them); the result
goes out once both markers are in, so both streams are drained.

What reaches the notebook is what the programs wrote, in whole lines (capture.py `WholeLines`: one
stream's half line is not cut by the other's), without bash's own chatter on its stderr: a job started
in the background (`[1] 4242`) and a job's end (`[1]+  Done ...`) become notes, and the `exit` that
bash echoes before it ends is dropped (the result says the shell exited). They are told apart on the
channel bash's stderr goes to by what they are about and when they come (capture.py `ShellChatter`):
the pid of a job this shell has just started, a job bash announced that has ended, an `exit` right
before the shell ends. A program's own line that reads the same keeps its place on stderr.

Two things carry from one command to the next, as in a terminal: `$?` (the next command line gives
it back, so `false` and then `echo $?` says 1), and what background jobs print while no command
runs (the latest 64 KiB, kept and put first in the next command's output; nothing is thrown away
unsaid).

Completion and inspection (complete.py) need the functions and aliases that cells defined, which only
the shell knows. The shell writes them when asked, and only while it is idle: one line (builtins
only: `declare -f`, `alias -p`, `declare -p PATH` into a private file, then a marker), written under
the lock that starts commands, so a command that comes meanwhile is queued behind it in bash's input
and the two cannot mix; the line leaves `$?` and `$_` as the end marker left them and sends nothing
to the command's channels (not even `set -x` traces). A busy shell is never written to: its file is
used as it is. So that this file is not stale, a shell that was asked once writes it again when it
has been idle for DEFINITIONS_REFRESH_SECONDS after a command: cells run at a person's pace leave
that moment, so a function defined in one is known while the next one runs; commands that follow at
once (Run All, an agent) are not held up, and a busy shell's file may then be a few cells old. Only a
command that comes in the very moment the line runs waits for it (~0.1 ms; ~1 ms once a cell has
sourced a big library of functions, such as bash-completion's): written before every command, the
line would cost each ~0.4 ms of round trip, ~1.6 ms with such a library.
"""

from __future__ import annotations

import enum
import os
import re
import secrets
import selectors
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from ... import protocol as P
from ...protocol import INTERNAL_ERROR, INVALID_PARAMS, SHELL_BUSY, RunnerError
from ...protocol import messages as M
from ...protocol.methods import SHELL_INPUT_WANTED, SHELL_OUTPUT, SHELL_PROGRESS
from ...protocol.words import noun
from .. import procstat
from ..procstat import session_members
from .capture import LiveBatcher, MarkerScanner, OutputRecord, ShellChatter, StreamDecoder, WholeLines
from .cellusage import CellMeter
from .lines import (
    DISPLAY_START,
    LEAD,
    MARK_ERR_FD,
    MARK_OUT_FD,
    SHELL_INIT,
    START_MARK,
    TTY_ERR_FD,
    TTY_OUT_FD,
    channel_fds,
    command_line,
    definitions_line,
    marker_lines,
    output_mode_line,
)
from .terminal import (
    DEFAULT_COLS,
    DEFAULT_ROWS,
    EOF_NOTE,
    NOTEBOOK_ENV,
    EchoStripper,
    PseudoTerminal,
    waiting_reader,
)

PROMPT_CHARS = 1000  # of the unfinished last line, kept as the prompt of a read
INPUT_CHECK_SECONDS = 0.02  # how often a running command's terminal is checked for a waiting reader
_STREAM_OF = {"stdout": "stdout", "stderr": "stderr", "tty-out": "stdout", "tty-err": "stderr"}
_TTY_CHANNELS = ("tty-out", "tty-err")  # in the order they are read when both have news
STDOUT_GRACE_SECONDS = 0.001
BEGIN_WAIT_SECONDS = 1.0  # how long a Stop waits for a command's start mark before it signals anyway
DEFAULT_OUTPUT_LIMIT = 1024 * 1024  # characters kept in memory per command, unless the request asks
MAX_OUTPUT_LIMIT = 16 * 1024 * 1024  # the most a request may ask for
PROGRESS_SECONDS = 5.0  # a command silent this long sends `shell.progress`
BETWEEN_LIMIT = 64 * 1024  # bytes printed between commands kept for the next one (the latest)
DEFINITIONS_REFRESH_SECONDS = 0.05  # idle this long after a command, a shell asked once writes them again
_TTY_NOISE = re.compile(rb"bash: \[\d+: \d+ \(\d+\)\] tcsetattr: Inappropriate ioctl for device\n")

def notice_channel(terminal: bool, merge: bool) -> str:
    """The channel the shell's own stderr goes to in this mode (where bash writes its job notices)."""
    return ("tty-out" if merge else "tty-err") if terminal else ("stdout" if merge else "stderr")


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


_TTY_CHUNK = 2048  # a terminal read this long means more is queued behind it


def _drain(fd: int, room: int) -> bytes:
    """What more a terminal has at once: it hands its output over a few KiB per read, and reading it
    together costs the reader one pass instead of many. Only for a flood: a short read is read alone, so
    a line on one terminal is not read together with lines written after another terminal's line."""
    chunks = []
    while room > 0:
        try:
            chunk = os.read(fd, room)
        except (BlockingIOError, InterruptedError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
        room -= len(chunk)
    return b"".join(chunks)


def _job_over(pid: int) -> bool:
    """Whether a job's last process has ended or stopped, as bash's report of it would say."""
    state = procstat.state(pid)
    return state is None or state in (*procstat.DEAD_STATES, "T", "t")


class CommandState(enum.Enum):
    RUNNING = "running"
    STOPPING = "stopping"  # Stop or its timeout asked it to end (`Command.stop_reason` says which)
    ENDED = "ended"  # both end markers came in, or the shell itself ended


# Every way a command's state may change, in one place: (state, event) -> new state. An event that
# is not here changes nothing (a second Stop, a marker after the shell exited, ...).
COMMAND_TRANSITIONS = {
    (CommandState.RUNNING, "stop"): CommandState.STOPPING,
    (CommandState.RUNNING, "ended"): CommandState.ENDED,
    (CommandState.STOPPING, "ended"): CommandState.ENDED,
}


#: Where a command's live frames go: each frame's kind (the notification's method: output, progress, a
#: prompt) and its fields (the request's `id` and the shell's name are the dispatcher's to add).
LiveSink = Callable[[str, dict[str, Any]], None]


class Command:
    """One command in flight on a shell. Its life is `CommandState`, changed only by `advance`; the
    rest is what the reader learns on the way (output, prompts, the end markers' status and folder)."""

    def __init__(self, command: str, token: str, record: OutputRecord, batcher: LiveBatcher,
                 on_live: LiveSink | None,
                 on_done: Callable[[M.RunResult], None], timeout_s: float | None) -> None:
        self.command = command
        self.token = token
        self.record = record
        self.batcher = batcher
        self.on_live = on_live
        self.on_done = on_done
        self.timeout_s = timeout_s
        self.timer: threading.Timer | None = None  # its timeout, cancelled when it ends: a thread each
        self.started = time.monotonic()
        self.exit_code: int | None = None
        self.cwd: str | None = None
        self.out_done = False
        self.err_done = False
        self.state = CommandState.RUNNING
        self.stop_reason: str | None = None  # "interrupt" or "timeout", set with the move to STOPPING
        self.begun = False  # bash printed the command line's start mark: it runs the line (`lines.command_line`)
        self.signalled = False  # its stop has begun: SIGINT sent, the escalation under way
        self.finished = threading.Event()  # set once its result is handed over
        self.frames_sent = 0
        self.last_news = self.started  # when the client last heard of this command (output or progress)
        self.terminal = False  # its stdin and output are the shell's terminals
        self.marker_fds = (MARK_OUT_FD, MARK_ERR_FD)
        self.notice_channel = "stderr"  # where bash's own stderr goes while it runs
        self.first_pid: int | None = None  # the namespace's last pid when it started: its jobs come after
        self.allow_stdin = False  # whoever asked can answer a prompt (else a read gets end-of-input)
        self.partial = ""  # the unfinished last line of its stdout: a prompt, when it waits to read
        self.last_check = self.started
        self.handled: tuple[int, int | None, int] | None = None  # the wait last reported or given end-of-input
        self.reading = 0  # which terminal that wait reads (0: stdin's, 1: stderr's)
        self.seen_waiting = False  # a new wait was seen once with no prompt printed yet
        self.eof_noted = False
        self.meter: CellMeter | None = None  # its peak memory and CPU seconds (`RunResult.usage`)

    def advance(self, event: str, reason: str | None = None) -> bool:
        """Move on by `event` ("stop", with its reason; "ended"); False when it does not apply now."""
        new = COMMAND_TRANSITIONS.get((self.state, event))
        if new is None:
            return False
        self.state = new
        if event == "stop":
            self.stop_reason = reason
        return True

    @property
    def stopping(self) -> bool:
        return self.stop_reason is not None

    def ending(self, error: str | None, outcome: str) -> tuple[str, str | None]:
        """The result's outcome and error: a stop says how it ended, whatever else happened."""
        if self.stop_reason == "interrupt":
            return P.OUTCOME_INTERRUPT, error or "interrupted by user"
        if self.stop_reason == "timeout":
            return P.OUTCOME_TIMEOUT, error or f"timed out after {self.timeout_s:g} s"
        return outcome, error


class Shell:
    """A persistent bash. `run` starts a command and returns; `on_done` gets its result."""

    def __init__(self, name: str, cwd: str, env: dict[str, str] | None = None,
                 log_dir: str | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
                 live_delay: float = 0.003, on_exit: Callable[[Shell], None] | None = None,
                 definitions_dir: str | None = None) -> None:
        self.name = name
        self.cwd = cwd
        self.log_dir = log_dir
        self.output_limit = output_limit
        self.live_delay = live_delay
        self.on_exit = on_exit
        self._lock = threading.Lock()
        self._current: Command | None = None
        self._log_count = 0
        self.alive = True
        self.exit_status: int | None = None
        self.last_command: str | None = None
        self._last_status = 0  # what `$?` holds in bash between commands
        self.definitions_path: str | None = None  # where write_definitions puts them (none: not asked for)
        self._definitions_wanted: dict[str, threading.Event] = {}  # marker token -> set when written
        self._definitions_used = False  # asked for once: written again once the shell has been idle a moment
        self._refresh_at: float | None = None  # when to write them again, if still idle (reader thread)
        # Output with no command to go to, for the next one; touched only by the reader thread.
        self._between: deque[tuple[str, bytes, str]] = deque()
        self._between_bytes = 0
        self._between_dropped = 0
        shell_env = dict(os.environ if env is None else env)
        shell_env["OWSANDBOX_SHELL"] = name
        shell_env.update(NOTEBOOK_ENV)
        shell_env.setdefault("COLUMNS", str(DEFAULT_COLS))
        shell_env.setdefault("LINES", str(DEFAULT_ROWS))
        self._tty = PseudoTerminal()
        self._tty_err = PseudoTerminal()
        self._terminals = (self._tty, self._tty_err)  # in the order `waiting_reader` names them
        self._echo = {"tty-out": EchoStripper(), "tty-err": EchoStripper()}
        # What the programs wrote, in whole lines; bash's own lines on its stderr told apart. Touched only
        # by the reader thread.
        self._lines = WholeLines()
        self._chatter = {key: ShellChatter(self._is_job, _job_over) for key in _STREAM_OF}
        self._notice_channel = "stderr"  # where bash's stderr goes (as the latest command set it)
        self._mode: tuple[bool, bool] = (False, False)  # (terminal, merge) the shell's descriptors point at
        self._env_size = (shell_env["COLUMNS"], shell_env["LINES"])
        self._proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile", "--noediting", "-i"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=cwd, env=shell_env, start_new_session=True, bufsize=0,
        )
        self.pid = self._proc.pid
        if definitions_dir is not None:
            self.definitions_path = os.path.join(definitions_dir, f"shell-{self.pid}.sh")
        assert self._proc.stdin and self._proc.stdout and self._proc.stderr
        self._stdin: IO[bytes] = self._proc.stdin
        # Four channels, two streams: the pipes (bash's own, and commands with %terminal off) and the
        # terminals. Each channel has its own scanner for the end markers.
        self._scanners = {key: MarkerScanner() for key in ("stdout", "stderr", "tty-out", "tty-err")}
        # `owdisplay` lines on stdout become `display` records here, where they are born.
        self._displays = {key: MarkerScanner(DISPLAY_START.encode()) for key in ("stdout", "tty-out")}
        self._decoders = {"stdout": StreamDecoder(), "stderr": StreamDecoder()}
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._proc.stdout, selectors.EVENT_READ, "stdout")
        self._selector.register(self._proc.stderr, selectors.EVENT_READ, "stderr")
        self._selector.register(self._tty.master, selectors.EVENT_READ, "tty-out")
        self._selector.register(self._tty_err.master, selectors.EVENT_READ, "tty-err")
        # A command that prints nothing at first (`read`, `sleep`) must still be watched from its start:
        # `run` wakes the reader, which may be sleeping out an idle shell's half second.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        ready = threading.Event()
        self._starting = Command(":", "start", OutputRecord(1 << 16, self._open_log), LiveBatcher(),
                                 None, lambda _result: ready.set(), None)
        self._current = self._starting
        # Opened by path in bash, the first terminal becomes the controlling terminal of its session
        # (so /dev/tty, getpass and Ctrl-C through the terminal work as in a terminal).
        self._write(SHELL_INIT + f"exec {TTY_OUT_FD}<>{self._tty.path} {TTY_ERR_FD}<>{self._tty_err.path}\n"
                    + marker_lines("start"))
        self._reader = threading.Thread(target=self._read_loop, name=f"shell-{name}", daemon=True)
        self._reader.start()
        if not ready.wait(30) or not self.alive:
            self.kill()
            raise RunnerError(INTERNAL_ERROR, f"shell '{name}' did not start (bash in {cwd})")

    # -- commands ---------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._current is not None

    def run(self, command: str, on_done: Callable[[M.RunResult], None],
            on_live: LiveSink | None = None, timeout_s: float | None = None,
            output_limit: int | None = None, terminal: bool = False, merge: bool = False, stdin: bool = False,
            cols: int = DEFAULT_COLS, rows: int = DEFAULT_ROWS) -> Command:
        """Give bash `command` and return at once with it (`interrupt` takes it); `on_done` gets its result."""
        limit = self.output_limit if output_limit is None else min(output_limit, MAX_OUTPUT_LIMIT)
        cmd = Command(command, secrets.token_hex(8), OutputRecord(limit, self._open_log),
                      LiveBatcher(self.live_delay), on_live, on_done, timeout_s)
        cmd.terminal, cmd.allow_stdin = terminal, stdin and on_live is not None
        cmd.first_pid = procstat.last_pid()  # read before the command can start a job
        if timeout_s is not None:  # `_finish` cancels it: its thread ends with the command
            cmd.timer = threading.Timer(timeout_s, self._stop, args=(cmd, "timeout"))
            cmd.timer.daemon = True
        with self._lock:
            if not self.alive:
                raise RunnerError(P.SHELL_EXITED, f"shell '{self.name}' has exited")
            if self._current is not None:
                raise RunnerError(SHELL_BUSY, f"shell '{self.name}' is running another command")
            if cmd.timer is not None:
                try:
                    cmd.timer.start()  # the command is not current yet: it cannot have ended
                except RuntimeError as exc:  # no thread to spare in the box: nothing was started
                    raise RunnerError(INTERNAL_ERROR, f"no thread for the command's timeout ({exc}): the "
                                      "sandbox's process limit is reached; end some of its processes") from exc
            self._current = cmd
            self.last_command = command
            self._refresh_at = None  # a command that comes at once goes first: the definitions wait
        lines = ""
        if (terminal, merge) != self._mode:
            lines += output_mode_line(terminal, merge)
            self._mode = (terminal, merge)
        if terminal:
            self._tty.resize(cols, rows)
            self._tty_err.resize(cols, rows)
            self._tty.reset()
            if (str(cols), str(rows)) != self._env_size:
                lines += f"{LEAD}export COLUMNS={cols} LINES={rows}\n"
                self._env_size = (str(cols), str(rows))
        cmd.marker_fds = channel_fds(terminal)
        cmd.notice_channel = notice_channel(terminal, merge)
        stdin = f"&{TTY_OUT_FD}" if terminal else "/dev/null"
        lines += command_line(command, self._last_status, stdin, cmd.token) + marker_lines(cmd.token, *cmd.marker_fds)
        cmd.meter = CellMeter(self.pid, time.monotonic())  # read before bash can start the command
        # Written under the lock `_exited` takes to mark the shell gone before it closes the pipes:
        # bash may read the line, end (`set -e; false`) and be reaped while this thread is still in
        # the pipe's flush, and a pipe closed under a writer raises ValueError, not OSError.
        with self._lock:
            if self.alive:
                try:
                    self._write(lines)
                except OSError:
                    pass  # the reader sees the shell go and finishes the command
        self._wake()
        return cmd

    def not_run(self, command: str, error: str) -> M.RunResult:
        """The result of a command that was stopped before it was given to bash: nothing ran, so there
        is no exit status, and `$?` and the folder stay as they were."""
        return M.RunResult(shell=self.name, command=command, cwd=self.cwd, exit_code=None,
                           outcome=P.OUTCOME_INTERRUPT, output="", timed_out=False, truncated=False, error=error,
                           duration_ms=0.0, output_bytes=0, output_chars=0)

    def write_definitions(self, timeout: float = 1.0) -> bool:
        """Have the shell write its functions, aliases and PATH to `definitions_path`, if it is idle;
        True once they are written. A busy shell is left alone: its file is as it was (once asked, a
        shell writes them again whenever it has been idle a moment after a command)."""
        if self.definitions_path is None:
            return False
        self._definitions_used = True
        token = secrets.token_hex(8)
        written = threading.Event()
        with self._lock:  # `run` starts a command under this lock: it cannot write its line before ours
            if not self.alive or self._current is not None:
                return False
            self._definitions_wanted[token] = written  # before the line: its marker may come at once
            try:
                self._write(definitions_line(self.definitions_path, token))
            except OSError:
                del self._definitions_wanted[token]
                return False  # the reader sees the shell go
        try:
            return written.wait(timeout) and self.alive
        finally:
            self._definitions_wanted.pop(token, None)

    def _refresh_definitions(self) -> None:
        """Write the definitions again, if no command has started since the last one ended (one that
        has will set a new time when it ends). No marker: nobody waits for this one."""
        with self._lock:
            self._refresh_at = None
            if self._current is None and self.alive and self.definitions_path is not None:
                try:
                    self._write(definitions_line(self.definitions_path))
                except OSError:
                    pass

    def interrupt(self, cmd: Command | None = None) -> bool:
        """Stop `cmd` (`run` returned it), or else the running command, as Ctrl-C would; whether it is
        being stopped now (False when it has ended, or nothing runs)."""
        cmd = cmd or self._current
        if cmd is None or cmd is self._starting:
            return False
        return self._stop(cmd, "interrupt")

    def _stop(self, cmd: Command, reason: str) -> bool:
        """Stop `cmd` for `reason`; whether it is being stopped (by this call or an earlier one). A
        command that bash has not begun yet is signalled when it begins (`_on_marker`): a SIGINT
        while bash reads its input would cost the shell."""
        with self._lock:
            if self._current is not cmd:
                return False
            if not cmd.advance("stop", reason):
                return cmd.state is CommandState.STOPPING
            begun = cmd.begun  # read under the lock under which the reader sets it
        if begun:
            self._start_stopping(cmd)
        else:  # should the start mark never come (bash stuck before the line), stop it all the same
            timer = threading.Timer(BEGIN_WAIT_SECONDS, self._start_stopping, args=(cmd,))
            timer.daemon = True
            timer.start()
        return True

    def _start_stopping(self, cmd: Command) -> None:
        """SIGINT, and the escalation: once per command, and only while it is the shell's command."""
        with self._lock:
            if self._current is not cmd or cmd.signalled:
                return
            cmd.signalled = True
        self._signal_group(signal.SIGINT)  # at once; the thread repeats and escalates if need be
        threading.Thread(target=self._escalate, args=(cmd,), daemon=True).start()

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except OSError:
            pass

    def _escalate(self, cmd: Command) -> None:
        """SIGINT, repeated (one that lands while bash is between reading the line and starting the
        program is lost), each time with the end markers again (status 130): a SIGINT that bash
        takes while it reads the marker line throws that line away. Markers given once too often
        name a command that has ended, and are dropped. Then TERM and KILL for everything in the shell's
        session but bash itself; last, the shell."""
        for wait in (0.1, 0.2, 0.3, 0.4):
            if cmd.finished.wait(wait):
                return
            self._signal_group(signal.SIGINT)
            try:  # if these are the ones that count, the command's own status went with the lost line
                self._write(marker_lines(cmd.token, *cmd.marker_fds, status="130"))
            except OSError:
                pass
        if cmd.finished.wait(0.5):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            _signal_all([p for p in session_members(self.pid) if p != self.pid], sig)
            if cmd.finished.wait(1.0):
                return
        self.kill()

    def _wake(self) -> None:
        with self._lock:  # the reader closes the pipe under it, once the shell is not alive
            if self.alive:
                try:
                    os.write(self._wake_w, b"\0")
                except OSError:
                    pass  # full: the reader is woken already

    def _write(self, text: str) -> None:
        """Give bash `text`; OSError when it cannot take it (gone, or its pipe closed since)."""
        try:
            self._stdin.write(text.encode("utf-8", "surrogateescape"))
            self._stdin.flush()
        except ValueError as exc:  # closed by `_exited`: as gone as a broken pipe
            raise BrokenPipeError(f"shell '{self.name}' has exited: {exc}") from exc

    def _open_log(self) -> tuple[str, IO[bytes]]:
        folder = self.log_dir or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"owsandbox-logs-{os.getuid()}")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self._log_count += 1
        path = os.path.join(folder, f"{self.name}-{self.pid}-{self._log_count}.log")
        return path, open(path, "wb")  # noqa: SIM115 - the record closes it

    # -- reading ----------------------------------------------------------------------------

    def _read_loop(self) -> None:
        open_streams = 2
        while open_streams:
            cmd = self._current
            deadlines = [self._lines.deadline(), *(chatter.deadline() for chatter in self._chatter.values())]
            if cmd is not None:
                deadlines.append(cmd.batcher.deadline())
                if cmd.meter is not None:
                    deadlines.append(cmd.meter.due())
            deadline = min((d for d in deadlines if d is not None), default=None)
            timeout = 0.5 if deadline is None else max(0.0, deadline - time.monotonic())
            if any(chatter.holding for chatter in self._chatter.values()):
                timeout = min(timeout, INPUT_CHECK_SECONDS)  # an `exit` echo waits to see the shell end
            if cmd is not None and cmd.terminal:
                timeout = min(timeout, INPUT_CHECK_SECONDS)  # to notice a read of the terminal
            if cmd is None and self._refresh_at is not None:
                timeout = max(0.0, min(timeout, self._refresh_at - time.monotonic()))
            # Wake at least twice a second: a shell that exited while a background job still holds
            # its pipes sends no EOF, so its exit is noticed by polling.
            events = self._selector.select(min(timeout, 0.5))
            now = time.monotonic()
            if not events and self._proc.poll() is not None:
                break
            if any(key.data == "wake" for key, _ in events):
                _drain(self._wake_r, 4096)
                events = [(key, mask) for key, mask in events if key.data != "wake"]
            open_streams -= self._take(self._in_order(events), now)
            if self._lines.waiting_for is not None and now >= (self._lines.deadline() or now):
                self._finish_line(now)  # the last chance for the line's end before the wait is over
            self._due(now)
            cmd = self._current
            if cmd is not None:
                self._hand_over_between(cmd, now)
                if cmd.terminal and cmd is not self._starting:
                    self._check_for_reader(cmd, now)
            if cmd is not None and cmd.meter is not None:
                cmd.meter.sample_if_due(now)
            if cmd is not None and cmd.on_live is not None:
                self._send_live(cmd, cmd.batcher.due(time.monotonic()))
                self._maybe_progress(cmd)
            if self._refresh_at is not None and now >= self._refresh_at:
                self._refresh_definitions()
        self._proc.wait()
        self._exited()

    def _take(self, events: list, now: float) -> int:
        """Read the ready channels and hand on what they hold; returns how many pipes reached their end."""
        ended = 0
        for key, _ in events:
            channel = key.data
            stream = _STREAM_OF[channel]
            try:
                data = os.read(key.fd, 65536)
                if channel in _TTY_CHANNELS and len(data) >= _TTY_CHUNK:
                    data += _drain(key.fd, 65536 - len(data))  # a flood: take what is there together
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:  # a terminal whose other end is closed
                if channel in _TTY_CHANNELS:
                    continue
                data = b""
            if channel in self._echo:
                data = self._echo[channel].strip(data)
                if not data:
                    continue
            if not data:
                self._selector.unregister(key.fileobj)
                ended += 1
                self._pass_on(channel, stream, self._scanners[channel].flush(), now)
                self._flush_display(channel, stream, now)
                for chatter in self._chatter.values():
                    chatter.shell_exited()  # its pipes end with it
                self._flush_lines(now)
                self._deliver(stream, "data", b"", now, final=True)
                continue
            for kind, payload in self._scanners[channel].feed(data):
                if kind == "data":
                    self._pass_on(channel, stream, payload, now)
                else:
                    self._flush_display(channel, stream, now)  # a display line cut short is output
                    self._on_marker(stream, payload, now)
            if channel in _TTY_CHANNELS and self._lines.waiting_for not in (None, stream):
                self._finish_line(now)
        return ended

    def _finish_line(self, now: float) -> None:
        """Output now waits for the rest of a line on the other terminal, which may already be written
        and only not handed on yet (a terminal hands output on from a kernel worker, which a busy
        machine runs late): a read of that terminal's end makes it hand over what it holds at once."""
        channel = _TTY_CHANNELS[("stdout", "stderr").index(self._lines.waiting_for or "stdout")]
        terminal = self._terminals[_TTY_CHANNELS.index(channel)]
        self._take([(self._selector.get_key(terminal.master), 0)], now)

    def _pass_on(self, channel: str, stream: str, data: bytes, now: float) -> None:
        """Output between end markers: stdout's `owdisplay` lines go their own way (`_on_display`)."""
        displays = self._displays.get(channel)
        if displays is None:
            self._on_data(channel, stream, data, now)
            return
        for kind, payload in displays.feed(data):
            if kind == "data":
                self._on_data(channel, stream, payload, now)
            else:
                self._to_lines(stream, [*self._chatter[channel].fresh_line(), ("display", payload)], now)

    def _flush_display(self, channel: str, stream: str, now: float) -> None:
        displays = self._displays.get(channel)
        held = displays.flush() if displays is not None else b""
        if held:
            self._on_data(channel, stream, held, now)

    def _on_data(self, channel: str, stream: str, raw: bytes, now: float) -> None:
        """A channel's output: bash's own lines told apart (on the channel its stderr goes to), then
        into whole lines."""
        cmd = self._current
        if cmd is not None and cmd is not self._starting:
            self._notice_channel = cmd.notice_channel
        pieces = self._chatter[channel].feed(raw, now, active=channel == self._notice_channel)
        self._to_lines(stream, pieces, now)

    def _to_lines(self, stream: str, pieces: list[tuple[str, bytes]], now: float) -> None:
        for kind, data in pieces:
            for item in self._lines.add(stream, kind, data, now):
                self._deliver(*item, now)

    def _flush_lines(self, now: float) -> None:
        """Let out all that waits (the command ended, or waits for input): an `exit` echo held so far
        was a program's, since the shell still runs."""
        for channel, chatter in self._chatter.items():
            self._to_lines(_STREAM_OF[channel], chatter.release(), now)
        for item in self._lines.flush():
            self._deliver(*item, now)

    def _due(self, now: float) -> None:
        """What has waited long enough: the other stream's output for a line that does not end, an
        `exit` echo after which the shell did not end (or the end of the shell, which makes it bash's)."""
        if any(chatter.holding for chatter in self._chatter.values()) and self._proc.poll() is not None:
            for chatter in self._chatter.values():
                chatter.shell_exited()
        for channel, chatter in self._chatter.items():
            self._to_lines(_STREAM_OF[channel], chatter.due(now), now)
        for item in self._lines.due(now):
            self._deliver(*item, now)

    def _is_job(self, pid: int) -> bool:
        """Whether `pid` is a job the running command started: a child of the shell, or one that has
        already ended whose pid was handed out after the command started."""
        parent = procstat.ppid(pid)
        if parent is not None:
            return parent == self.pid and procstat.field(pid, "session") == str(self.pid)
        cmd, last = self._current, procstat.last_pid()
        first = cmd.first_pid if cmd is not None else None
        if first is None or last is None:
            return False
        return first < pid <= last if first <= last else (pid > first or pid <= last)  # numbers wrapped

    def _deliver(self, stream: str, kind: str, raw: bytes, now: float, final: bool = False) -> None:
        """Output in its final order, to the command's record and live view (or kept for the next)."""
        if kind == "display":
            self._on_display(raw, now)
        elif kind == "note":
            text = raw.decode("utf-8", "replace")
            cmd = self._current
            if cmd is None:
                self._keep_between("note", raw, text)
            else:
                self._hand_over_between(cmd, now)
                self._add(cmd, "note", raw, text, now)
        else:
            self._on_output(stream, raw, now, final)

    def _on_display(self, payload: bytes, now: float) -> None:
        """An `owdisplay` request (`mime TAB id TAB path`): a `display` record of its own, in order with
        the output around it, so a client shows the file there and never parses the program's stdout."""
        text = payload.decode("utf-8", "replace").removesuffix("\r") + "\n"
        cmd = self._current
        if cmd is None:
            self._keep_between("display", payload, text)
            return
        self._hand_over_between(cmd, now)
        self._add(cmd, "display", payload, text, now)

    def _in_order(self, events: list) -> list:
        """The ready channels in the order their output was most likely written. A pipe's output is there
        the moment it is written, so the pipes keep the order they became ready in. Two terminals are two
        queues that the kernel hands on a moment after the writes, not always in their order: stdout's
        terminal goes first, and when only stderr's has news, stdout's gets a millisecond to show what
        may have been written before it."""
        ttys = {key.data: (key, mask) for key, mask in events if key.data in _TTY_CHANNELS}
        if not ttys:
            return events
        if "tty-out" not in ttys:
            for key, mask in self._selector.select(STDOUT_GRACE_SECONDS):
                if key.data == "tty-out":
                    ttys["tty-out"] = (key, mask)
        pipes = [(key, mask) for key, mask in events if key.data not in _TTY_CHANNELS]
        return pipes + [ttys[channel] for channel in _TTY_CHANNELS if channel in ttys]

    def _on_output(self, stream: str, raw: bytes, now: float, final: bool = False) -> None:
        if stream == "stderr" and b"tcsetattr" in raw:
            # An interactive bash with no terminal complains when a job it waited for was killed.
            raw = _TTY_NOISE.sub(b"", raw)
        text = self._decoders[stream].decode(raw, final)
        if not raw:
            return
        cmd = self._current
        if cmd is None:
            self._keep_between(stream, raw, text)
            return
        self._hand_over_between(cmd, now)
        if cmd.stopping and stream == "stderr" and raw == b"\n":
            return  # the newline bash prints when SIGINT aborts a line, as a terminal shows ^C
        self._add(cmd, stream, raw, text, now)

    def _add(self, cmd: Command, stream: str, raw: bytes, text: str, now: float) -> None:
        cmd.record.add(stream, raw, text)
        # A prompt may be on either stream (bash's `read -p` writes it to stderr).
        if text and stream in ("stdout", "stderr"):
            line_end = max(text.rfind("\n"), text.rfind("\r"))
            cmd.partial = (cmd.partial + text if line_end < 0 else text[line_end + 1:])[-PROMPT_CHARS:]
        if cmd.on_live is not None:
            self._send_live(cmd, cmd.batcher.add(stream, text, now))

    def _note(self, cmd: Command, text: str, now: float) -> None:
        """A line of the runner's own in the command's output, on the `note` stream: clients show it
        as theirs (not as the program's stderr), and it is no part of a prompt."""
        cmd.record.add("note", text.encode(), text)
        if cmd.on_live is not None:
            self._send_live(cmd, cmd.batcher.add("note", text, now))

    def _keep_between(self, stream: str, raw: bytes, text: str) -> None:
        """Keep what a background job printed while no command ran, the latest BETWEEN_LIMIT bytes."""
        if stream == "stderr" and raw == b"\n":
            return  # bash's newline after an aborted line, arriving after the command ended
        self._between.append((stream, raw, text))
        self._between_bytes += len(raw)
        while self._between_bytes > BETWEEN_LIMIT and len(self._between) > 1:
            _, dropped, _ = self._between.popleft()
            self._between_bytes -= len(dropped)
            self._between_dropped += len(dropped)

    def _hand_over_between(self, cmd: Command, now: float) -> None:
        """Put the output kept from between commands at the start of `cmd`'s output."""
        if not self._between and not self._between_dropped:
            return
        if self._between_dropped:
            dropped = self._between_dropped
            self._note(cmd, f"[{dropped} earlier {noun(dropped, 'byte')} printed by background jobs between "
                            f"commands {noun(dropped, 'was', 'were')} dropped; the latest follow]\n", now)
        for stream, raw, text in self._between:
            self._add(cmd, stream, raw, text, now)
        self._between.clear()
        self._between_bytes = self._between_dropped = 0

    def _check_for_reader(self, cmd: Command, now: float) -> None:
        """Whether the command now waits to read its terminal: if so, say so once (with the prompt it
        printed, and whether echo is off), or, when no one can answer, give it end-of-input."""
        if cmd.stopping or now - cmd.last_check < INPUT_CHECK_SECONDS:
            return
        cmd.last_check = now
        wait = waiting_reader(self.pid, [terminal.device for terminal in self._terminals],
                              [terminal.hides_input() for terminal in self._terminals])
        if wait is None:
            cmd.seen_waiting = False
            return
        if wait == cmd.handled:
            return  # the wait already asked about (or answered, and the reader has not run since)
        # What the reader printed before it began to wait may still be on its way through the terminal
        # (a terminal hands output on from a kernel worker): a read of the terminal's end makes it hand
        # over what it holds at once, where a poll would not. So read both, then look at the prompt.
        ttys = [(self._selector.get_key(tty.master), 0) for tty in self._terminals]
        self._take(ttys, now)
        if self._current is not cmd:
            return
        self._flush_lines(now)  # a command waiting to read has written all it will before the answer
        if not cmd.partial and not cmd.seen_waiting:
            cmd.seen_waiting = True  # no prompt yet: one more look, in case it is still in the terminal
            return
        cmd.handled = wait
        cmd.reading = wait[2]
        cmd.seen_waiting = False
        terminal = self._terminals[cmd.reading]
        if not cmd.allow_stdin:
            if not cmd.eof_noted:
                cmd.eof_noted = True
                self._note(cmd, EOF_NOTE, now)
            cmd.partial = ""
            terminal.write(terminal.end_of_input())
            return
        self._send_live(cmd, cmd.batcher.flush())  # the prompt goes out before the question
        assert cmd.on_live is not None
        cmd.on_live(SHELL_INPUT_WANTED, {"prompt": cmd.partial, "password": terminal.hides_input()})

    def write_input(self, text: str | None) -> None:
        """Type `text` and Enter into the running command's terminal (None: end-of-input)."""
        with self._lock:
            cmd = self._current
            if cmd is None or cmd is self._starting:
                raise RunnerError(INVALID_PARAMS, f"shell '{self.name}' runs no command to give input to")
            if not cmd.terminal:
                raise RunnerError(INVALID_PARAMS, f"shell '{self.name}' runs its command without a terminal "
                                                  "(%terminal off): its stdin is empty")
        cmd.partial = ""  # the next prompt is what comes after the answer (which may come at once)
        terminal = self._terminals[cmd.reading]
        if text is None:
            terminal.write(terminal.end_of_input())
        else:
            data = text.replace("\r\n", "\n").replace("\n", " ").encode("utf-8", "surrogateescape") + b"\n"
            if terminal.echoes():  # by the terminal, or by a line editor (readline) in its place
                self._echo[_TTY_CHANNELS[cmd.reading]].expect(data)
            terminal.write(data)

    def _maybe_progress(self, cmd: Command) -> None:
        """A command that has printed nothing for a while still says it is alive (`shell.progress`)."""
        now = time.monotonic()
        if cmd is self._starting or now - cmd.last_news < PROGRESS_SECONDS:
            return
        cmd.last_news = now
        assert cmd.on_live is not None
        cmd.on_live(SHELL_PROGRESS, {"elapsed_s": round(now - cmd.started, 3), "output_bytes": cmd.record.output_bytes})

    def _send_live(self, cmd: Command, frames: list[dict[str, Any]]) -> None:
        if frames:
            cmd.last_news = time.monotonic()
        for frame in frames:
            cmd.frames_sent += 1
            frame["seq"] = cmd.frames_sent
            assert cmd.on_live is not None
            cmd.on_live(SHELL_OUTPUT, frame)

    def _on_marker(self, stream: str, payload: bytes, now: float) -> None:
        cmd = self._current
        parts = payload.decode("utf-8", "replace").split(":", 2)
        written = self._definitions_wanted.get(parts[0])
        if written is not None:
            written.set()
            return
        if cmd is not None and parts[0] == START_MARK and parts[1:] == [cmd.token] and stream == "stdout":
            with self._lock:  # `_stop` reads it under this lock: a Stop before this moment waited for it
                cmd.begun = True
                stopping = cmd.stopping
            if stopping:
                self._start_stopping(cmd)
            return
        if cmd is None or parts[0] != cmd.token:
            return  # a stale marker, printed again after an abort: drop it
        self._hand_over_between(cmd, now)
        if stream == "stdout":
            if len(parts) == 3:
                try:
                    cmd.exit_code = int(parts[1])
                except ValueError:
                    cmd.exit_code = None
                cmd.cwd = parts[2]
            cmd.out_done = True
        else:
            cmd.err_done = True
        if cmd.out_done and cmd.err_done and cmd.advance("ended"):
            self._flush_lines(now)  # all of the command's output is in: what waits goes out
            for chatter in self._chatter.values():
                chatter.fresh_line()  # nothing is held after `_flush_lines`
            self._finish(cmd)

    def _finish(self, cmd: Command, error: str | None = None, outcome: str = P.OUTCOME_EXIT) -> None:
        with self._lock:
            if self._current is not cmd:
                return
            self._current = None
            if cmd.cwd:
                self.cwd = cmd.cwd
            if cmd.exit_code is not None and 0 <= cmd.exit_code <= 255:
                self._last_status = cmd.exit_code
            if self._definitions_used:
                self._refresh_at = time.monotonic() + DEFINITIONS_REFRESH_SECONDS
        if cmd.timer is not None:
            cmd.timer.cancel()  # its thread ends now, not when the timeout would have come
        cmd.batcher.discard()  # what the live view did not get yet is in the record
        output = cmd.record.finish()
        outcome, error = cmd.ending(error, outcome)
        result = M.RunResult(shell=self.name, command=cmd.command, cwd=self.cwd, exit_code=cmd.exit_code,
                             outcome=outcome, output=output, timed_out=cmd.stop_reason == "timeout",
                             truncated=cmd.record.truncated,
                             duration_ms=round((time.monotonic() - cmd.started) * 1000, 3),
                             output_bytes=cmd.record.output_bytes, output_chars=cmd.record.total_chars)
        if error is not None:
            result["error"] = error
        if cmd.record.log_path:
            result["log_path"] = cmd.record.log_path
            result["tail_chars"] = cmd.record.tail_chars
        if cmd.record.segments is not None:
            result["segments"] = cmd.record.segments
        if cmd.meter is not None:
            result["usage"] = cmd.meter.finish()
        cmd.finished.set()
        cmd.on_done(result)

    def _exited(self) -> None:
        now = time.monotonic()
        self._take([(self._selector.get_key(tty.master), 0) for tty in self._terminals], now)  # what is left
        for chatter in self._chatter.values():
            chatter.shell_exited()
        self._flush_lines(now)
        with self._lock:  # `run` checks `alive` and sets `_current` under this lock: one or the other sees
            self.alive = False  # the end, never neither (a command given to a dead bash would wait forever)
            cmd = self._current
        self.exit_status = self._proc.returncode
        for written in list(self._definitions_wanted.values()):
            written.set()
        if self.definitions_path is not None:
            try:
                os.unlink(self.definitions_path)
            except OSError:
                pass
        if cmd is not None:
            cmd.advance("ended")
            self._hand_over_between(cmd, time.monotonic())
            if cmd.exit_code is None and self.exit_status is not None and self.exit_status >= 0:
                cmd.exit_code = self.exit_status
            reason = (f"the shell '{self.name}' exited (status {self.exit_status}); the next command starts a "
                      f"new shell in {self.cwd} (variables are gone)")
            if cmd.stop_reason == "interrupt":
                reason = "interrupted by user; the shell had to be ended, and a new one starts in its folder"
            self._finish(cmd, reason, P.OUTCOME_SHELL_EXITED)
        for stream in (self._proc.stdout, self._proc.stderr, self._proc.stdin):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self._selector.close()
        with self._lock:
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
        self._tty.close()
        self._tty_err.close()
        if self.on_exit is not None:
            self.on_exit(self)

    # -- ending -----------------------------------------------------------------------------

    def kill(self) -> None:
        """End the shell and everything started in its session."""
        members = session_members(self.pid)
        _signal_all(members, signal.SIGKILL)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def close(self, wait: float = 5.0) -> None:
        self.kill()
        self._reader.join(wait)

    def describe(self) -> dict[str, Any]:
        cmd = self._current
        busy = cmd is not None and cmd is not self._starting
        return {"name": self.name, "cwd": self.cwd, "busy": busy, "pid": self.pid,
                "command": cmd.command if busy and cmd else None,
                "running_s": round(time.monotonic() - cmd.started, 3) if busy and cmd else None}
