"""Named, persistent bash shells that run one command at a time and can be stopped without dying.

`Shell` puts the parts together: the bash process (process.py), the reader of its channels
(reader.py), where the output goes (delivery.py), a read of the terminal (prompts.py), the file of
its definitions for completion (definitions.py) and each command's life (command.py). A command is
sent as `eval $'...'`, so a syntax error cannot swallow what follows. With a terminal (terminal.py),
its stdin and output are the shell's two terminals, and a read of the terminal is reported or given
end-of-input; without one, it reads an empty stdin and writes to the pipes. After it, a separate line
prints an end marker on the channels its stdout and stderr took (through descriptors saved at start,
so a command that redirects its own output cannot hide them); the result goes out once both markers
are in, so both streams are drained.

Two things carry from one command to the next, as in a terminal: `$?` (the next command line gives
it back, so `false` and then `echo $?` says 1), and what background jobs print while no command
runs (delivery.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from ... import protocol as P
from ...protocol import INTERNAL_ERROR, INVALID_PARAMS, SHELL_BUSY, RunnerError
from ...protocol import messages as M
from .. import procstat
from ..procstat import session_members as session_members  # where callers have always found it
from .capture import LiveBatcher, OutputRecord
from .cellusage import CellMeter
from .command import FINAL, SIGNALLED, Command, CommandEvent, LiveSink
from .definitions import Definitions
from .delivery import Delivery
from .lines import (
    LEAD,
    SHELL_INIT,
    START_MARK,
    TTY_ERR_FD,
    TTY_OUT_FD,
    channel_fds,
    command_line,
    marker_lines,
    output_mode_line,
)
from .process import BashProcess
from .prompts import INPUT_CHECK_SECONDS, Prompts
from .reader import ChannelReader, notice_channel
from .terminal import DEFAULT_COLS, DEFAULT_ROWS

BEGIN_WAIT_SECONDS = 1.0  # how long a Stop waits for a command's start mark before it signals anyway
DEFAULT_OUTPUT_LIMIT = 1024 * 1024  # characters kept in memory per command, unless the request asks
MAX_OUTPUT_LIMIT = 16 * 1024 * 1024  # the most a request may ask for
_STOP_EVENT = {"interrupt": CommandEvent.INTERRUPT, "timeout": CommandEvent.TIMEOUT}


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
        self._mode: tuple[bool, bool] = (False, False)  # (terminal, merge) the shell's descriptors point at
        self._bash = BashProcess(name, cwd, env)
        self.pid = self._bash.pid
        path = None if definitions_dir is None else os.path.join(definitions_dir, f"shell-{self.pid}.sh")
        self._definitions = Definitions(path, self._lock, lambda: self.alive and self._current is None,
                                        self._bash.write)
        self._delivery = Delivery(lambda: self._current)
        self._channels = ChannelReader(self._bash, self._delivery.deliver, self._on_marker,
                                       self._running_notices, self._is_job)
        self._prompts = Prompts(self._bash, self._channels, self._delivery, lambda: self._current)
        ready = threading.Event()
        self._starting = Command(":", "start", OutputRecord(1 << 16, self._open_log), LiveBatcher(),
                                 None, lambda _result: ready.set(), None)
        self._current = self._starting
        # Opened by path in bash, the first terminal becomes the controlling terminal of its session
        # (so /dev/tty, getpass and Ctrl-C through the terminal work as in a terminal).
        ttys = f"exec {TTY_OUT_FD}<>{self._bash.tty.path} {TTY_ERR_FD}<>{self._bash.tty_err.path}\n"
        self._bash.write(SHELL_INIT + ttys + marker_lines("start"))
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
        cmd = Command(command, os.urandom(8).hex(), OutputRecord(limit, self._open_log),
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
            self._definitions.command_started()  # a command that comes at once goes first
        lines = ""
        if (terminal, merge) != self._mode:
            lines += output_mode_line(terminal, merge)
            self._mode = (terminal, merge)
        if terminal:
            for tty in self._bash.terminals:
                tty.resize(cols, rows)
            self._bash.tty.reset()
            if (str(cols), str(rows)) != self._bash.env_size:
                lines += f"{LEAD}export COLUMNS={cols} LINES={rows}\n"
                self._bash.env_size = (str(cols), str(rows))
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
                    self._bash.write(lines)
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

    @property
    def definitions_path(self) -> str | None:
        """Where `write_definitions` puts them (None: not asked for)."""
        return self._definitions.path

    def write_definitions(self, timeout: float = 5.0) -> bool:
        """Have the shell write its functions, aliases and PATH to `definitions_path`, if it is idle;
        True once they are written. A busy shell is left alone: its file is as it was (once asked, a
        shell writes them again whenever it has been idle a moment after a command). An idle shell
        writes them in about a millisecond; the bound is for a machine so loaded that it takes
        seconds, where a shorter one had the Tab read the file while the shell was still writing it."""
        return self._definitions.write_now(timeout) and self.alive

    # -- stopping ---------------------------------------------------------------------------

    def interrupt(self, cmd: Command | None = None) -> bool:
        """Stop `cmd` (`run` returned it), or else the running command, as Ctrl-C would; whether it is
        being stopped now (False when it has ended, or nothing runs)."""
        cmd = cmd or self._current
        if cmd is None or cmd is self._starting:
            return False
        return self._stop(cmd, "interrupt")

    def _stop(self, cmd: Command, reason: str) -> bool:
        """Stop `cmd` for `reason` ("interrupt", "timeout"); whether it is being stopped (by this call or
        an earlier one). A command that bash has not begun yet is signalled when it begins (the start
        mark, `_on_marker`): a SIGINT while bash reads its input would cost the shell."""
        with self._lock:
            if self._current is not cmd:
                return False
            before, after = cmd.advance(_STOP_EVENT[reason])
        if after in FINAL:
            return False  # it ended as the stop came
        if before is not after:  # this stop is the first: signal now, or once bash begins the line
            if after in SIGNALLED:
                self._start_stopping(cmd)
            else:  # should the start mark never come (bash stuck before the line), stop it all the same
                timer = threading.Timer(BEGIN_WAIT_SECONDS, self._begin_wait_over, args=(cmd,))
                timer.daemon = True
                timer.start()
        return True

    def _begin_wait_over(self, cmd: Command) -> None:
        """A stop has waited BEGIN_WAIT_SECONDS for bash to begin the line: signal it now, unless the
        start mark came first (it was signalled then) or it has ended."""
        before, after = cmd.advance(CommandEvent.BEGIN_WAIT_OVER)
        if before not in SIGNALLED and after in SIGNALLED:
            self._start_stopping(cmd)

    def _start_stopping(self, cmd: Command) -> None:
        """SIGINT, and the escalation: once per command (the move into `SIGNALLED` is made once), and
        only while it is the shell's command."""
        with self._lock:
            if self._current is not cmd:
                return
        self._bash.signal_group(signal.SIGINT)  # at once; the thread repeats and escalates if need be
        markers = marker_lines(cmd.token, *cmd.marker_fds, status="130")
        threading.Thread(target=self._bash.escalate, args=(cmd.finished, markers), daemon=True).start()

    def kill(self) -> None:
        """End the shell and everything started in its session."""
        self._bash.kill()

    def close(self, wait: float = 5.0) -> None:
        self.kill()
        self._reader.join(wait)

    def _wake(self) -> None:
        with self._lock:  # the reader closes the pipe under it, once the shell is not alive
            if self.alive:
                self._channels.wake()

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
            deadlines = self._channels.deadlines()
            if cmd is not None:
                deadlines.append(cmd.batcher.deadline())
                if cmd.meter is not None:
                    deadlines.append(cmd.meter.due())
            deadline = min((d for d in deadlines if d is not None), default=None)
            timeout = 0.5 if deadline is None else max(0.0, deadline - time.monotonic())
            if self._channels.holding:
                timeout = min(timeout, INPUT_CHECK_SECONDS)  # an `exit` echo waits to see the shell end
            if cmd is not None and cmd.terminal:
                timeout = min(timeout, INPUT_CHECK_SECONDS)  # to notice a read of the terminal
            refresh_at = self._definitions.refresh_at
            if cmd is None and refresh_at is not None:
                timeout = max(0.0, min(timeout, refresh_at - time.monotonic()))
            # Wake at least twice a second: a shell that exited while a background job still holds
            # its pipes sends no EOF, so its exit is noticed by polling.
            events, ready = self._channels.select(min(timeout, 0.5))
            now = time.monotonic()
            if not ready and self._bash.proc.poll() is not None:
                break
            open_streams -= self._channels.take(events, now)
            lines = self._channels.lines
            if lines.waiting_for is not None and now >= (lines.deadline() or now):
                self._channels.finish_line(now)  # the last chance for the line's end before the wait is over
            self._channels.due(now)
            cmd = self._current
            if cmd is not None:
                self._delivery.hand_over_between(cmd, now)
                if cmd.terminal and cmd is not self._starting:
                    self._prompts.check(cmd, now)
            if cmd is not None and cmd.meter is not None:
                cmd.meter.sample_if_due(now)
            if cmd is not None and cmd.on_live is not None:
                self._delivery.send_live(cmd, cmd.batcher.due(time.monotonic()))
                if cmd is not self._starting:
                    self._delivery.maybe_progress(cmd)
            refresh_at = self._definitions.refresh_at
            if refresh_at is not None and now >= refresh_at:
                self._definitions.refresh()
        self._bash.proc.wait()
        self._exited()

    def _running_notices(self) -> str | None:
        """The channel bash's stderr goes to for the running command (None: no command runs)."""
        cmd = self._current
        return cmd.notice_channel if cmd is not None and cmd is not self._starting else None

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

    def write_input(self, text: str | None) -> None:
        """Type `text` and Enter into the running command's terminal (None: end-of-input)."""
        with self._lock:
            cmd = self._current
            if cmd is None or cmd is self._starting:
                raise RunnerError(INVALID_PARAMS, f"shell '{self.name}' runs no command to give input to")
            if not cmd.terminal:
                raise RunnerError(INVALID_PARAMS, f"shell '{self.name}' runs its command without a terminal "
                                                  "(%terminal off): its stdin is empty")
        self._prompts.answer(cmd, text)

    # -- a command's end --------------------------------------------------------------------

    def _on_marker(self, stream: str, payload: bytes, now: float) -> None:
        cmd = self._current
        parts = payload.decode("utf-8", "replace").split(":", 2)
        if self._definitions.on_marker(parts[0]):
            return
        if cmd is not None and parts[0] == START_MARK and parts[1:] == [cmd.token] and stream == "stdout":
            before, after = cmd.advance(CommandEvent.BEGUN)
            if before not in SIGNALLED and after in SIGNALLED:  # a stop waited for this moment
                self._start_stopping(cmd)
            return
        if cmd is None or parts[0] != cmd.token:
            return  # a stale marker, printed again after an abort: drop it
        self._delivery.hand_over_between(cmd, now)
        if stream == "stdout" and len(parts) == 3:
            try:
                cmd.exit_code = int(parts[1])
            except ValueError:
                cmd.exit_code = None
            cmd.cwd = parts[2]
        if cmd.end_marker(stream):
            cmd.advance(CommandEvent.MARKERS_IN)
            self._channels.flush_lines(now)  # all of the command's output is in: what waits goes out
            self._channels.fresh_line()
            self._finish(cmd)

    def _finish(self, cmd: Command) -> None:
        """Hand over `cmd`'s result: how it ended is its final state's (`Command.ending`)."""
        with self._lock:
            if self._current is not cmd:
                return
            self._current = None
            ending = cmd.ending(self.name, self.exit_status, self.cwd)  # the folder it ended in, for its error
            if cmd.cwd:
                self.cwd = cmd.cwd
            if cmd.exit_code is not None and 0 <= cmd.exit_code <= 255:
                self._last_status = cmd.exit_code
            self._definitions.command_ended()
        if cmd.timer is not None:
            cmd.timer.cancel()  # its thread ends now, not when the timeout would have come
        cmd.batcher.discard()  # what the live view did not get yet is in the record
        output = cmd.record.finish()
        result = M.RunResult(shell=self.name, command=cmd.command, cwd=self.cwd, exit_code=cmd.exit_code,
                             outcome=ending.outcome, output=output, timed_out=ending.timed_out,
                             truncated=cmd.record.truncated,
                             duration_ms=round((time.monotonic() - cmd.started) * 1000, 3),
                             output_bytes=cmd.record.output_bytes, output_chars=cmd.record.total_chars)
        if ending.error is not None:
            result["error"] = ending.error
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
        self._channels.take_terminals(now)  # what is left
        self._channels.shell_exited()
        self._channels.flush_lines(now)
        with self._lock:  # `run` checks `alive` and sets `_current` under this lock: one or the other sees
            self.alive = False  # the end, never neither (a command given to a dead bash would wait forever)
            cmd = self._current
        self.exit_status = self._bash.proc.returncode
        self._definitions.shell_exited()
        if cmd is not None:
            cmd.advance(CommandEvent.SHELL_GONE)
            self._delivery.hand_over_between(cmd, time.monotonic())
            if cmd.exit_code is None and self.exit_status is not None and self.exit_status >= 0:
                cmd.exit_code = self.exit_status
            self._finish(cmd)
        with self._lock:
            self._channels.close()
        self._bash.close()
        if self.on_exit is not None:
            self.on_exit(self)

    def describe(self) -> dict[str, Any]:
        cmd = self._current
        busy = cmd is not None and cmd is not self._starting
        return {"name": self.name, "cwd": self.cwd, "busy": busy, "pid": self.pid,
                "command": cmd.command if busy and cmd else None,
                "running_s": round(time.monotonic() - cmd.started, 3) if busy and cmd else None}
