"""`%record`: a session's cells as an asciicast v2 file, which asciinema and its web player replay.

A teacher wants what a student typed and saw, an agent developer a record of what ran, without
HISTFILE tricks or a screen recorder. The kernel already has every piece: the cell's code, each
output as it went out (through the outbox, which shows this module what it sent), each prompt's
answer, how the cell ended. So:

* `Transcript` (no I/O, its clock passed in) turns them into asciicast lines: a header (`version` 2,
  `width`, `height`, `timestamp`), then `[seconds, "o", text]` for what a terminal would show (the
  command lines after a `$ ` prompt, the output with line breaks as a terminal's, the kernel's notes
  dimmed, how the cell ended dimmed), `[seconds, "i", text]` for an answer typed at a prompt, and an
  `"m"` marker at each cell, for the player's chapters. A password is never written: its prompt is
  shown as a terminal shows it, with nothing after it, and no `"i"` event.
* `Recorder` writes them as they come, from any thread, into a file the host opens itself: a new
  file (never one that exists: not a link, a FIFO or another name of a file), by default in a
  folder outside the workspace (`OWSANDBOX_RECORD`, the course's setting that also turns recording
  on for every kernel, else `~/.local/share/owsandbox/recordings`), so the box cannot rewrite it
  afterwards. A file asked for inside the workspace is opened folder by folder without following a
  link, and the note says plainly that the box can change it.
* `play` replays a file in a terminal at its own pace (`owsandbox replay FILE --speed N`), its text
  through the same filter as everything the kernel shows a terminal: a recording that someone edited
  cannot set the clipboard or the window title.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ... import settings
from ...host.snapshots.hostpaths import locate
from ...settings import Settings, settings_of
from ..cell.notes import is_note
from ..cell.terminal_text import shown_text

RECORD_ENV = settings.RECORD
RECORD_LIMIT_ENV = settings.RECORD_LIMIT
DEFAULT_LIMIT = 256 << 20  # bytes of one recording; past them it stops, saying so
PROMPT = "\x1b[1;32m$\x1b[0m "
CONTINUED = "\x1b[1;32m>\x1b[0m "
DIM, RESET = "\x1b[2m", "\x1b[0m"
MAX_IDLE = 2.0  # seconds `play` waits at most between two events (asciinema's --idle-time-limit), unless asked


def terminal_lines(text: str) -> str:
    """Line breaks as a terminal shows them (`\\r\\n`), whatever the text had."""
    return text.replace("\r\n", "\n").replace("\n", "\r\n")


class Transcript:
    """Asciicast v2 lines for a session's events; `clock()` is seconds on any monotonic scale."""

    def __init__(self, width: int, height: int, clock: Callable[[], float], started_at: float,
                 title: str | None = None) -> None:
        self.width, self.height = width, height
        self._clock = clock
        self._zero = clock()
        self.started_at = started_at
        self.title = title
        self._last = 0.0

    def header(self) -> str:
        header: dict[str, Any] = {"version": 2, "width": self.width, "height": self.height,
                                  "timestamp": int(self.started_at),
                                  "env": {"SHELL": "/bin/bash", "TERM": "xterm-256color"}}
        if self.title:
            header["title"] = self.title
        return json.dumps(header, ensure_ascii=False) + "\n"

    def _event(self, code: str, data: str) -> str:
        """One event line; its text through the filter `play` uses (colours, `\\r`, `\\n`, tabs and
        `\\b` stay), so that no control the box wrote (OSC 52 clipboard, a title report, DCS) reaches a
        file that any asciicast player replays into a real terminal (a command's streams under
        `%terminal off` reach the outbox exact)."""
        at = max(self._clock() - self._zero, self._last)  # never earlier than the event before
        self._last = at
        return json.dumps([round(at, 6), code, shown_text(data)], ensure_ascii=False) + "\n"

    def cell(self, number: int | None, code: str) -> str:
        label = f"In [{number}]" if number else "cell"
        lines = code.rstrip("\n").split("\n") or [""]
        shown = PROMPT + lines[0] + "\r\n" + "".join(CONTINUED + line + "\r\n" for line in lines[1:])
        return self._event("m", label) + self._event("o", shown)

    def output(self, text: str) -> str:
        return self._event("o", terminal_lines(text)) if text else ""

    def note(self, text: str) -> str:
        text = text.strip("\n")
        return self._event("o", DIM + terminal_lines(text) + RESET + "\r\n") if text else ""

    def answered(self, prompt: str, value: str | None, password: bool) -> str:
        """A prompt and its answer, as a terminal shows them; a password's answer is neither shown nor kept."""
        lines = self._event("o", terminal_lines(prompt)) if prompt else ""
        if password or value is None:
            return lines + self._event("o", "\r\n")
        typed = value.rstrip("\n")
        return lines + self._event("i", typed + "\r") + self._event("o", terminal_lines(typed) + "\r\n")

    def ended(self, reply: dict[str, Any] | None, seconds: float) -> str:
        took = f"{seconds:.2f} s"
        if reply is None:
            return self.note(f"[✗ the cell ended without a reply · {took}]")
        if reply.get("status") == "ok":
            return self.note(f"[✓ ok · {took}]")
        ename, evalue = str(reply.get("ename", "error")), str(reply.get("evalue", ""))
        return self.note(f"[✗ {ename}: {evalue} · {took}]")


