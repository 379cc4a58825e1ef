"""What a session has learnt about its program's vocabulary: the methods said both ways and, for MCP,
the tools `tools/list` answered with their `inputSchema`s.

Why: a `tools/call` is checked against its tool's schema before it is sent (json_schema.py), so a
missing required field or a number given as a string is the notebook's clear error, naming the
field, rather than the server's; and Tab inside a `%send` line completes method and tool names from
here (send_completion.py). Only what the program itself said counts: nothing is fetched.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import AttachError
from . import jsonrpc as R
from .json_schema import problems

KEEP_METHODS = 500


class InvalidArguments(AttachError):
    """A tools/call whose arguments do not fit the tool's inputSchema; nothing was sent."""

    ename = "InvalidArguments"


class Vocabulary:
    def __init__(self) -> None:
        self.methods: dict[str, None] = {}  # in the order first said
        self.tools: dict[str, dict[str, Any]] = {}  # name → the tool as tools/list gave it

    def said(self, record: dict[str, Any]) -> None:
        method = record.get("method")
        if R.is_jsonrpc(record) and isinstance(method, str) and method not in self.methods \
                and len(self.methods) < KEEP_METHODS:
            self.methods[method] = None

    def listed(self, call_method: str, answer: dict[str, Any]) -> None:
        """An answer to `tools/list`: its tools (a later page adds to the earlier ones)."""
        if call_method != "tools/list":
            return
        result = answer.get("result")
        tools = result.get("tools") if isinstance(result, dict) else None
        for tool in tools if isinstance(tools, list) else []:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                self.tools[tool["name"]] = tool

    def check(self, record: dict[str, Any]) -> None:
        """Raise InvalidArguments when `record` is a tools/call that the tools listed so far refuse:
        an unknown tool, or arguments that do not fit its inputSchema. Nothing is checked before a
        tools/list answer came."""
        if not self.tools or R.kind_of(record) != R.REQUEST or record.get("method") != "tools/call":
            return
        params = record.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("name"), str):
            raise InvalidArguments('a tools/call needs "params": {"name": TOOL, "arguments": {...}}; nothing was sent')
        name = params["name"]
        tool = self.tools.get(name)
        if tool is None:
            raise InvalidArguments(f"no tool {json.dumps(name)} in the program's tools/list (it has: "
                                   f"{', '.join(sorted(self.tools))}); nothing was sent (%send --no-check sends it "
                                   "anyway)")
        arguments = params.get("arguments", {})
        found = problems(tool.get("inputSchema"), arguments)
        if found:
            raise InvalidArguments(f"the arguments of tools/call {json.dumps(name)} do not fit its inputSchema: "
                                   f"{'; '.join(found)}; nothing was sent (%send --no-check sends it anyway)")
