"""A shell's four output channels, read and put in order: markers found, bash's chatter told apart,
whole lines, each item handed on once.

Four channels, two streams: the pipes (bash's own, and commands with `%terminal` off) and the two
terminals. Each channel has its own scanner for the marker lines (the end markers, a command's start
mark, the definitions' mark); stdout's `owdisplay` lines become `display` items where they are born.
What reaches the notebook is what the programs wrote, in whole lines (capture.py `WholeLines`: one
stream's half line is not cut by the other's), without bash's own chatter on its stderr: a job
started in the background (`[1] 4242`) and a job's end (`[1]+  Done ...`) become notes, and the
`exit` that bash echoes before it ends is dropped (the result says the shell exited). They are told
apart on the channel bash's stderr goes to by what they are about and when they come (capture.py
`ShellChatter`): the pid of a job this shell has just started, a job bash announced that has ended,
an `exit` right before the shell ends. A program's own line that reads the same keeps its place on
stderr.

The reader hands on `deliver(stream, kind, raw, now, final)` items in their final order and
`on_marker(stream, payload, now)` for each mark; what they mean is the shell's (bash.py).
"""

from __future__ import annotations

import os
import selectors
from collections.abc import Callable

from .. import procstat
from .capture import MarkerScanner, ShellChatter, WholeLines
from .lines import DISPLAY_START
from .process import BashProcess
from .terminal import EchoStripper

STREAM_OF = {"stdout": "stdout", "stderr": "stderr", "tty-out": "stdout", "tty-err": "stderr"}
TTY_CHANNELS = ("tty-out", "tty-err")  # in the order they are read when both have news
STDOUT_GRACE_SECONDS = 0.001
_TTY_CHUNK = 2048  # a terminal read this long means more is queued behind it

Deliver = Callable[..., None]  # (stream, kind, raw, now, final=False)
OnMarker = Callable[[str, bytes, float], None]


def notice_channel(terminal: bool, merge: bool) -> str:
    """The channel the shell's own stderr goes to in this mode (where bash writes its job notices)."""
    return ("tty-out" if merge else "tty-err") if terminal else ("stdout" if merge else "stderr")


def drain(fd: int, room: int) -> bytes:
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


def job_over(pid: int) -> bool:
    """Whether a job's last process has ended or stopped, as bash's report of it would say."""
    state = procstat.state(pid)
    return state is None or state in (*procstat.DEAD_STATES, "T", "t")