def text_of(msg_type: str, content: dict[str, Any]) -> tuple[str, bool] | None:
    """What of an outgoing message a terminal would show: (text, is it a note), or None for nothing."""
    if msg_type == "stream":
        return str(content.get("text", "")), False
    if msg_type in ("display_data", "execute_result"):
        data = content.get("data") or {}
        text = data.get("text/plain")
        if not isinstance(text, str):
            kinds = ", ".join(sorted(data)) or "nothing"
            text = f"[{kinds}]"
        if is_note(content):
            return text, True
        return text if text.endswith("\n") else text + "\n", False
    return None


# -- where a recording goes ------------------------------------------------------------------------

def default_folder(env: Mapping[str, str] | None = None, given: settings.Settings | None = None) -> Path:
    """The course's folder (OWSANDBOX_RECORD of `given`, else of `env`), else this user's data folder.
    `env`: the variables (None: this process's)."""
    env = os.environ if env is None else env
    record = settings.settings_of(env if given is None else given).record
    if record:  # `~` and `$USER` are the student's, as the kernel runs
        text = re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: env.get(m.group(1) or m.group(2), m.group(0)), record)
        return Path(os.path.expanduser(text))
    data = env.get("XDG_DATA_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "owsandbox" / "recordings"


def file_name(stem: str, at: float) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "session"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(at))}.cast"


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
def open_new(path: Path, workspace: str | None) -> tuple[int, bool]:
    """A new file at `path`, for the host to write; (its descriptor, whether it is in the workspace).
    Never an existing file (a link, a FIFO, another name of a file). In the workspace, each folder is
    opened (or made) from its parent's descriptor without following a link, so a link the box planted
    leads nowhere."""
    real, below = locate(os.path.abspath(path), workspace)
    if below is None:
        os.makedirs(os.path.dirname(real), mode=0o755, exist_ok=True)
        return os.open(real, _NEW_FILE, 0o644), False
    if not below or ".." in below:
        raise OSError(errno.EINVAL, "not a file name in the workspace")
    fd = os.open(real, _DIR)
    try:
        for part in below[:-1]:
            if part == ".":
                continue
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            child = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
        return os.open(below[-1], _NEW_FILE, 0o644, dir_fd=fd), True
    finally:
        os.close(fd)


def where(path: Path, in_workspace: bool) -> str:
    if in_workspace:
        return f"{path} (in the workspace: the box can change or delete it)"
    return f"{path} (outside the workspace: the box cannot reach it)"


# -- the recorder ---------------------------------------------------------------------------------

@dataclass
class _Cell:
    started: float
    answered_prompts: int = 0


class RecordingError(Exception):
    """A recording could not start; the message says why."""


