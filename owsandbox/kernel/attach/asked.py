"""Requests FROM the program (a server asking its client): the `%send` line that answers one, and
`%attach --answer METHOD=FILE.json`, which answers every request of METHOD by itself.

Why: MCP servers ask their client things mid-call (`roots/list`, `sampling/createMessage`,
`elicitation/create`), ACP agents ask for permission (`session/request_permission`) and files
(`fs/read_text_file`). The program then waits, usually while the notebook waits for the call that
made it ask, so the view shows the exact line that answers (valid JSON, with the request's id and a
result of the shape its method expects, to edit and run), and `--answer` answers from a file on
the attach loop itself, so that it goes out even while a `%send` waits. Pure: records in, records out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

# A result of the right shape for the requests clients are asked most, to edit before sending.
_TEMPLATES: dict[str, Any] = {
    "roots/list": {"roots": [{"uri": "file:///workspace", "name": "workspace"}]},
    "sampling/createMessage": {"role": "assistant", "content": {"type": "text", "text": "..."},
                               "model": "notebook", "stopReason": "endTurn"},
    "elicitation/create": {"action": "accept", "content": {}},
    "ping": {},
    "fs/read_text_file": {"content": "..."},
    "fs/write_text_file": None,
    "workspace/configuration": [],
}


def template_result(request: dict[str, Any]) -> Any:
    """A result of the shape `request`'s method expects (ACP's permission: its first option chosen)."""
    method = request.get("method")
    if method == "session/request_permission":
        params = request.get("params") if isinstance(request.get("params"), dict) else {}
        options = params.get("options") if isinstance(params.get("options"), list) else []
        first = next((o.get("optionId") for o in options if isinstance(o, dict) and o.get("optionId")), "allow")
        return {"outcome": {"outcome": "selected", "optionId": first}}
    if method == "workspace/configuration":
        params = request.get("params") if isinstance(request.get("params"), dict) else {}
        items = params.get("items") if isinstance(params.get("items"), list) else []
        return [None for _ in items]
    return _TEMPLATES.get(method if isinstance(method, str) else "", {})


def answer_line(request: dict[str, Any], number: int) -> str:
    """The `%send` line that answers `request` of program #`number`: run as is, or edit its result."""
    answer = {"jsonrpc": "2.0", "id": request.get("id"), "result": template_result(request)}
    return f"%send {number} {json.dumps(answer, ensure_ascii=False)}"


@dataclass(frozen=True)
class AutoAnswer:
    method: str
    path: str  # the file it came from, as given
    answer: dict[str, Any]  # {"result": ...} or {"error": {...}}

    def to(self, request: dict[str, Any]) -> dict[str, Any]:
        """The response to `request`: this answer under the request's id."""
        return {"jsonrpc": "2.0", "id": request.get("id"), **self.answer}


def parse_option(text: str) -> tuple[str, str]:
    """`METHOD=FILE.json` as `--answer` takes it."""
    method, sep, path = text.partition("=")
    if not sep or not method.strip() or not path.strip():
        raise UsageError(f"--answer takes METHOD=FILE.json (as in roots/list=roots.json), not {text!r}")
    return method.strip(), path.strip()


def auto_answer(method: str, path: str, text: str) -> AutoAnswer:
    """The answer in a file: a JSON object with `result` (any JSON) or `error` (an object with an integer
    `code` and a `message`), optionally with `jsonrpc` and `id`, which the request's replace."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"--answer {method}={path}: the file is not JSON: {exc}") from None
    if not isinstance(value, dict) or ("result" in value) == ("error" in value):
        raise UsageError(f"--answer {method}={path}: the file must hold one JSON object with either \"result\" "
                         "or \"error\" (the id is taken from each request), as in "
                         '{"result": {"roots": []}}')
    extra = sorted(set(value) - {"result", "error", "jsonrpc", "id"})
    if extra:
        raise UsageError(f"--answer {method}={path}: unknown members {', '.join(extra)}; a response has "
                         "\"result\" or \"error\"")
    if "error" in value:
        error = value["error"]
        code = error.get("code") if isinstance(error, dict) else None
        if not isinstance(code, int) or isinstance(code, bool) or not isinstance(error.get("message"), str):
            raise UsageError(f"--answer {method}={path}: \"error\" must be an object with an integer \"code\" and "
                             "a string \"message\"")
        return AutoAnswer(method, path, {"error": error})
    return AutoAnswer(method, path, {"result": value["result"]})


def saved_answers(entry: dict[str, Any]) -> dict[str, AutoAnswer]:
    """The `--answer`s an attach registry entry kept (`Program.auto_answers`, saved as {method: {path,
    answer}}), each checked again as a file would be; what does not pass is dropped (the entry is in
    the sandbox, which may have changed it)."""
    kept = entry.get("answers")
    found: dict[str, AutoAnswer] = {}
    for method, saved in (kept.items() if isinstance(kept, dict) else ()):
        if not isinstance(saved, dict) or not isinstance(saved.get("path"), str):
            continue
        try:
            found[method] = auto_answer(method, saved["path"], json.dumps(saved.get("answer")))
        except (UsageError, ValueError, TypeError, RecursionError):
            continue
    return found


def answers_to_save(answers: dict[str, AutoAnswer]) -> dict[str, dict[str, Any]]:
    """What `saved_answers` reads back."""
    return {method: {"path": auto.path, "answer": auto.answer} for method, auto in answers.items()}

