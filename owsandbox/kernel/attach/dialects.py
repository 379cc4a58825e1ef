"""The JSON-RPC dialects `%attach` knows: how each cancels a request, reports progress and fails a tool.

JSON-RPC itself has no cancel and no progress, so Stop and `--timeout` need the dialect: MCP
(`notifications/cancelled` with the `requestId`; `notifications/progress` with the request's
`params._meta.progressToken`; a failed tool is `result.isError: true`), LSP over JSON lines
(`$/cancelRequest` with the `id`; `$/progress` with the request's `workDoneToken` or
`partialResultToken`) and ACP, the Agent Client Protocol (`session/cancel` with the prompt's
`sessionId`; `session/update` notifications of that session are its progress). A program's
dialect is named with `%attach --dialect`, or guessed from the first record that tells
(`guess`): an `initialize` request's parameters, else a method's family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import jsonrpc_errors as E
from .jsonrpc import NOTIFICATION, REQUEST, kind_of


def _params(record: dict[str, Any]) -> dict[str, Any]:
    params = record.get("params")
    return params if isinstance(params, dict) else {}


def _hashable(value: Any) -> Any:
    return value if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Dialect:
    name: str  # as `--dialect` takes it
    title: str  # as the view says it
    # the notification that cancels a sent request, or None when the dialect has none
    cancel: Callable[[dict[str, Any], str], dict[str, Any] | None] = lambda _request, _reason: None
    # the keys under which progress for a request comes, and the key a progress notification carries
    progress_keys: Callable[[dict[str, Any]], set[Any]] = lambda _request: set()
    progress_key: Callable[[dict[str, Any]], Any] = lambda _notification: None
    # why a successful response is still a failure (MCP's isError), or None
    tool_error: Callable[[dict[str, Any]], str | None] = lambda _response: None
    codes: dict[int, type[E.JsonRpcError]] = field(default_factory=dict)
    methods: tuple[str, ...] = ()  # what a client usually sends, for Tab in a %send line


def _mcp_cancel(request: dict[str, Any], reason: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": request.get("id"), "reason": reason}}


def _mcp_progress_keys(request: dict[str, Any]) -> set[Any]:
    meta = _params(request).get("_meta")
    token = _hashable(meta.get("progressToken")) if isinstance(meta, dict) else None
    return {token} if token is not None else set()


def _mcp_progress_key(notification: dict[str, Any]) -> Any:
    if notification.get("method") != "notifications/progress":
        return None
    return _hashable(_params(notification).get("progressToken"))


def _mcp_tool_error(response: dict[str, Any]) -> str | None:
    result = response.get("result")
    if not isinstance(result, dict) or result.get("isError") is not True:
        return None
    texts = [item.get("text") for item in result.get("content") or [] if isinstance(item, dict)
             and isinstance(item.get("text"), str)]
    return "; ".join(texts) or "the tool failed (isError: true, no text content)"


def _lsp_cancel(request: dict[str, Any], _reason: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": request.get("id")}}


def _lsp_progress_keys(request: dict[str, Any]) -> set[Any]:
    params = _params(request)
    return {key for key in (_hashable(params.get("workDoneToken")), _hashable(params.get("partialResultToken")))
            if key is not None}


def _lsp_progress_key(notification: dict[str, Any]) -> Any:
    return _hashable(_params(notification).get("token")) if notification.get("method") == "$/progress" else None


def _acp_cancel(request: dict[str, Any], _reason: str) -> dict[str, Any] | None:
    session = _params(request).get("sessionId")
    if request.get("method") != "session/prompt" or session is None:
        return None  # ACP cancels a prompt turn, by its session; nothing else
    return {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}


def _acp_progress_keys(request: dict[str, Any]) -> set[Any]:
    session = _hashable(_params(request).get("sessionId"))
    return {session} if request.get("method") == "session/prompt" and session is not None else set()


def _acp_progress_key(notification: dict[str, Any]) -> Any:
    return _hashable(_params(notification).get("sessionId")) if notification.get("method") == "session/update" \
        else None


PLAIN = Dialect("jsonrpc", "JSON-RPC 2.0")
MCP = Dialect("mcp", "MCP", _mcp_cancel, _mcp_progress_keys, _mcp_progress_key, _mcp_tool_error,
              {-32002: E.ResourceNotFound},
              ("initialize", "notifications/initialized", "ping", "tools/list", "tools/call", "resources/list",
               "resources/read", "resources/templates/list", "prompts/list", "prompts/get", "completion/complete",
               "logging/setLevel", "notifications/cancelled", "notifications/roots/list_changed"))
LSP = Dialect("lsp", "LSP", _lsp_cancel, _lsp_progress_keys, _lsp_progress_key, codes={
    -32002: E.ServerNotInitialized, -32001: E.UnknownErrorCode, -32800: E.RequestCancelled,
    -32801: E.ContentModified, -32802: E.ServerCancelled, -32803: E.RequestFailed})
ACP = Dialect("acp", "ACP", _acp_cancel, _acp_progress_keys, _acp_progress_key,
              codes={-32000: E.AuthRequired, -32002: E.ResourceNotFound},
              methods=("initialize", "authenticate", "session/new", "session/load", "session/prompt",
                       "session/cancel", "session/set_mode"))
DIALECTS = {d.name: d for d in (PLAIN, MCP, LSP, ACP)}

_FAMILIES = (("notifications/", MCP), ("tools/", MCP), ("resources/", MCP), ("prompts/", MCP),
             ("sampling/", MCP), ("elicitation/", MCP), ("completion/", MCP), ("roots/", MCP),
             ("textDocument/", LSP), ("workspace/", LSP), ("window/", LSP), ("$/", LSP), ("client/", LSP),
             ("session/", ACP), ("fs/", ACP), ("terminal/", ACP))


def guess(record: dict[str, Any]) -> Dialect | None:
    """The dialect a record shows, if it shows one: `initialize`'s parameters (MCP's protocolVersion
    is a date string, ACP's a number; LSP sends processId and rootUri), else its method's family."""
    if kind_of(record) not in (REQUEST, NOTIFICATION):
        return None
    method = record["method"]
    if method == "initialize":
        params = _params(record)
        version = params.get("protocolVersion")
        if isinstance(version, str):
            return MCP
        if isinstance(version, int) and not isinstance(version, bool):
            return ACP
        if any(key in params for key in ("processId", "rootUri", "rootPath", "workspaceFolders")):
            return LSP
        return None
    for prefix, dialect in _FAMILIES:
        if method.startswith(prefix):
            return dialect
    return None
