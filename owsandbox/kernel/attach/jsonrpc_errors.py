"""Error answers of JSON-RPC programs as the cell's error: one class per code, named as the spec names it.

Why a class per code (as python-lsp-jsonrpc has): the cell's error name is then the code's meaning
(`MethodNotFound`, `InvalidParams`), which an unattended run, a grader or a reader sees at once, and
a test can catch one kind without parsing messages. Codes that a dialect gives a meaning of its own
(-32002 is `ServerNotInitialized` in LSP and `ResourceNotFound` in MCP) are looked up in the
dialect's table first (`dialects.py`). An MCP tool that failed answers with a result whose
`isError` is true: that is a `ToolError`, since the call itself worked but the tool did not.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import AttachError

DATA_CHARS = 500  # of an error's `data` in the message


class JsonRpcError(AttachError):
    """An error answer whose code has no name of its own here."""

    ename = "JsonRpcError"
    code: int | None = None

    def __init__(self, code: Any, message: str, data: Any = None, request: str = "") -> None:
        self.code_given, self.message, self.data, self.request = code, message, data, request
        said = f"{code} {message}".strip() if code is not None else message
        if data is not None:
            shown = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
            said += f" (data: {shown[:DATA_CHARS]}{'…' if len(shown) > DATA_CHARS else ''})"
        super().__init__(f"{said}, the answer to {request}" if request else said)


class ParseError(JsonRpcError):
    ename, code = "ParseError", -32700


class InvalidRequest(JsonRpcError):
    ename, code = "InvalidRequest", -32600


class MethodNotFound(JsonRpcError):
    ename, code = "MethodNotFound", -32601


class InvalidParams(JsonRpcError):
    ename, code = "InvalidParams", -32602


class InternalError(JsonRpcError):
    ename, code = "InternalError", -32603


class ServerError(JsonRpcError):
    """-32000 to -32099: reserved for the implementation's own errors."""

    ename = "ServerError"


class ServerNotInitialized(JsonRpcError):  # LSP
    ename, code = "ServerNotInitialized", -32002


class UnknownErrorCode(JsonRpcError):  # LSP
    ename, code = "UnknownErrorCode", -32001


class RequestCancelled(JsonRpcError):  # LSP
    ename, code = "RequestCancelled", -32800


class ContentModified(JsonRpcError):  # LSP
    ename, code = "ContentModified", -32801


class ServerCancelled(JsonRpcError):  # LSP
    ename, code = "ServerCancelled", -32802


class RequestFailed(JsonRpcError):  # LSP
    ename, code = "RequestFailed", -32803


class ResourceNotFound(JsonRpcError):  # MCP, ACP
    ename, code = "ResourceNotFound", -32002


class AuthRequired(JsonRpcError):  # ACP
    ename, code = "AuthRequired", -32000


class ToolError(JsonRpcError):
    """MCP: `tools/call` answered with `result.isError: true` (the tool failed, the call did not)."""

    ename = "ToolError"


STANDARD: dict[int, type[JsonRpcError]] = {cls.code: cls for cls in (
    ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError) if cls.code is not None}


def error_class(code: Any, dialect_codes: dict[int, type[JsonRpcError]]) -> type[JsonRpcError]:
    if isinstance(code, bool) or not isinstance(code, int):
        return JsonRpcError
    if code in dialect_codes:
        return dialect_codes[code]
    if code in STANDARD:
        return STANDARD[code]
    if -32099 <= code <= -32000:
        return ServerError
    return JsonRpcError


def from_error(error: dict[str, Any], dialect_codes: dict[int, type[JsonRpcError]], request: str) -> JsonRpcError:
    """The cell's error for a response's `error` member; `request` names what it answers."""
    code = error.get("code")
    message = error.get("message")
    return error_class(code, dialect_codes)(code, message if isinstance(message, str) else json.dumps(message),
                                            error.get("data"), request)
