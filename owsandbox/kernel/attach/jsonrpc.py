"""What a JSON-lines record is in JSON-RPC 2.0 terms, so that `%attach` can follow a conversation.

A program is taken for a JSON-RPC one by what it says, not by a flag: any record with
`"jsonrpc": "2.0"`, in either direction. Then the spec's shapes decide: a request has `method`
and `id` and is answered; a notification has `method` and no `id` and is never answered; a
response has `id` and `result` or `error` and no `method`. Records of programs that do not speak
JSON-RPC (agent engines with their own `{"id", "type"}` records) keep the older rule: a record
with an `id` waits for the first later record with that id that is not an event.

Sans-I/O: plain functions of records, so that the matching is tested without a program.
"""

from __future__ import annotations

from typing import Any

REQUEST, NOTIFICATION, RESPONSE = "request", "notification", "response"
# `type`s that mark a record of a non-JSON-RPC program as an event rather than an answer.
EVENT_TYPES = frozenset({"event", "progress", "notification", "log"})


def is_jsonrpc(record: dict[str, Any]) -> bool:
    return record.get("jsonrpc") == "2.0"


def kind_of(record: dict[str, Any]) -> str | None:
    """REQUEST, NOTIFICATION or RESPONSE for a JSON-RPC 2.0 record; None for anything else (another
    protocol's record, or a JSON-RPC record of no valid shape, which is shown but matches nothing)."""
    if not is_jsonrpc(record):
        return None
    if isinstance(record.get("method"), str):
        return REQUEST if "id" in record else NOTIFICATION
    if "id" in record and ("result" in record or "error" in record):
        return RESPONSE
    return None


def waits_for_answer(record: dict[str, Any]) -> bool:
    """Whether sending `record` waits for an answer: a JSON-RPC request does, a notification or a
    response (the answer to the program's own request) does not; other records do when they have an id."""
    if is_jsonrpc(record):
        return kind_of(record) == REQUEST
    return "id" in record


def answers(record: dict[str, Any], request: dict[str, Any]) -> bool:
    """Whether a received `record` answers the sent `request`."""
    if is_jsonrpc(request):
        return kind_of(record) == RESPONSE and _same_id(record.get("id"), request.get("id"))
    return (_same_id(record.get("id"), request.get("id")) and "method" not in record
            and record.get("type") not in EVENT_TYPES)


def _same_id(a: Any, b: Any) -> bool:
    return id_key(a) == id_key(b)


def id_key(value: Any) -> tuple[str, Any]:
    """A dict key for an id that keeps 1, "1" and true apart (Python's == and hash do not)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    return ("other", repr(value))


def error_of(record: dict[str, Any]) -> dict[str, Any] | None:
    """A JSON-RPC response's `error` member when it is one (an object), else None."""
    error = record.get("error") if kind_of(record) == RESPONSE else None
    return error if isinstance(error, dict) else ({"code": None, "message": str(error)} if error is not None
                                                  else None)
