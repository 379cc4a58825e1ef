"""A terminal for a shell's commands, set up for a notebook, and the signs that a command waits on it.

Programs treat a pipe and a terminal differently: on a pipe they buffer their output in blocks (so
nothing shows until the end), print no colours, and have no one to ask. A cell stands for a terminal,
so a shell's commands get one: a pseudo-terminal as stdin and stdout, and a second one as stderr (so
`isatty(2)` holds for progress bars while stderr stays a stream of its own).

The settings suit a notebook: no `\\r\\n` for `\\n` (the notebook renders lines itself), a window size,
and the usual echo, which the shell strips from what it writes as input (the notebook shows what the
user typed). Whether a command waits to read the terminal is read from /proc: a process of the
shell's tree blocked in `read` on the terminal (or polling it alone), never guessed from a silence.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import termios

DEFAULT_COLS = 120
DEFAULT_ROWS = 50
# What keeps programs from taking over a screen the notebook does not have.
NOTEBOOK_ENV = {"TERM": "xterm-256color", "PAGER": "cat", "GIT_PAGER": "cat", "MANPAGER": "cat", "LESS": "-FRX",
                "SYSTEMD_PAGER": ""}
EOF_NOTE = "[stdin is not available in this run: read got end-of-input]\n"

# System call numbers by machine: (read, poll, ppoll, select, pselect6).
_SYSCALLS = {"x86_64": (0, 7, 271, 23, 270), "aarch64": (63, None, 73, None, 72)}


class PseudoTerminal:
    """One pty pair; the daemon keeps both ends open for the shell's lifetime."""

    def __init__(self, cols: int = DEFAULT_COLS, rows: int = DEFAULT_ROWS) -> None:
        self.master, self.slave = os.openpty()
        self.path = os.ttyname(self.slave)
        os.set_blocking(self.master, False)
        self.settings = notebook_settings(termios.tcgetattr(self.slave))
        self.reset()
        self.size = (0, 0)
        self.resize(cols, rows)

    def reset(self) -> None:
        """Back to the notebook's settings (a program may have left the terminal raw or silent)."""
        termios.tcsetattr(self.slave, termios.TCSANOW, self.settings)

    def resize(self, cols: int, rows: int) -> None:
        if (cols, rows) != self.size:
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            self.size = (cols, rows)

    def _local_modes(self) -> int:
        try:
            return termios.tcgetattr(self.slave)[3]
        except termios.error:
            return termios.ECHO | termios.ICANON

    def echoes(self) -> bool:
        """Whether what is typed comes back as output: the terminal's echo, or a line editor's (readline
        turns the terminal's echo and line mode off and echoes each character itself)."""
        modes = self._local_modes()
        return bool(modes & termios.ECHO) or not modes & termios.ICANON

    def hides_input(self) -> bool:
        """A password read: line mode with echo off (`read -s`, getpass); a line editor is not one."""
        modes = self._local_modes()
        return bool(modes & termios.ICANON) and not modes & termios.ECHO

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.master, view):]
            except BlockingIOError:
                select.select([], [self.master], [], 1.0)

    def end_of_input(self) -> bytes:
        """The character that makes a waiting read return nothing (at the start of a line)."""
        return termios.tcgetattr(self.slave)[6][termios.VEOF]

    def close(self) -> None:
        for fd in (self.master, self.slave):
            try:
                os.close(fd)
            except OSError:
                pass


def notebook_settings(attrs: list) -> list:
    attrs = list(attrs)
    attrs[6] = list(attrs[6])
    attrs[1] = attrs[1] & ~termios.OPOST  # output as written: `\n` stays `\n` (and no per-character pass)
    attrs[0] = attrs[0] | termios.ICRNL
    attrs[3] = attrs[3] | termios.ICANON | termios.ISIG | termios.IEXTEN | termios.ECHO
    attrs[3] &= ~termios.ECHOCTL  # end-of-input echoes nothing
    return attrs


class EchoStripper:
    """Takes out of a terminal's output the echo of what was written as input, once, in order."""

    def __init__(self) -> None:
        self.pending = b""

    def expect(self, data: bytes) -> None:
        self.pending += data

    def strip(self, data: bytes) -> bytes:
        if not self.pending or not data:
            return data
        common = 0
        limit = min(len(self.pending), len(data))
        while common < limit and self.pending[common] == data[common]:
            common += 1
        if common < limit:  # something else came first: the echo is not where expected, keep all
            self.pending = b""
            return data
        self.pending = self.pending[common:]
        return data[common:]


def process_tree(root: int) -> list[int]:
    """`root` and its descendants, through /proc/PID/task/TID/children."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
            except (OSError, ValueError):
                continue
    return found


def _fd_is(pid: int, fd: int, path: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}") == path
    except OSError:
        return False


def _sleeps(pid: int) -> int | None:
    """How many times the process has gone to sleep: a read that returned and a new one that began
    differ in it, the same read still waiting does not."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def waiting_reader(root: int, tty_path: str) -> tuple[int, int | None] | None:
    """The wait of a process in `root`'s tree blocked reading the terminal at `tty_path` (in `read` on
    it, or in poll/select on a single descriptor while its stdin is that terminal: a line editor), as
    (pid, sleeps): the same pair means the same wait. None when nothing waits."""
    numbers = _SYSCALLS.get(os.uname().machine)
    if numbers is None:
        return None
    read_nr, poll_nr, ppoll_nr, select_nr, pselect_nr = numbers
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/syscall") as f:
                fields = f.read().split()
        except OSError:
            continue
        if len(fields) < 3 or not fields[0].isdigit():
            continue  # running, or not in a system call
        number, args = int(fields[0]), [int(a, 16) for a in fields[1:4]]
        if ((number == read_nr and _fd_is(pid, args[0], tty_path))
                or (number in (poll_nr, ppoll_nr) and args[1] == 1 and _fd_is(pid, 0, tty_path))
                or (number in (select_nr, pselect_nr) and args[0] == 1 and _fd_is(pid, 0, tty_path))):
            return pid, _sleeps(pid)
    return None
