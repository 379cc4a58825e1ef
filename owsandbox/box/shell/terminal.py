"""A terminal for a shell's commands, set up for a notebook, and the signs that a command waits on it.

Programs treat a pipe and a terminal differently: on a pipe they buffer their output in blocks (so
nothing shows until the end), print no colours, and have no one to ask. A cell stands for a terminal,
so a shell's commands get one: a pseudo-terminal as stdin and stdout, and a second one as stderr (so
`isatty(2)` holds for progress bars while stderr stays a stream of its own).

The settings suit a notebook: no `\\r\\n` for `\\n` (the notebook renders lines itself), a window size,
and the usual echo, which the shell strips from what it writes as input (the notebook shows what the
user typed). Whether a command waits to read the terminal is read from /proc: a process of the
shell's tree blocked in `read` on the terminal (or polling it alone), never guessed from a silence.

"The terminal" is a device, not a path: getpass, sudo, ssh and `read </dev/tty` read a descriptor
opened through /dev/tty, whose /proc link names /dev/tty and whose device is /dev/tty's own (5, 0);
it stands for the reader's controlling terminal, which /proc/PID/stat names. A dup, /dev/stdin or a
second open of /dev/pts/N is the same device under another descriptor. So a descriptor is compared
by its device (and, for /dev/tty, by the process's controlling terminal), never by its link's text.
"""

from __future__ import annotations

import fcntl
import os
import select
import stat
import struct
import sys
import termios
from collections.abc import Sequence

from .. import procstat

DEFAULT_COLS = 120
DEFAULT_ROWS = 50
# What keeps programs from taking over a screen the notebook does not have.
NOTEBOOK_ENV = {"TERM": "xterm-256color", "PAGER": "cat", "GIT_PAGER": "cat", "MANPAGER": "cat", "LESS": "-FRX",
                "SYSTEMD_PAGER": ""}
EOF_NOTE = "[stdin is not available in this run: read got end-of-input]\n"

# System call numbers by machine: (read, poll, ppoll, select, pselect6).
_SYSCALLS = {"x86_64": (0, 7, 271, 23, 270), "aarch64": (63, None, 73, None, 72)}
DEV_TTY = os.makedev(5, 0)  # /dev/tty: the controlling terminal of whoever opens it
_MAX_POLLED = 64  # a poll of more descriptors than this is no one waiting for a key
_POLLIN_OR_PRI = 0x1 | 0x2


class PseudoTerminal:
    """One pty pair; the daemon keeps both ends open for the shell's lifetime."""

    def __init__(self, cols: int = DEFAULT_COLS, rows: int = DEFAULT_ROWS) -> None:
        self.master, self.slave = os.openpty()
        self.path = os.ttyname(self.slave)
        found = os.fstat(self.slave)
        self.device = (found.st_dev, found.st_rdev)  # what a reader's descriptor is compared with
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


def controlling_terminal(pid: int) -> int | None:
    """The device number of the process's controlling terminal (`tty_nr` of /proc/PID/stat, whose
    minor number is split around the major one), None when it has none or is gone."""
    value = procstat.field(pid, "tty_nr")
    try:
        tty_nr = int(value) if value is not None else 0
    except ValueError:
        return None
    if not tty_nr:
        return None
    return os.makedev((tty_nr >> 8) & 0xFFF, (tty_nr & 0xFF) | ((tty_nr >> 12) & 0xFFF00))


def terminal_of(pid: int, fd: int, terminals: Sequence[tuple[int, int]]) -> int | None:
    """Which of `terminals` (the `device` of each) the process's descriptor `fd` is, if any: the same
    device on the same devpts, or /dev/tty while that one is the process's controlling terminal."""
    try:
        found = os.stat(f"/proc/{pid}/fd/{fd}")
    except (OSError, ValueError):
        return None
    if not stat.S_ISCHR(found.st_mode):
        return None
    for index, (dev, rdev) in enumerate(terminals):
        if (found.st_dev, found.st_rdev) == (dev, rdev):
            return index
    if found.st_rdev != DEV_TTY:
        return None
    controlling = controlling_terminal(pid)
    for index, (_, rdev) in enumerate(terminals):
        if controlling == rdev:
            return index
    return None


