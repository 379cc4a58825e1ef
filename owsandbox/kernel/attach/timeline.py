"""The lines of an attached program's live view below its header: its conversation, by lane.

Why lanes: a JSON-RPC server interleaves answers, notifications and logs, and the question while
debugging is "what became of my request": so each call is one entry (its method, id, pending time
while it waits, latency once answered) with its answer under it, notifications run in a lane of
their own, stderr in another, and a stdout line that is not JSON (the classic "the server logs to
stdout and corrupts its own stream") is flagged in a third. A program that does not speak JSON-RPC
is shown as the records both ways, in order. Sent records are marked →, received ones ←.

Every line is cut to RECORD_CHARS and every lane to its last few entries, so that a frame stays
small whatever the program writes; `%records` prints everything kept, whole.
"""

from __future__ import annotations

import json
from typing import Any

from ...protocol.words import counted
from . import jsonrpc as R
from .asked import answer_line
from .conversation import ARROWS, RECEIVED, SENT, Call, Conversation, Entry, latest

RECORD_CHARS = 1000  # of one line of the view (%records prints it whole)
SHOW_RECORDS = 20  # records of a program that is not JSON-RPC
SHOW_CALLS = 15
SHOW_NOTIFICATIONS = 6
SHOW_STDERR = 5
SHOW_NOT_JSON = 3
PARAMS_CHARS = 160  # of a request's params on its line (its answer is shown whole, up to RECORD_CHARS)
NOT_JSON_SAID = "not JSON: the program wrote a log line to stdout"


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def shortened(line: str, number: int) -> str:
    """A line cut to RECORD_CHARS: the view is a window on the latest news, kept small so that its
    frames fit the cell's output limit however long the program's records are."""
    if len(line) <= RECORD_CHARS:
        return line
    return f"{line[:RECORD_CHARS]}… ({len(line)} characters; %records {number} prints it whole)"


def timeline(conversation: Conversation, number: int, now: float) -> list[str]:
    """The view's lines under its header; `now` is time.time(), for the pending calls' timers."""
    lines = _rpc(conversation, number, now) if conversation.rpc else _plain(conversation, number, now)
    stderr, earlier = latest(conversation.stderr_lines, SHOW_STDERR)
    partial = conversation.stderr_partial
    if stderr or partial:
        lines.append("stderr" + (f" (… {counted(earlier, 'earlier line')}: %records {number} --stderr)"
                                 if earlier else ""))
        lines += [f"  {entry.text}" for entry in stderr] + ([f"  {partial}"] if partial else [])
    flagged, earlier = latest(conversation.not_json, SHOW_NOT_JSON)
    if flagged:
        lines.append("stdout lines that are not JSON" + (f" (… {earlier} earlier)" if earlier else ""))
        lines += [f"  ! {entry.text}  ({NOT_JSON_SAID})" for entry in flagged]
    return [shortened(line, number) for line in lines]


def _plain(conversation: Conversation, number: int, now: float) -> list[str]:
    recent, earlier = latest(conversation.records, SHOW_RECORDS)
    lines = [f"… {counted(earlier, 'earlier record')} (%records {number})"] if earlier else []
    for entry in recent:
        said = ""
        call = entry.call
        if entry.direction == SENT and call is not None and call.request is entry:
            said = _state(call, now, number)
        lines.append(f"{ARROWS[entry.direction]} {compact(entry.record)}{said}{_failed(entry)}")
    return lines


def _rpc(conversation: Conversation, number: int, now: float) -> list[str]:
    counts = conversation.counts
    pending = len(conversation.pending_calls())
    lines = [f"{conversation.dialect.title} · {counted(counts['calls'], 'call')}"
             + (f", {pending} pending" if pending else "") + f" · {counted(counts['notifications'], 'notification')}"]
    items: list[tuple[int, Call | Entry]] = [(call.request.seq, call) for call in conversation.calls]
    items += [(entry.seq, entry) for entry in conversation.records
              if entry.kind not in (R.NOTIFICATION, R.REQUEST) and entry.call is None]  # answers to nothing known
    items.sort(key=lambda item: item[0])
    shown, earlier = latest(items, SHOW_CALLS)
    if shown:
        lines.append("calls" + (f" (… {earlier} earlier: %records {number})" if earlier else ""))
    for _, item in shown:
        if isinstance(item, Entry):
            why = "answers no request sent here" if item.kind == R.RESPONSE else "not a JSON-RPC message"
            lines.append(f"  {ARROWS[item.direction]} {compact(item.record)}  · {why}{_failed(item)}")
            continue
        request = item.request.record or {}
        params = f" {_cut(compact(request['params']), PARAMS_CHARS)}" if "params" in request else ""
        lines.append(f"  {ARROWS[item.request.direction]} {compact(item.id)} {item.method}{params}"
                     f"{_state(item, now, number)}{_failed(item.request)}")
        if item.answer is not None:
            lines.append(f"      {ARROWS[item.answer.direction]} {compact(item.answer.record)}{_failed(item.answer)}")
    notes, earlier = latest(conversation.notifications, SHOW_NOTIFICATIONS)
    if notes:
        lines.append("notifications" + (f" (… {earlier:,} earlier: %records {number} --notifications)"
                                        if earlier else ""))
        for entry in notes:
            record = entry.record or {}
            params = f" {compact(record['params'])}" if "params" in record else ""
            lines.append(f"  {ARROWS[entry.direction]} {record.get('method')}{params}{_failed(entry)}")
    return lines


def _state(call: Call, now: float, number: int) -> str:
    """What became of a call, after its request: pending for how long, answered how fast, and how."""
    if call.answer is None:
        said = f"  · pending {duration(max(now - call.request.at, 0.0))}"
        if call.asked_by == RECEIVED:  # the line that answers it, to run as is or edit first
            return f"{said}: the program waits for your answer: {answer_line(call.request.record or {}, number)}"
        if call.progress is not None:
            said += f", {_progress(call)}"
        if call.cancel is not None:
            said += f", cancelled ({(call.cancel.record or {}).get('method')})"
        return said
    latency = duration(call.latency() or 0.0)
    error = call.error()
    if error is not None:
        return f"  · error {error.get('code')} {error.get('message')} in {latency}"
    result = (call.answer.record or {}).get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        return f"  · tool error in {latency}"
    by = f" by --answer {call.answer.by}" if call.answer.by else ""
    return f"  · answered{by} in {latency}" + (" (after a cancel)" if call.cancel is not None else "")


def _progress(call: Call) -> str:
    """MCP's `progress of total`, else how many progress notifications came."""
    params = (call.progress.record or {}).get("params") if call.progress is not None else None
    step = params.get("progress") if isinstance(params, dict) else None
    if step is None or isinstance(step, (dict, list)):
        return f"{call.progress_count} progress notification{'s' if call.progress_count != 1 else ''}"
    total = params.get("total") if isinstance(params, dict) else None
    return f"progress {compact(step)}" + (f" of {compact(total)}" if total is not None else "")


def _failed(entry: Entry) -> str:
    return f"  · not sent: {entry.failed}" if entry.failed else ""


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + "…"
