"""Saved conversations and their replay's verdict: `%records --save FILE.jsonl` and `%replay FILE.jsonl`.

Why: a bug that shows on the fortieth call of a session is found again, and its fix checked, by
sending the same client side to a fresh program and comparing what comes back. The file is JSON
lines, so it diffs, greps and edits as text: a header line (`{"owsandbox": "conversation", ...}`
with the program's command, folder and dialect), then one line per entry in the order it happened:
`{"at": EPOCH_SECONDS, "dir": "sent" | "received" | "stderr" | "stdout", "record": {...}}` (text
instead of a record for stderr and for stdout lines that were not JSON; `offset` for what the
program wrote). A file of bare records, one a line, is a client side written by hand.

The verdict compares answers, not times: each request sent is matched with its answer in the
saved conversation and in the fresh one by its id (and, for an id used twice, by which use), the
recording times never count, and members named with `--ignore` (say a `timestamp` the program
puts in its answers) are left out at any depth. Sans-I/O: the matching is `conversation.py`'s own,
run over the saved entries.
"""

from __future__ import annotations

import difflib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from ...protocol.words import counted
from ..errors import AttachError, UsageError
from . import jsonrpc as R
from .conversation import RECEIVED, SENT, Call, Conversation
from .dialects import DIALECTS

FORMAT, VERSION = "conversation", 1
DIFF_LINES = 80  # of one answer's diff in the cell


class ReplayDiffers(AttachError):
    """The fresh program's answers are not the saved ones."""

    ename = "ReplayDiffers"


def saved_text(conversation: Conversation, program: dict[str, Any]) -> tuple[str, int]:
    """The file's text for a conversation (`program`: its name, command, folder) and its entry count."""
    entries = conversation.entries()
    header = {"owsandbox": FORMAT, "version": VERSION, **program, "dialect": conversation.dialect.name,
              "dialect_named": conversation.dialect_fixed, "jsonrpc": conversation.rpc,
              "saved_at": round(time.time(), 3), "entries": len(entries), "counts": conversation.counts}
    if conversation.made > len(entries):  # the kernel keeps a program's newest part: say what is missing
        header["dropped"] = conversation.made - len(entries)
    lines = [json.dumps(header, ensure_ascii=False)] + [json.dumps(e.export(), ensure_ascii=False) for e in entries]
    return "\n".join(lines) + "\n", len(entries)


@dataclass
class Saved:
    path: str
    header: dict[str, Any] = field(default_factory=dict)  # empty for a file of bare records
    entries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def client_side(self) -> list[dict[str, Any]]:
        """The records the client sent (those that reached the program), in order."""
        return [e["record"] for e in self.entries if e.get("dir") == SENT and not e.get("failed")]

    def dialect_name(self) -> str | None:
        """The dialect to replay with when it was named at the recording (a guess is made again)."""
        name = self.header.get("dialect")
        return name if self.header.get("dialect_named") and name in DIALECTS else None

    def conversation(self) -> Conversation:
        """An empty conversation with the recording's dialect, to match the saved entries again."""
        dialect = DIALECTS.get(self.header.get("dialect") or "")
        return Conversation(dialect if self.header.get("dialect_named") else None)

    def calls(self) -> list[Call]:
        """The saved conversation's calls that the client asked, with their answers, matched again."""
        conversation = self.conversation()
        for entry in self.entries:
            record, at = entry.get("record"), float(entry.get("at") or 0)
            if not isinstance(record, dict) or entry.get("failed"):
                continue
            if entry.get("dir") == SENT:
                conversation.sent(record, at)
            elif entry.get("dir") == RECEIVED:
                conversation.received(record, at)
        return [call for call in conversation.calls if call.asked_by == SENT]


def parse(text: str, path: str) -> Saved:
    """A saved conversation, or a file of bare records; a line that is neither is a UsageError naming it."""
    saved = Saved(path)
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise UsageError(f"{path} is empty: nothing to replay")
    values = []
    for number, line in lines:
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"{path}, line {number}, is not JSON ({exc}): {line[:80]}") from None
        if not isinstance(value, dict):
            raise UsageError(f"{path}, line {number}, is not a JSON object: {line[:80]}")
        values.append((number, value))
    first = values[0][1]
    if first.get("owsandbox") == FORMAT:
        if first.get("version") != VERSION:
            raise UsageError(f"{path} is a conversation of version {first.get('version')!r}; this kernel reads "
                             f"version {VERSION}")
        saved.header = first
        for number, value in values[1:]:
            if value.get("dir") not in (SENT, RECEIVED, "stderr", "stdout"):
                raise UsageError(f"{path}, line {number}, is not an entry of a conversation (no \"dir\"): "
                                 f"{json.dumps(value)[:80]}")
            saved.entries.append(value)
    else:
        saved.entries = [{"dir": SENT, "record": value} for _, value in values]
    if not saved.client_side:
        raise UsageError(f"{path} holds nothing the client sent: nothing to replay")
    return saved