def _memory(pid: int, address: int, size: int) -> bytes | None:
    """Bytes of the process's memory (the box's daemon is an ancestor of what it reads), None when
    it may not be read."""
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.pread(fd, size, address)
    except (OSError, OverflowError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if len(data) == size else None


def _polled(pid: int, address: int, count: int) -> list[int] | None:
    """The descriptors a poll() waits to read, from its `struct pollfd` array."""
    if not 0 < count <= _MAX_POLLED:
        return None
    data = _memory(pid, address, 8 * count)
    if data is None:
        return None
    found = []
    for fd, events, _ in struct.iter_unpack("=ihh", data):
        if fd >= 0 and events & _POLLIN_OR_PRI:
            found.append(fd)
    return found


def _selected(pid: int, count: int, address: int) -> list[int] | None:
    """The descriptors a select() waits to read, from its read set (`count` bits at `address`)."""
    if not 0 < count <= 1024 or not address:
        return None
    size = (count + 63) // 64 * 8
    data = _memory(pid, address, size)
    if data is None:
        return None
    bits = int.from_bytes(data, sys.byteorder)
    return [fd for fd in range(count) if bits >> fd & 1]


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


def waiting_reader(root: int, terminals: Sequence[tuple[int, int]],
                   hidden: Sequence[bool] = ()) -> tuple[int, int | None, int] | None:
    """The wait of a process in `root`'s tree blocked reading one of `terminals` (in `read` on it, or
    in poll/select on it alone: a line editor waiting for a key; one that also waits on a socket, as
    ssh in a session does, is not asking), as (pid, sleeps, which terminal): the same triple means the
    same wait. None when nothing waits. Without leave to read a process's memory, a poll or select of
    one descriptor is taken to be of stdin, as a line editor's is.

    A setuid program (sudo, su, run by a plain user) cannot be looked into at all: such a process,
    asleep, with the terminal as its controlling terminal while that terminal hides what is typed
    (`hidden`: echo off in line mode, which only a password read sets), is taken to wait for the
    password, if no process that can be looked into waits."""
    numbers = _SYSCALLS.get(os.uname().machine)
    if numbers is None:
        return None
    read_nr, poll_nr, ppoll_nr, select_nr, pselect_nr = numbers
    sealed: list[int] = []  # processes whose system call may not be read
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/syscall") as f:
                fields = f.read().split()
        except PermissionError:
            sealed.append(pid)
            continue
        except OSError:
            continue
        if len(fields) < 3 or not fields[0].isdigit():
            continue  # running, or not in a system call
        number, args = int(fields[0]), [int(a, 16) for a in fields[1:4]]
        watched: list[int] | None
        if number == read_nr:
            watched = [args[0]]
        elif number in (poll_nr, ppoll_nr):
            watched = _polled(pid, args[0], args[1])
            if watched is None and args[1] == 1:
                watched = [0]
        elif number in (select_nr, pselect_nr):
            watched = _selected(pid, args[0], args[1])
            if watched is None and args[0] == 1:
                watched = [0]
        else:
            continue
        which = {terminal_of(pid, fd, terminals) for fd in watched or ()}
        first = min((index for index in which if index is not None), default=None)
        if first is not None and None not in which:
            return pid, _sleeps(pid), first
    for pid in sealed:
        if procstat.state(pid) != "S":
            continue
        controlling = controlling_terminal(pid)
        for index, (_, rdev) in enumerate(terminals):
            if controlling == rdev and index < len(hidden) and hidden[index]:
                return pid, _sleeps(pid), index
    return None
