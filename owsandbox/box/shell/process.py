"""The bash of one shell, as a process: started, written to, signalled, ended.

Each shell is `bash -i --norc --noprofile --noediting` on pipes, in a session of its own. Interactive
mode is what makes Stop keep state: SIGINT to the shell's process group aborts the running command
line and bash goes on reading with its folder and variables intact, where a non-interactive bash
would die. Beside the pipes, the shell has two pseudo terminals (terminal.py): with `%terminal` on, a
command's stdin and stdout are the first, its stderr the second.

A Stop is SIGINT, repeated, then TERM and KILL for what the shell's session started, then the shell
(`escalate`): which of these a command needs is not known in advance, and each comes only when the
one before did not end it. The shell is ended only when it is stuck in itself, judged by its own CPU
time rather than by the clock alone (`_end_if_stuck`): ending it loses its variables.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import IO

from .. import procstat
from ..procstat import session_members
from .terminal import DEFAULT_COLS, DEFAULT_ROWS, NOTEBOOK_ENV, PseudoTerminal

STUCK_CPU_SECONDS = 1.0  # bash still not back after this much CPU time of its own spins in itself
STUCK_SECONDS = 10.0  # nor after this long, however busy the machine: it waits in itself
STUCK_LOOK_SECONDS = 0.1


def signal_all(pids: list[int], sig: int) -> None:
    """Send `sig` to each of `pids`, the ones gone meanwhile passed over."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


class BashProcess:
    """A started bash, its pipes (`stdout`, `stderr`; `write` is its stdin) and its two terminals."""

    def __init__(self, name: str, cwd: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        shell_env = dict(os.environ if env is None else env)
        shell_env["OWSANDBOX_SHELL"] = name
        shell_env.update(NOTEBOOK_ENV)
        shell_env.setdefault("COLUMNS", str(DEFAULT_COLS))
        shell_env.setdefault("LINES", str(DEFAULT_ROWS))
        self.env_size = (shell_env["COLUMNS"], shell_env["LINES"])  # as `export`ed in the shell last
        self.tty = PseudoTerminal()
        self.tty_err = PseudoTerminal()
        self.terminals = (self.tty, self.tty_err)  # in the order `waiting_reader` names them
        self.proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile", "--noediting", "-i"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=cwd, env=shell_env, start_new_session=True, bufsize=0,
        )
        self.pid = self.proc.pid
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self._stdin: IO[bytes] = self.proc.stdin
        self.stdout: IO[bytes] = self.proc.stdout
        self.stderr: IO[bytes] = self.proc.stderr

    def write(self, text: str) -> None:
        """Give bash `text`; OSError when it cannot take it (gone, or its pipe closed since)."""
        try:
            self._stdin.write(text.encode("utf-8", "surrogateescape"))
            self._stdin.flush()
        except ValueError as exc:  # closed by `close`: as gone as a broken pipe
            raise BrokenPipeError(f"shell '{self.name}' has exited: {exc}") from exc

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except OSError:
            pass

    def kill(self) -> None:
        """End the shell and everything started in its session."""
        signal_all(session_members(self.pid), signal.SIGKILL)
        self.signal_group(signal.SIGKILL)

    def escalate(self, finished: threading.Event, markers: str) -> None:
        """SIGINT, repeated (one that lands while bash is between reading the line and starting the
        program is lost), each time with the end `markers` again (status 130): a SIGINT that bash
        takes while it reads the marker line throws that line away. Markers given once too often
        name a command that has ended, and are dropped. Then TERM and KILL for everything in the
        shell's session but bash itself; last, the shell. Each step waits for `finished` first."""
        for wait in (0.1, 0.2, 0.3, 0.4):
            if finished.wait(wait):
                return
            self.signal_group(signal.SIGINT)
            try:  # if these are the ones that count, the command's own status went with the lost line
                self.write(markers)
            except OSError:
                pass
        if finished.wait(0.5):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            signal_all([p for p in session_members(self.pid) if p != self.pid], sig)
            if finished.wait(1.0):
                return
        self._end_if_stuck(finished)

    def _end_if_stuck(self, finished: threading.Event) -> None:
        """The last step of a Stop, once everything the command started has been killed: bash comes back
        to its prompt by itself unless it is stuck in itself (a loop of builtins, or a builtin that waits,
        with SIGINT ignored). Only then is the shell, with its variables, ended: when bash has spent
        STUCK_CPU_SECONDS of its own CPU time without finishing, or STUCK_SECONDS have passed. A fixed
        second of wall time ended healthy shells on a busy machine, where bash (or the reader of its
        end markers) was simply not run in time."""
        began = procstat.cpu_seconds(self.pid)
        deadline = time.monotonic() + STUCK_SECONDS
        while not finished.wait(STUCK_LOOK_SECONDS):
            used = procstat.cpu_seconds(self.pid)
            if used is None:
                return  # bash is gone: the reader sees the shell end
            if used - (began or 0.0) >= STUCK_CPU_SECONDS or time.monotonic() >= deadline:
                self.kill()
                return

    def close(self) -> None:
        """Close the pipes and the terminals, once bash has ended and all they held is read."""
        for stream in (self.stdout, self.stderr, self._stdin):
            try:
                stream.close()
            except OSError:
                pass
        self.tty.close()
        self.tty_err.close()
