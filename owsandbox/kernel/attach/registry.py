"""The programs attached in a sandbox, remembered in the sandbox: a JSON file there (its path comes
from the runner's hello) holds each session's id, name, number, dialect, command, folder, endpoint
and cursor, read and written with the runner's `fs.read`/`fs.write`. A kernel restart keeps the
sandbox, so `%attach --last` picks up where the last kernel stopped reading, with nothing lost or
repeated, and under the number the program had.

The file is the box's to write, so what it says is data, never a decision: `load` keeps only
entries whose fields have the shapes the kernel writes (bounded strings, a session id that is one
plain word, a cursor that is a number), and the kernel never connects where an entry says (its
`url` is shown in `%attach --list` and nothing more: a program of another execd is attached again
with `--url` given by the user, and every other one at the sandbox's own endpoint). A lying cursor
or name only changes what the box's own program shows.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ... import protocol as P
from ...host.api import SandboxAPI
from .asked import answers_to_save

CURSOR_TAIL_BYTES = 32  # the channel keeps this much output before a cursor (channel.CURSOR_TAIL_BYTES)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .loop import AttachLoop
    from .session import Program

SAVE_SECONDS = 1.0  # cursors are written to the sandbox at most this often while records arrive
KEEP_SESSIONS = 50  # the most recently updated entries the file keeps
TEXT_CHARS = {"name": 200, "command": 4000, "cwd": 4000, "url": 2000, "state": 2000, "dialect": 100}
MAX_CURSOR = 1 << 62
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")  # one plain word, as execd makes them


def saved_tail(entry: dict[str, Any]) -> bytes:
    """The output bytes an entry saw just before its cursor (hex in the file; b"" when absent or bad,
    and then a reattach trusts the cursor unchecked, as entries written before the tail was kept)."""
    try:
        return bytes.fromhex(entry.get("cursor_tail") or "")
    except (TypeError, ValueError):
        return b""

def checked_entry(entry: Any) -> dict[str, Any] | None:
    """An entry as the kernel writes it, or None: its session id one plain word, its texts strings
    (cut to TEXT_CHARS), its cursor, number and time numbers; whatever else it holds is dropped."""
    if not isinstance(entry, dict):
        return None
    session_id = entry.get("session_id")
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        return None
    kept: dict[str, Any] = {"session_id": session_id}
    for key, chars in TEXT_CHARS.items():
        value = entry.get(key)
        if isinstance(value, str):
            kept[key] = value[:chars]
    cursor = entry.get("cursor")
    kept["cursor"] = cursor if _whole(cursor) and 0 <= cursor <= MAX_CURSOR else 0
    tail = entry.get("cursor_tail")
    if isinstance(tail, str) and len(tail) <= 4 * CURSOR_TAIL_BYTES:
        kept["cursor_tail"] = tail
    if _whole(entry.get("number")) and 0 < entry["number"] < 1_000_000:
        kept["number"] = entry["number"]
    if isinstance(entry.get("dialect_named"), bool):
        kept["dialect_named"] = entry["dialect_named"]
    if isinstance(entry.get("updated"), (int, float)) and not isinstance(entry["updated"], bool):
        kept["updated"] = float(entry["updated"])
    answers = entry.get("answers")
    if isinstance(answers, dict) and len(answers) <= 100:
        kept["answers"] = answers  # each checked again as a file would be (asked.saved_answers)
    return kept


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class AttachRegistry:
    def __init__(self, runner_call: Callable[..., Any], path: Callable[[], str],
                 programs: Callable[[], Iterable[Program]], loop: AttachLoop) -> None:
        self._box = SandboxAPI(runner_call)
        self._path = path
        self._programs = programs  # the kernel's attached programs, whose entries a save writes
        self._loop = loop
        self._last_save = 0.0
        self._save_scheduled = False
        # One save at a time, each reading the programs when its turn comes: a scheduled save still
        # writing older cursors when a detach saves the exact ones would otherwise land last, and a
        # restart would show again what the file's older cursor says is unread.
        self._saving = threading.Lock()

    def load(self) -> list[dict[str, Any]]:
        """The entries, oldest first; none when the file is missing or not what it should be."""
        try:
            page = self._box.read({"path": self._path(), "limit_lines": 100000})
        except P.RunnerError as err:
            if err.code == P.FS_ERROR:
                return []
            raise
        try:
            sessions = json.loads(page["text"]).get("sessions", [])
        except Exception:  # noqa: BLE001 - the box wrote it: a RecursionError or a wrong shape is "no entries"
            return []
        if not isinstance(sessions, list):
            return []
        return [entry for entry in map(checked_entry, sessions[-KEEP_SESSIONS:]) if entry is not None]

    def save(self, forget: set[str] | None = None) -> None:
        """Write every attached program's entry (and drop the sessions in `forget`)."""
        with self._saving:
            self._save(forget)

    def _save(self, forget: set[str] | None) -> None:
        known = {s["session_id"]: s for s in self.load()}
        for program in self._programs():
            known[program.session_id] = {
                "session_id": program.session_id, "name": program.name, "command": program.command,
                "cwd": program.cwd, "url": program.url, "cursor": program.cursor,
                "cursor_tail": program.cursor_tail.hex(), "state": program.state,
                "number": program.number, "dialect": program.conversation.dialect.name,
                "dialect_named": program.conversation.dialect_fixed, "answers": answers_to_save(program.auto_answers),
                "updated": time.time()}
        for session_id in forget or ():
            known.pop(session_id, None)
        entries = sorted(known.values(), key=lambda s: s.get("updated", 0))[-KEEP_SESSIONS:]
        self._box.write({"path": self._path(), "make_parents": True,
                         "text": json.dumps({"sessions": entries}, indent=1) + "\n"})
        self._last_save = time.monotonic()

    def save_quietly(self) -> None:
        try:
            self.save()
        except Exception:  # noqa: BLE001 - the live view must not fail for a bookkeeping write
            log.warning("the attach registry could not be saved", exc_info=True)

    def save_soon(self) -> None:
        """Save within SAVE_SECONDS of the last save, once however many records arrive meanwhile. The
        write is a runner call that waits for its answer, so it runs on a thread, never on the loop."""
        if self._save_scheduled:
            return
        self._save_scheduled = True
        delay = max(0.0, SAVE_SECONDS - (time.monotonic() - self._last_save))

        def save() -> None:
            self._save_scheduled = False
            self.save_quietly()

        self._loop.call_later(delay, lambda: threading.Thread(target=save, daemon=True).start())