class Recorder:
    """One kernel's recording: on or off, and the cells it is recording (several run at once on
    subshells). Thread-safe; every write goes straight to the file."""

    def __init__(self, workspace: Callable[[], str | None] = lambda: None,
                 size: Callable[[], tuple[int, int]] = lambda: (120, 50), stem: str = "session",
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 env: dict[str, str] | None = None, settings: Settings | None = None) -> None:
        """`env`: the variables (None: this process's); `settings`: the kernel's (None: read from `env`)."""
        self._workspace = workspace
        self._size = size
        self._stem = stem
        self._clock, self._wall = clock, wall
        self._env = os.environ if env is None else env
        self._settings = settings_of(self._env if settings is None else settings)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._transcript: Transcript | None = None
        self._cells: dict[str, _Cell] = {}
        self.path: Path | None = None
        self.in_workspace = False
        self.written = 0
        self.cells = 0
        self.limit = DEFAULT_LIMIT if self._settings.record_limit is None else self._settings.record_limit
        self._auto = bool(self._settings.record)  # the course's setting: on at the first cell
        self._ended: str | None = None  # why a recording ended by itself, for the next cell to say

    @property
    def on(self) -> bool:
        return self._fd is not None

    def start(self, path: str | None = None) -> str:
        """Start recording into `path` (relative to the recordings folder), or a new name there; where it goes."""
        with self._lock:
            if self._fd is not None:
                raise RecordingError(f"already recording to {self.path}: %record off first")
            folder = default_folder(self._env, self._settings)
            chosen = Path(os.path.expanduser(path)) if path else Path(file_name(self._stem, self._wall()))
            if not chosen.is_absolute():
                chosen = folder / chosen
            if chosen.suffix != ".cast":
                raise RecordingError(f"a recording is an asciicast file: name it NAME.cast, not {chosen.name}")
            workspace = self._workspace()
            workspace = os.path.realpath(workspace) if workspace else None
            try:
                fd, inside = open_new(chosen, workspace)
            except FileExistsError:
                raise RecordingError(f"{chosen} exists, and a recording never writes over a file: choose another "
                                     "name, or remove it first") from None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise RecordingError(f"a folder on the way to {chosen} is a link (or a file) in the workspace: "
                                         "nothing is written through it") from None
                raise RecordingError(f"cannot record to {chosen}: {exc.strerror or exc}") from None
            width, height = self._size()
            self._transcript = Transcript(width, height, self._clock, self._wall(), title=self._stem)
            self._fd, self.path, self.in_workspace = fd, chosen, inside
            self.written = self.cells = 0
            self._cells.clear()
            self._write(self._transcript.header())
            return where(chosen, inside)

    def stop(self, why: str = "") -> str | None:
        """Stop and close the file; where it was written, or None when nothing was recording."""
        with self._lock:
            if self._fd is None or self._transcript is None:
                return None
            if why:
                self._write(self._transcript.note(f"[{why}]"))
            os.close(self._fd)
            self._fd, self._transcript = None, None
            self._cells.clear()
            return f"{self.path} ({self.cells} cell{'' if self.cells == 1 else 's'})"

    def cell_note(self) -> str | None:
        """Called before each cell: what the notebook should be told of the recording. At the first cell
        the course's recording starts, and the note says where (or why not); at a later one, why a
        recording ended by itself (its limit, a full disk)."""
        with self._lock:
            ended, self._ended = self._ended, None
        if ended is not None or not self._auto:
            return ended
        self._auto = False
        try:
            place = self.start()
        except RecordingError as exc:
            return f"[not recording ({RECORD_ENV}): {exc}]"
        return f"[recording this session to {place}; replay it with `owsandbox replay {self.path}`]"

    # -- events -----------------------------------------------------------------------------

    def cell_started(self, parent: dict[str, Any], number: int | None, code: str) -> None:
        with self._lock:
            if self._transcript is None:
                return
            self._cells[_key(parent)] = _Cell(self._clock())
            self.cells += 1
            self._write(self._transcript.cell(number, shown_text(code)))

    def cell_ended(self, parent: dict[str, Any], reply: dict[str, Any] | None) -> None:
        with self._lock:
            cell = self._cells.pop(_key(parent), None)
            if self._transcript is None or cell is None:
                return
            self._write(self._transcript.ended(reply, self._clock() - cell.started))

    def saw(self, parent: dict[str, Any], msg_type: str, content: dict[str, Any]) -> None:
        """What the outbox sent (see outbox.py): a recorded cell's streams, displays and notes."""
        if self._fd is None:
            return
        found = text_of(msg_type, content)
        if found is None:
            return
        with self._lock:
            if self._transcript is None or _key(parent) not in self._cells:
                return
            text, note = found
            self._write(self._transcript.note(text) if note else self._transcript.output(text))

    def answered(self, parent: dict[str, Any], prompt: str, value: str | None, password: bool) -> None:
        with self._lock:
            if self._transcript is None or _key(parent) not in self._cells:
                return
            self._write(self._transcript.answered(shown_text(prompt), value, password))

    def _write(self, line: str) -> None:
        """Append one line (lock held); past the limit, one last note and the file is closed."""
        if self._fd is None or not line:
            return
        data = line.encode("utf-8", "replace")
        if self.written + len(data) > self.limit and self._transcript is not None:
            why = f"recording stopped: it reached its limit of {self.limit} bytes ({RECORD_LIMIT_ENV})"
            if self._raw(self._transcript.note(f"[{why}]").encode()):
                self._end(f"[{why}; {self.path} has what came before]")
            return
        self._raw(data)

    def _raw(self, data: bytes) -> bool:
        """Write `data` whole; False (and the recording ended, saying why) when the file refused it."""
        assert self._fd is not None
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exc:
            self._end(f"[recording stopped: {self.path} could not be written ({exc.strerror or exc}); it has what "
                      "came before]")
            return False
        self.written += len(data)
        return True

    def _end(self, why: str) -> None:
        """The recording ends by itself (lock held); the next cell says `why`."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._transcript, self._ended = None, None, why
        self._cells.clear()


def _key(parent: dict[str, Any]) -> str:
    return str((parent.get("header") or {}).get("msg_id", ""))


# -- replay -------------------------------------------------------------------------------------

class CastError(Exception):
    """A file that is not an asciicast v2 recording; the message says where."""


def read_cast(lines: Any) -> tuple[dict[str, Any], list[tuple[float, str, str]]]:
    """The header and the events of an asciicast v2 file (an iterable of its lines)."""
    iterator = iter(lines)
    try:
        header = json.loads(next(iterator))
    except (StopIteration, ValueError, RecursionError):
        raise CastError("the file does not start with an asciicast header line") from None
    if not isinstance(header, dict) or header.get("version") != 2:
        raise CastError("the file is not an asciicast version 2 recording (its header has no \"version\": 2)")
    events = []
    for number, line in enumerate(iterator, start=2):
        if not line.strip():
            continue
        try:
            at, code, data = json.loads(line)
            events.append((float(at), str(code), str(data)))
        except (ValueError, TypeError, RecursionError):
            raise CastError(f"line {number} is not an asciicast event") from None
    return header, events


def play(path: str, out: TextIO, speed: float = 1.0, idle_limit: float | None = MAX_IDLE,
         sleep: Callable[[float], None] = time.sleep) -> int:
    """Write a recording's output to `out` at its pace (divided by `speed`, pauses cut to `idle_limit`);
    the events played. Text goes through the terminal filter (colours, `\\r`, `\\n` and tabs stay)."""
    if speed <= 0:
        raise CastError(f"--speed takes a positive number, not {speed:g}")
    with open(path, encoding="utf-8", errors="replace") as handle:
        _header, events = read_cast(handle)
    last = 0.0
    played = 0
    for at, code, data in events:
        if code != "o":
            continue
        wait = max(at - last, 0.0)
        if idle_limit is not None:
            wait = min(wait, idle_limit)
        last = at
        if wait > 0:
            sleep(wait / speed)
        out.write(shown_text(data))
        out.flush()
        played += 1
    return played


def session_stem(env: dict[str, str] | None = None) -> str:
    """A recording's name from the notebook's (Jupyter's servers give kernels JPY_SESSION_NAME), else `session`."""
    name = (os.environ if env is None else env).get("JPY_SESSION_NAME", "")
    stem = os.path.splitext(os.path.basename(name))[0]
    return stem or "session"


def replay_main(argv: list[str]) -> int:
    """`owsandbox replay FILE.cast [--speed N] [--idle-limit SECONDS]`: the exit status."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="owsandbox replay", description="Play a recording (%record, asciicast "
                                     "v2) in this terminal at its pace.")
    parser.add_argument("file", metavar="FILE.cast")
    parser.add_argument("--speed", type=float, default=1.0,
                        help="how many times faster than it was recorded (2: twice as fast)")
    parser.add_argument("--idle-limit", type=float, default=MAX_IDLE, metavar="SECONDS",
                        help=f"the longest pause between two outputs (default {MAX_IDLE:g}; 0: as recorded)")
    args = parser.parse_args(argv)
    try:
        play(args.file, sys.stdout, args.speed, args.idle_limit or None)
    except (CastError, OSError) as exc:
        print(f"owsandbox replay: {args.file}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
