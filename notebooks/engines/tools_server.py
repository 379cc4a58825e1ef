#!/usr/bin/env python3
"""A small MCP server: the JSON-RPC partner for `%attach` in the debugging notebook and in tests.

It speaks the Model Context Protocol as MCP servers do on stdio: JSON-RPC 2.0, one message per
line, a log on stderr. After `initialize` it offers four tools through `tools/call`:

    add {"a": 2, "b": 3}         -> "5"
    slow {"seconds": 2}          -> "slept 2 s", with notifications/progress every half second
                                    when the request has params._meta.progressToken
    divide {"a": 1, "b": 0}      -> a result with isError: true (the tool failed, the call did not)
    chatty {}                    -> "done", after printing a log line on stdout (the classic mistake)

An unknown tool is error -32602, an unknown method -32601, and notifications/cancelled stops a slow
call. `--v2` is the same server after a refactor that broke `add` (it joins the numbers as text).
"""

from __future__ import annotations

import json
import sys
import threading
import time

V2 = "--v2" in sys.argv
_write_lock = threading.Lock()
_cancelled: set[object] = set()
TOOLS = [{"name": name, "description": text, "inputSchema": {"type": "object"}} for name, text in (
    ("add", "add two numbers"), ("slow", "sleep, reporting progress"), ("divide", "divide a by b"),
    ("chatty", "log to stdout by mistake"))]


def emit(message: dict) -> None:
    with _write_lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def log(text: str) -> None:
    sys.stderr.write(f"tools-server: {text}\n")
    sys.stderr.flush()


def answer(rid: object, text: str, error: bool = False) -> None:
    emit({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}], "isError": error}})


def slow(rid: object, seconds: float, token: object) -> None:
    steps = max(int(seconds / 0.5), 1)
    for step in range(1, steps + 1):
        time.sleep(seconds / steps)
        if rid in _cancelled:
            log(f"stopped request {rid}: cancelled")
            return
        if token is not None and step < steps:
            emit({"jsonrpc": "2.0", "method": "notifications/progress",
                  "params": {"progressToken": token, "progress": step, "total": steps}})
    answer(rid, f"slept {seconds:g} s")


def call(rid: object, params: dict) -> None:
    name, args = params.get("name"), params.get("arguments") or {}
    log(f"tools/call {name} {json.dumps(args)}")
    if name == "add":
        a, b = args.get("a", 0), args.get("b", 0)
        answer(rid, f"{a}{b}" if V2 else f"{a + b}")
    elif name == "slow":
        token = (params.get("_meta") or {}).get("progressToken")
        threading.Thread(target=slow, args=(rid, float(args.get("seconds", 1)), token), daemon=True).start()
    elif name == "divide":
        if args.get("b", 0) == 0:
            answer(rid, "division by zero", error=True)
        else:
            answer(rid, f"{args.get('a', 0) / args['b']:g}")
    elif name == "chatty":
        print("tools-server: chatty was called", flush=True)  # a log line on stdout: not JSON
        answer(rid, "done")
    else:
        emit({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": f"Unknown tool: {name}"}})


def main() -> int:
    log("ready" + (" (v2)" if V2 else ""))
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, rid = message.get("method"), message.get("id")
        if method == "initialize":
            emit({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": message.get("params", {}).get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}}, "serverInfo": {"name": "tools-server", "version": "1"}}})
        elif method == "notifications/initialized":
            log("initialized")
        elif method == "notifications/cancelled":
            _cancelled.add(message.get("params", {}).get("requestId"))
        elif method == "tools/list":
            emit({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            call(rid, message.get("params") or {})
        elif rid is not None and method is not None:
            emit({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found",
                                                          "data": method}})
    log("stdin closed; bye")
    return 0


if __name__ == "__main__":
    sys.exit(main())
