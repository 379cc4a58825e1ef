#!/usr/bin/env python3
"""A small JSON-lines engine: the partner for `%attach` in tests and in the debugging notebook.

It speaks like the agent engines and language servers people debug: one JSON object per line on
stdin, one per line on stdout, a log on stderr. Requests carry an `id`; the answer to a request is
a record `{"id": ..., "type": "response", ...}`, and some requests stream `event` records first.

    {"id": 1, "type": "echo", "text": "hi"}     -> {"id": 1, "type": "response", "ok": true, "text": "hi"}
    {"id": 2, "type": "count", "to": 3}          -> three {"type": "event", "n": k} records, then a response
    {"id": 3, "type": "fail", "why": "..."}      -> {"id": 3, "type": "response", "ok": false, "error": "..."}
    {"id": 4, "type": "sleep", "seconds": 1}     -> a response after the pause
    {"type": "exit", "code": 0}                  -> the engine exits with that code

Run with `--tick SECONDS` to also emit a `tick` event now and then (a chatty program).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

_write_lock = threading.Lock()


def emit(record: dict) -> None:
    line = json.dumps(record, ensure_ascii=False)
    with _write_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def log(text: str) -> None:
    sys.stderr.write(f"echo-engine: {text}\n")
    sys.stderr.flush()


def handle(request: dict) -> int | None:
    """Answer one request; an int means exit with that code."""
    kind = request.get("type")
    rid = request.get("id")
    log(f"handling {kind} {rid if rid is not None else ''}".rstrip())
    if kind == "echo":
        emit({"id": rid, "type": "response", "ok": True, "text": request.get("text", "")})
    elif kind == "count":
        to = int(request.get("to", 3))
        for n in range(1, to + 1):
            emit({"type": "event", "id": rid, "n": n, "of": to})
        emit({"id": rid, "type": "response", "ok": True, "counted": to})
    elif kind == "sleep":
        time.sleep(float(request.get("seconds", 1)))
        emit({"id": rid, "type": "response", "ok": True, "slept": request.get("seconds", 1)})
    elif kind == "fail":
        log(f"failing on purpose: {request.get('why', 'no reason')}")
        emit({"id": rid, "type": "response", "ok": False, "error": request.get("why", "failed on purpose")})
    elif kind == "exit":
        code = int(request.get("code", 0))
        log(f"exiting with {code}")
        return code
    else:
        emit({"id": rid, "type": "response", "ok": False, "error": f"unknown request type {kind!r}"})
    return None


def ticker(seconds: float) -> None:
    n = 0
    while True:
        time.sleep(seconds)
        n += 1
        emit({"type": "tick", "n": n})


def main() -> int:
    parser = argparse.ArgumentParser(description="A JSON-lines echo engine.")
    parser.add_argument("--tick", type=float, default=0, help="emit a tick event every this many seconds")
    args = parser.parse_args()
    if args.tick > 0:
        threading.Thread(target=ticker, args=(args.tick,), daemon=True).start()
    emit({"type": "ready", "engine": "echo", "version": 1})
    log("ready")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            emit({"type": "error", "error": f"not JSON: {exc}"})
            continue
        if not isinstance(request, dict):
            emit({"type": "error", "error": "a request must be a JSON object"})
            continue
        code = handle(request)
        if code is not None:
            return code
    log("stdin closed; bye")
    return 0


if __name__ == "__main__":
    sys.exit(main())
