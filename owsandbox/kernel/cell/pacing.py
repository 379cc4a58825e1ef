"""Output floods stay within what a Jupyter server lets through: past a rate, a live tail instead.

A Jupyter server counts the bytes of the `stream` messages it relays to a browser over a window
(`iopub_data_rate_limit`, by default 1,000,000 bytes a second over `rate_limit_window`, 3 s) and
past that drops every message until the rate falls, with a warning in place of the output:
`seq 1 1000000` stopped at about 320,000 in a default JupyterLab, and the kernel's own note about
where the whole output is never arrived. So the kernel paces its streams below that rate
(`StreamPacer`, a token bucket: at most `burst` bytes at once and `rate` a second after that, so no
3-second window holds more than `burst + 3 * rate`). A stream that finds no room is not sent: its text
goes into the cell's `FloodTail`, shown as one display updated in place (the last lines and the count
so far; display messages are not counted by the server's byte limit, and are sent at most a few
times a second, far below its message limit). At the cell's end the tail shows its last lines and a
note says what was not shown. Pure: fed sizes, texts and times by the outbox.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping

from ...protocol.words import counted, noun
from ...settings import Settings, settings_of

DEFAULT_RATE = 500_000  # bytes a second, sustained: half of a default server's limit
DEFAULT_BURST = 1_000_000  # bytes at once: with 3 s of DEFAULT_RATE, 2.5 MB in a window of 3 s (the limit: 3 MB)
MESSAGE_OVERHEAD = 600  # bytes of a stream message besides its text (header, parent, signature), as the server counts
TAIL_LINES = 30  # lines the live tail shows
TAIL_CHARS = 4_000  # characters it keeps at most (a line longer than that shows its end)
UPDATE_SECONDS = 0.5  # the live tail is redrawn at most this often
CHUNK_CHARS = 256 * 1024  # a longer stream text is paced in pieces this long (at line ends where it can)


class StreamPacer:
    """A token bucket over the bytes of stream messages: `admit(size)` says whether one may go now."""

    def __init__(self, rate: float = DEFAULT_RATE, burst: float = DEFAULT_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0 or burst < 0:
            raise ValueError(f"an output rate and burst cannot be negative (rate {rate}, burst {burst})")
        self.rate = rate
        self.burst = burst
        self.clock = clock  # the flood tails of the same output redraw by it too
        self._clock = clock
        self._tokens = burst
        self._at = clock()

    def set_rate(self, rate: float) -> None:
        """A new rate (bytes a second; 0: not paced), its burst twice that (`%output rate`)."""
        if rate < 0:
            raise ValueError(f"an output rate cannot be negative ({rate})")
        self.rate, self.burst = rate, 2 * rate
        self._tokens = min(self._tokens, self.burst)

    @property
    def unpaced(self) -> bool:
        return self.rate == 0

    def admit(self, size: int) -> bool:
        """Whether a message of `size` bytes may go now (and if so, it is counted)."""
        if self.unpaced:
            return True
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if size > self._tokens and self._tokens < self.burst:
            return False
        self._tokens -= size  # a message larger than the burst goes when the bucket is full, into debt
        return True


def pacer_from_env(env: Settings | Mapping[str, str]) -> StreamPacer:
    """The pacer `OWSANDBOX_OUTPUT_RATE` asks for (bytes a second; 0: none), its burst twice that. `env`:
    the settings, or the variables to read them from."""
    rate = settings_of(env).output_rate
    if rate is None:
        return StreamPacer()
    pacer = StreamPacer()
    pacer.set_rate(rate)
    return pacer


def pieces(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """`text` in pieces of at most about `size` characters, cut after a line break where one is near."""
    found: list[str] = []
    while len(text) > size:
        cut = text.rfind("\n", size // 2, size) + 1 or size
        found.append(text[:cut])
        text = text[cut:]
    return [*found, text] if text else found


def message_size(text: str) -> int:
    """The bytes a server counts for a stream message carrying `text`."""
    return len(text.encode("utf-8", "replace")) + MESSAGE_OVERHEAD


class FloodTail:
    """One cell's output that came too fast to stream: its last lines and how much there was."""

    def __init__(self, display_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.display_id = display_id
        self.chars = 0
        self.lines = 0
        self._clock = clock
        self._tail: deque[str] = deque()
        self._tail_chars = 0
        self._partial = ""  # the last line, unfinished so far
        self._drawn_at: float | None = None
        self.shown = False  # its display went out once (the next frames are updates)

    def add(self, text: str) -> None:
        self.chars += len(text)
        self.lines += text.count("\n")
        parts = (self._partial + text).split("\n")
        self._partial = parts.pop()[-TAIL_CHARS:]
        for line in parts:
            self._tail.append(line[-TAIL_CHARS:])
            self._tail_chars += len(self._tail[-1]) + 1
        while self._tail and (len(self._tail) > TAIL_LINES or self._tail_chars + len(self._partial) > TAIL_CHARS):
            self._tail_chars -= len(self._tail.popleft()) + 1

    def due(self) -> bool:
        """Whether the live tail should be redrawn now (and if so, it counts as drawn)."""
        now = self._clock()
        if self._drawn_at is not None and now - self._drawn_at < UPDATE_SECONDS:
            return False
        self._drawn_at = now
        return True

    def text(self, ended: bool = False) -> str:
        lines = [*self._tail, *([self._partial] if self._partial else [])]
        state = "not shown as it came" if ended else "so far, coming faster than a notebook takes"
        head = (f"[{counted(self.chars, 'character')} ({counted(self.lines, 'line')}) {state}; the last "
                f"{counted(len(lines), 'line')}:]")
        return "\n".join([head, *lines])

    def note(self) -> str:
        return (f"[the output came faster than the notebook's server lets through, so "
                f"{counted(self.chars, 'character')} ({counted(self.lines, 'line')}) "
                f"{noun(self.chars, 'was', 'were')} not streamed: what came first is above the live tail, what came "
                "last is in it. To keep all of it, send it to a file (COMMAND > out.txt) and page it with "
                "%read out.txt]")
