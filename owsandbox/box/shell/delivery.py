"""Where a shell's output goes, once it is in its final order: the running command's record and live
view, or, while no command runs, kept for the next one.

What background jobs print while no command runs carries over, as in a terminal: the latest
BETWEEN_LIMIT bytes are kept and put first in the next command's output, and what was dropped to
keep them is said in a note (nothing is thrown away unsaid).
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ...protocol.methods import SHELL_OUTPUT, SHELL_PROGRESS
from ...protocol.words import noun
from .capture import StreamDecoder
from .command import Command

PROMPT_CHARS = 1000  # of the unfinished last line, kept as the prompt of a read
PROGRESS_SECONDS = 5.0  # a command silent this long sends `shell.progress`
BETWEEN_LIMIT = 64 * 1024  # bytes printed between commands kept for the next one (the latest)
_TTY_NOISE = re.compile(rb"bash: \[\d+: \d+ \(\d+\)\] tcsetattr: Inappropriate ioctl for device\n")


class Delivery:
    """Hands each output item to `current()` (the command in flight, or None)."""

    def __init__(self, current: Callable[[], Command | None]) -> None:
        self._current = current
        self._decoders = {"stdout": StreamDecoder(), "stderr": StreamDecoder()}
        # Output with no command to go to, for the next one; touched only by the reader thread.
        self._between: deque[tuple[str, bytes, str]] = deque()
        self._between_bytes = 0
        self._between_dropped = 0

    def deliver(self, stream: str, kind: str, raw: bytes, now: float, final: bool = False) -> None:
        """Output in its final order, to the command's record and live view (or kept for the next)."""
        if kind == "display":
            self._on_display(raw, now)
        elif kind == "note":
            text = raw.decode("utf-8", "replace")
            cmd = self._current()
            if cmd is None:
                self._keep_between("note", raw, text)
            else:
                self.hand_over_between(cmd, now)
                self._add(cmd, "note", raw, text, now)
        else:
            self._on_output(stream, raw, now, final)

    def _on_display(self, payload: bytes, now: float) -> None:
        """An `owdisplay` request (`mime TAB id TAB path`): a `display` record of its own, in order with
        the output around it, so a client shows the file there and never parses the program's stdout."""
        text = payload.decode("utf-8", "replace").removesuffix("\r") + "\n"
        cmd = self._current()
        if cmd is None:
            self._keep_between("display", payload, text)
            return
        self.hand_over_between(cmd, now)
        self._add(cmd, "display", payload, text, now)

    def _on_output(self, stream: str, raw: bytes, now: float, final: bool = False) -> None:
        if stream == "stderr" and b"tcsetattr" in raw:
            # An interactive bash with no terminal complains when a job it waited for was killed.
            raw = _TTY_NOISE.sub(b"", raw)
        text = self._decoders[stream].decode(raw, final)
        if not raw:
            return
        cmd = self._current()
        if cmd is None:
            self._keep_between(stream, raw, text)
            return
        self.hand_over_between(cmd, now)
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
            self.send_live(cmd, cmd.batcher.add(stream, text, now))

    def note(self, cmd: Command, text: str, now: float) -> None:
        """A line of the runner's own in the command's output, on the `note` stream: clients show it
        as theirs (not as the program's stderr), and it is no part of a prompt."""
        cmd.record.add("note", text.encode(), text)
        if cmd.on_live is not None:
            self.send_live(cmd, cmd.batcher.add("note", text, now))

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

    def hand_over_between(self, cmd: Command, now: float) -> None:
        """Put the output kept from between commands at the start of `cmd`'s output."""
        if not self._between and not self._between_dropped:
            return
        if self._between_dropped:
            dropped = self._between_dropped
            self.note(cmd, f"[{dropped} earlier {noun(dropped, 'byte')} printed by background jobs between "
                           f"commands {noun(dropped, 'was', 'were')} dropped; the latest follow]\n", now)
        for stream, raw, text in self._between:
            self._add(cmd, stream, raw, text, now)
        self._between.clear()
        self._between_bytes = self._between_dropped = 0

    def send_live(self, cmd: Command, frames: list[dict[str, Any]]) -> None:
        if frames:
            cmd.last_news = time.monotonic()
        for frame in frames:
            cmd.frames_sent += 1
            frame["seq"] = cmd.frames_sent
            assert cmd.on_live is not None
            cmd.on_live(SHELL_OUTPUT, frame)

    @staticmethod
    def maybe_progress(cmd: Command) -> None:
        """A command that has printed nothing for a while still says it is alive (`shell.progress`)."""
        now = time.monotonic()
        if now - cmd.last_news < PROGRESS_SECONDS:
            return
        cmd.last_news = now
        assert cmd.on_live is not None
        cmd.on_live(SHELL_PROGRESS, {"elapsed_s": round(now - cmd.started, 3), "output_bytes": cmd.record.output_bytes})