@dataclass
class Verdict:
    same: list[Call] = field(default_factory=list)
    differ: list[tuple[Call, list[str]]] = field(default_factory=list)  # the saved call, the diff's lines

    @property
    def compared(self) -> int:
        return len(self.same) + len(self.differ)


def label(call: Call) -> str:
    return f"id {json.dumps(call.id, ensure_ascii=False)}" + (f" ({call.method})" if call.method else "")


def compare(saved: list[Call], fresh: list[Call], ignore: frozenset[str] = frozenset()) -> Verdict:
    """Each saved call's answer against the fresh call with the same id (and the same use of it)."""
    by_use: dict[tuple[tuple[str, Any], int], Call] = {}
    uses: dict[tuple[str, Any], int] = {}
    for call in fresh:
        key = R.id_key(call.id)
        uses[key] = uses.get(key, 0) + 1
        by_use[(key, uses[key])] = call
    verdict = Verdict()
    uses.clear()
    for call in saved:
        key = R.id_key(call.id)
        uses[key] = uses.get(key, 0) + 1
        now = by_use.get((key, uses[key]))
        was_text = _shown(call, ignore)
        now_text = _shown(now, ignore) if now is not None else ["(not sent in the replay)"]
        if was_text == now_text:
            verdict.same.append(call)
            continue
        diff = list(difflib.unified_diff(was_text, now_text, "saved", "now", lineterm="", n=2))
        if len(diff) > DIFF_LINES:
            diff = diff[:DIFF_LINES] + [f"… {counted(len(diff) - DIFF_LINES, 'more line')} of diff"]
        verdict.differ.append((call, diff))
    return verdict


def _shown(call: Call, ignore: frozenset[str]) -> list[str]:
    if call.answer is None or call.answer.record is None:
        return ["(no answer)"]
    return json.dumps(_without(call.answer.record, ignore), indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def _without(value: Any, ignore: frozenset[str]) -> Any:
    """`value` without the members named in `ignore`, at any depth (iterative: the box chooses the depth)."""
    if not ignore:
        return value
    root: list[Any] = [None]
    stack: list[tuple[Any, list[Any] | dict[str, Any], Any]] = [(value, root, 0)]
    while stack:
        item, parent, slot = stack.pop()
        if isinstance(item, dict):
            copy: Any = {}
            for key, child in item.items():
                if key not in ignore:
                    stack.append((child, copy, key))
        elif isinstance(item, list):
            copy = [None] * len(item)
            for index, child in enumerate(item):
                stack.append((child, copy, index))
        else:
            copy = item
        parent[slot] = copy
    return root[0]


def labels(calls: list[Call], most: int = 5) -> str:
    """Calls named one after another, the first `most` of them."""
    named = ", ".join(label(call) for call in calls[:most])
    return named + (f" and {len(calls) - most} more" if len(calls) > most else "")


def report(verdict: Verdict, saved_path: str, against: str) -> str:
    """The cell's text for a verdict: a line for the whole, then each diff once, with the answers it
    is the diff of (a change that breaks twenty answers alike is one diff, not twenty)."""
    lines = [f"replayed {counted(verdict.compared, 'request')} of {saved_path} against {against}: "
             f"{counted(len(verdict.same), 'answer')} the same, {len(verdict.differ)} different"]
    alike: dict[tuple[str, ...], list[Call]] = {}
    for call, diff in verdict.differ:
        alike.setdefault(tuple(diff[2:]), []).append(call)  # past the ---/+++ lines
    shown = {tuple(diff[2:]): diff for _, diff in verdict.differ}
    for key, calls in alike.items():
        lines.append(f"≠ {labels(calls)}" + (f" ({len(calls)} answers, this same diff)" if len(calls) > 1 else ""))
        lines += [f"  {line}" for line in shown[key]]
    if verdict.same:
        lines.append("= " + labels(verdict.same, 20))
    return "\n".join(lines) + "\n"