class ChannelReader:
    """Reads `process`'s channels (and a wake pipe, so that `wake` cuts a wait short). `running_notices`
    gives the channel bash's stderr goes to for the running command (None: none runs, the last one
    holds); `is_job` says whether a pid is a job of the running command."""

    def __init__(self, process: BashProcess, deliver: Deliver, on_marker: OnMarker,
                 running_notices: Callable[[], str | None], is_job: Callable[[int], bool]) -> None:
        self._process = process
        self._deliver = deliver
        self._on_marker = on_marker
        self._running_notices = running_notices
        self._echo = {"tty-out": EchoStripper(), "tty-err": EchoStripper()}
        self.lines = WholeLines()
        self.chatter = {key: ShellChatter(is_job, job_over) for key in STREAM_OF}
        self._notice_channel = "stderr"  # where bash's stderr goes (as the latest command set it)
        self._scanners = {key: MarkerScanner() for key in STREAM_OF}
        self._displays = {key: MarkerScanner(DISPLAY_START.encode()) for key in ("stdout", "tty-out")}
        self._selector = selectors.DefaultSelector()
        self._selector.register(process.stdout, selectors.EVENT_READ, "stdout")
        self._selector.register(process.stderr, selectors.EVENT_READ, "stderr")
        self._selector.register(process.tty.master, selectors.EVENT_READ, "tty-out")
        self._selector.register(process.tty_err.master, selectors.EVENT_READ, "tty-err")
        # A command that prints nothing at first (`read`, `sleep`) must still be watched from its start:
        # `run` wakes the reader, which may be sleeping out an idle shell's half second.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")

    # -- waiting ----------------------------------------------------------------------------

    def deadlines(self) -> list[float | None]:
        return [self.lines.deadline(), *(chatter.deadline() for chatter in self.chatter.values())]

    @property
    def holding(self) -> bool:
        """Whether an `exit` echo waits to see whether the shell ends."""
        return any(chatter.holding for chatter in self.chatter.values())

    def select(self, timeout: float) -> tuple[list, bool]:
        """The channels with news within `timeout`, in the order their output was most likely written;
        and whether anything was ready at all (a wake included)."""
        events = self._selector.select(timeout)
        ready = bool(events)
        if any(key.data == "wake" for key, _ in events):
            drain(self._wake_r, 4096)
            events = [(key, mask) for key, mask in events if key.data != "wake"]
        return self._in_order(events), ready

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass  # full: the reader is woken already

    def close(self) -> None:
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def _in_order(self, events: list) -> list:
        """The ready channels in the order their output was most likely written. A pipe's output is there
        the moment it is written, so the pipes keep the order they became ready in. Two terminals are two
        queues that the kernel hands on a moment after the writes, not always in their order: stdout's
        terminal goes first, and when only stderr's has news, stdout's gets a millisecond to show what
        may have been written before it."""
        ttys = {key.data: (key, mask) for key, mask in events if key.data in TTY_CHANNELS}
        if not ttys:
            return events
        if "tty-out" not in ttys:
            for key, mask in self._selector.select(STDOUT_GRACE_SECONDS):
                if key.data == "tty-out":
                    ttys["tty-out"] = (key, mask)
        pipes = [(key, mask) for key, mask in events if key.data not in TTY_CHANNELS]
        return pipes + [ttys[channel] for channel in TTY_CHANNELS if channel in ttys]

    # -- reading ----------------------------------------------------------------------------

    def take_terminals(self, now: float) -> None:
        """Read both terminals now: a read of a terminal's end makes it hand over what it holds at once
        (a terminal hands output on from a kernel worker), where a poll would not."""
        self.take([(self._selector.get_key(tty.master), 0) for tty in self._process.terminals], now)

    def take(self, events: list, now: float) -> int:
        """Read the ready channels and hand on what they hold; returns how many pipes reached their end."""
        ended = 0
        for key, _ in events:
            channel = key.data
            stream = STREAM_OF[channel]
            try:
                data = os.read(key.fd, 65536)
                if channel in TTY_CHANNELS and len(data) >= _TTY_CHUNK:
                    data += drain(key.fd, 65536 - len(data))  # a flood: take what is there together
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:  # a terminal whose other end is closed
                if channel in TTY_CHANNELS:
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
                self.shell_exited()  # its pipes end with it
                self.flush_lines(now)
                self._deliver(stream, "data", b"", now, final=True)
                continue
            for kind, payload in self._scanners[channel].feed(data):
                if kind == "data":
                    self._pass_on(channel, stream, payload, now)
                else:
                    self._flush_display(channel, stream, now)  # a display line cut short is output
                    self._on_marker(stream, payload, now)
            if channel in TTY_CHANNELS and self.lines.waiting_for not in (None, stream):
                self.finish_line(now)
        return ended

    def expect_echo(self, reading: int, data: bytes) -> None:
        """`data` is typed into terminal `reading` (0, 1): its echo is not the program's output."""
        self._echo[TTY_CHANNELS[reading]].expect(data)

    def finish_line(self, now: float) -> None:
        """Output now waits for the rest of a line on the other terminal, which may already be written
        and only not handed on yet (a terminal hands output on from a kernel worker, which a busy
        machine runs late): a read of that terminal's end makes it hand over what it holds at once."""
        channel = TTY_CHANNELS[("stdout", "stderr").index(self.lines.waiting_for or "stdout")]
        terminal = self._process.terminals[TTY_CHANNELS.index(channel)]
        self.take([(self._selector.get_key(terminal.master), 0)], now)

    def _pass_on(self, channel: str, stream: str, data: bytes, now: float) -> None:
        """Output between markers: stdout's `owdisplay` lines go their own way (a `display` item)."""
        displays = self._displays.get(channel)
        if displays is None:
            self._on_data(channel, stream, data, now)
            return
        for kind, payload in displays.feed(data):
            if kind == "data":
                self._on_data(channel, stream, payload, now)
            else:
                self._to_lines(stream, [*self.chatter[channel].fresh_line(), ("display", payload)], now)

    def _flush_display(self, channel: str, stream: str, now: float) -> None:
        displays = self._displays.get(channel)
        held = displays.flush() if displays is not None else b""
        if held:
            self._on_data(channel, stream, held, now)

    def _on_data(self, channel: str, stream: str, raw: bytes, now: float) -> None:
        """A channel's output: bash's own lines told apart (on the channel its stderr goes to), then
        into whole lines."""
        running = self._running_notices()
        if running is not None:
            self._notice_channel = running
        pieces = self.chatter[channel].feed(raw, now, active=channel == self._notice_channel)
        self._to_lines(stream, pieces, now)

    def _to_lines(self, stream: str, pieces: list[tuple[str, bytes]], now: float) -> None:
        for kind, data in pieces:
            for item in self.lines.add(stream, kind, data, now):
                self._deliver(*item, now)

    # -- letting out ------------------------------------------------------------------------

    def flush_lines(self, now: float) -> None:
        """Let out all that waits (the command ended, or waits for input): an `exit` echo held so far
        was a program's, since the shell still runs."""
        for channel, chatter in self.chatter.items():
            self._to_lines(STREAM_OF[channel], chatter.release(), now)
        for item in self.lines.flush():
            self._deliver(*item, now)

    def fresh_line(self) -> None:
        """A command's output is all in and let out: bash's next line starts afresh on every channel."""
        for chatter in self.chatter.values():
            chatter.fresh_line()  # nothing is held after `flush_lines`

    def shell_exited(self) -> None:
        for chatter in self.chatter.values():
            chatter.shell_exited()

    def due(self, now: float) -> None:
        """What has waited long enough: the other stream's output for a line that does not end, an
        `exit` echo after which the shell did not end (or the end of the shell, which makes it bash's)."""
        if self.holding and self._process.proc.poll() is not None:
            self.shell_exited()
        for channel, chatter in self.chatter.items():
            self._to_lines(STREAM_OF[channel], chatter.due(now), now)
        for item in self.lines.due(now):
            self._deliver(*item, now)
