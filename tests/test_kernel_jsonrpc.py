"""%attach with JSON-RPC 2.0 programs, through the real kernel: the conversation as a timeline, %send's
waits (requests only, a timeout that progress resets, error answers as the cell's error), Stop as
the dialect's cancel, a log line on stdout flagged, and a saved conversation replayed and diffed.

The partner is a small MCP-like server written here (stdlib Python, run in the box); one test uses
a real MCP server (`mcp-server-time` from the package index, in a virtual environment of its own
outside the box, tests/mcp_servers.py).
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from pathlib import Path

import pytest

from owsandbox.kernel.cell.notes import is_note

from .kernel_session import CellRun, KernelSession
from .mcp_servers import mcp_server_time as installed_mcp_server_time
from .test_kernel_attach import wait_for_display
from .waiting import patience

SERVER = r'''
import json, sys, threading, time

CHANGED = "--changed" in sys.argv  # a later version of the server: echo answers in capitals
lock = threading.Lock()
cancelled = set()
asked = {}  # the server's own requests: id -> [event, the client's answer]


def emit(record):
    with lock:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


def log(text):
    sys.stderr.write(f"rpc-server: {text}\n")
    sys.stderr.flush()


def result(rid, value):
    emit({"jsonrpc": "2.0", "id": rid, "result": value})


def text(rid, words, error=False):
    result(rid, {"content": [{"type": "text", "text": words}], "isError": error})


def slow(rid, args, token):
    seconds, every = float(args.get("seconds", 1)), float(args.get("progress_every", 0))
    started = time.monotonic()
    due, done = started + every, 0
    while (now := time.monotonic()) - started < seconds:
        if rid in cancelled:
            log(f"gave up request {rid}")
            return
        if every and token is not None and now >= due:
            done, due = done + 1, due + every
            emit({"jsonrpc": "2.0", "method": "notifications/progress",
                  "params": {"progressToken": token, "progress": done, "total": int(seconds / every)}})
        time.sleep(0.02)
    text(rid, f"slept {seconds:g} s")


def roots(rid):
    event = threading.Event()
    asked["roots-1"] = [event, None]
    emit({"jsonrpc": "2.0", "id": "roots-1", "method": "roots/list"})
    if not event.wait(30):
        text(rid, "no roots came", error=True)
        return
    found = asked.pop("roots-1")[1].get("result", {}).get("roots", [])
    text(rid, f"{len(found)} roots: " + ", ".join(r.get("uri", "") for r in found))


def call(rid, params):
    name, args = params.get("name"), params.get("arguments") or {}
    token = (params.get("_meta") or {}).get("progressToken")
    if name == "echo":
        text(rid, ("ECHO: " if CHANGED else "echo: ") + str(args.get("text", "")))
    elif name == "fail":
        text(rid, "the disk is full", error=True)
    elif name == "slow":
        threading.Thread(target=slow, args=(rid, args, token), daemon=True).start()
    elif name == "chatty":
        print("server log: handling chatty", flush=True)  # the classic mistake: a log line on stdout
        text(rid, "logged to stdout first")
    elif name == "roots":
        threading.Thread(target=roots, args=(rid,), daemon=True).start()
    else:
        emit({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": f"Unknown tool: {name}"}})


for line in sys.stdin:
    msg = json.loads(line)
    method, rid = msg.get("method"), msg.get("id")
    if method is None:  # the client's answer to one of the server's own requests
        if rid in asked:
            asked[rid][1] = msg
            asked[rid][0].set()
    elif method == "initialize":
        result(rid, {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                     "serverInfo": {"name": "test-server", "version": "1"}})
    elif method == "notifications/initialized":
        log("initialized")
    elif method == "notifications/cancelled":
        cancelled.add(msg["params"]["requestId"])
        log(f"cancelled {msg['params']['requestId']}: {msg['params'].get('reason')}")
    elif method == "tools/list":
        result(rid, {"tools": [{"name": n} for n in ("echo", "fail", "slow", "chatty", "roots")]})
    elif method == "tools/call":
        call(rid, msg.get("params") or {})
    elif rid is not None:
        emit({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found", "data": method}})
'''

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "nb", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def tool(rid: int | str, name: str, token: str | None = None, **arguments) -> str:
    params: dict = {"name": name, "arguments": arguments}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})


@pytest.fixture
def kernel(fresh_kernel: KernelSession) -> KernelSession:
    return fresh_kernel


@pytest.fixture
def server(tmp_path: Path) -> str:
    path = tmp_path / "rpc_server.py"
    path.write_text(SERVER)
    return f"{sys.executable} {path}"


def attach_and_initialize(kernel: KernelSession, command: str) -> CellRun:
    started = kernel.run(f"%attach --name rpc -- {command}")
    assert started.status == "ok", started.outputs
    answered = kernel.run(f"%send {json.dumps(INITIALIZE)}")
    assert answered.status == "ok", answered.outputs
    assert kernel.run(f"%send {json.dumps(INITIALIZED)}").status == "ok"
    return answered


def stderr_of(kernel: KernelSession, wanted: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + patience(timeout)
    while True:
        text = kernel.run("%records --stderr").text()
        if wanted in text or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def test_a_request_is_answered_and_shown_in_the_timeline_with_its_latency(kernel, server):
    started = kernel.run(f"%attach --name rpc -- {server}")
    kinds = [m["msg_type"] for m in started.outputs if not is_note(m["content"])]  # the first cell's note aside
    assert kinds[:2] == ["stream", "display_data"] and "attached to #1 rpc" in started.text()  # the line first
    answered = kernel.run(f"%send {json.dumps(INITIALIZE)}")
    [shown] = answered.of_type("display_data")
    answer = shown["data"]["application/json"]
    assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "test-server"
    assert shown["metadata"] == {"application/json": {"expanded": True}}  # JupyterLab opens its tree
    assert shown["data"]["text/plain"] == json.dumps(answer, indent=2)  # indented, not one long line
    said = kernel.run(f"%send {json.dumps(INITIALIZED)}")
    assert said.status == "ok" and not said.of_type("display_data")
    assert "sent the notification notifications/initialized to #1 rpc" in said.text()
    view = wait_for_display(kernel, r"notifications/initialized")
    header, summary, *lines = view.splitlines()
    assert header.startswith("#1 rpc [attached] session ") and summary.startswith("MCP · 1 call ")
    entry = next(i for i, line in enumerate(lines) if line.startswith("  → 1 initialize "))
    latency = re.search(r"· answered in (\d+) ms$", lines[entry])
    assert latency and int(latency.group(1)) < 5000, lines[entry]
    assert lines[entry + 1].startswith('      ← {"jsonrpc": "2.0", "id": 1, "result": ')  # the answer under it
    assert "notifications" in lines and "  → notifications/initialized" in lines
    assert "stderr" in lines and "  rpc-server: initialized" in lines  # the program's stderr, in its own lane
    by_id = kernel.run("%records --id 1").text().splitlines()
    assert [line.split()[0] if line.split()[0] in "→←" else line.split()[1] for line in by_id] == ["→", "←"]
    assert "notifications/initialized" in kernel.run("%records --notifications").text()
    assert kernel.run("%records --method tools/call").text() == "no records --method tools/call from #1 rpc\n"


def test_error_answers_make_the_cell_an_error_naming_code_and_message(kernel, server):
    attach_and_initialize(kernel, server)
    unknown = kernel.run('%send {"jsonrpc": "2.0", "id": 2, "method": "resources/nope"}')
    assert unknown.status == "error" and unknown.error["ename"] == "MethodNotFound"
    assert unknown.error["evalue"].startswith('-32601 Method not found (data: resources/nope), the answer to request 2 '
                                              "(resources/nope) to #1 rpc"), unknown.error["evalue"]
    assert unknown.of_type("display_data")[0]["data"]["application/json"]["error"]["code"] == -32601  # shown too
    bad_tool = kernel.run(f"%send {tool(3, 'nosuch')}")
    assert bad_tool.error["ename"] == "InvalidParams" and "-32602 Unknown tool: nosuch" in bad_tool.error["evalue"]
    failed = kernel.run(f"%send {tool(4, 'fail')}")
    assert failed.status == "error" and failed.error["ename"] == "ToolError"
    assert failed.error["evalue"].startswith('the tool "fail" failed: the disk is full, the answer to request 4 '
                                             "(tools/call)"), failed.error["evalue"]
    both = kernel.run(f"%%send\n{tool(5, 'echo', text='fine')}\n{tool(6, 'fail')}\n{tool(7, 'nosuch')}")
    assert len(both.of_type("display_data")) == 3 and both.error["ename"] == "ToolError"
    assert both.error["evalue"].endswith("(and 1 more error answers above)")
    view = wait_for_display(kernel, r"→ 7 tools/call")
    assert re.search(r"→ 2 resources/nope  · error -32601 Method not found in \d+ ms", view), view
    assert re.search(r'→ 4 tools/call \{"name": "fail", "arguments": \{\}\}  · tool error in \d+ ms', view), view


def test_notifications_and_responses_are_sent_without_waiting(kernel, server):
    attach_and_initialize(kernel, server)
    asked = kernel.run(f"%send --no-wait {tool(2, 'roots')}")
    assert "sent request 2 (tools/call) to #1 rpc without waiting" in asked.text()
    wait_for_display(kernel, r'← "roots-1" roots/list  · pending [\d.]+ m?s: the program waits for your answer: '
                             r'%send 1 \{"jsonrpc": "2.0", "id": "roots-1", "result": \{"roots": \[')
    started = time.monotonic()
    answer = kernel.run('%send {"jsonrpc": "2.0", "id": "roots-1", "result": {"roots": [{"uri": "file:///w"}]}}')
    assert answer.status == "ok" and time.monotonic() - started < 5
    assert "sent the answer to #1 rpc's request \"roots-1\" (roots/list)" in answer.text()
    view = wait_for_display(kernel, r"1 roots: file:///w")
    assert re.search(r'← "roots-1" roots/list  · answered in \d+ ms', view), view
    note = kernel.run('%send {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}')
    assert note.status == "ok" and note.seconds < 5 and "notifications are not answered" in note.text()


def test_progress_notifications_reset_the_timeout(kernel, server):
    attach_and_initialize(kernel, server)
    started = time.monotonic()
    done = kernel.run(f"%send --timeout 1 {tool(2, 'slow', token='p2', seconds=3, progress_every=0.5)}")
    assert done.status == "ok", done.outputs
    assert time.monotonic() - started >= 3  # three seconds under a one-second timeout: progress kept it alive
    assert done.of_type("display_data")[0]["data"]["application/json"]["result"]["content"][0]["text"] == "slept 3 s"
    assert len(kernel.run("%records --id 2 --last 100").text().splitlines()) >= 6  # request, progress, answer
    silent = kernel.run(f"%send --timeout 1 {tool(3, 'slow', seconds=3)}")
    assert silent.status == "error" and silent.error["ename"] == "TimedOut"
    said = silent.error["evalue"]
    assert said.startswith("no answer to request 3 (tools/call) to #1 rpc within 1 s (no progress notification came "
                           'for it); sent notifications/cancelled {"requestId": 3'), said
    assert "cancelled 3: timed out in the notebook" in stderr_of(kernel, "cancelled 3")


def test_stop_while_waiting_sends_the_cancel_and_says_so(kernel, server):
    attach_and_initialize(kernel, server)
    msg_id = kernel.send(f"%send {tool(7, 'slow', seconds=20)}")
    kernel.wait_for(lambda m: m["msg_type"] == "update_display_data"
                    and re.search(r"→ 7 tools/call .*· pending", m["content"]["data"].get("text/plain", "")),
                    10, "request 7 pending in the view")
    kernel.km.interrupt_kernel()
    stopped = kernel.collect(msg_id)
    assert stopped.status == "error" and stopped.error["ename"] == "Interrupted"
    assert stopped.error["evalue"] == ('stopped waiting for the answer to request 7 (tools/call) to #1 rpc; sent '
                                       'notifications/cancelled {"requestId": 7, "reason": "the user pressed Stop in '
                                       'the notebook"}')
    log = stderr_of(kernel, "gave up request 7")
    assert "rpc-server: cancelled 7: the user pressed Stop in the notebook" in log and "gave up request 7" in log
    view = wait_for_display(kernel, r"cancelled \(notifications/cancelled\)")
    assert re.search(r"→ 7 tools/call .*· pending [\d.]+ m?s, cancelled \(notifications/cancelled\)", view), view


def test_a_log_line_on_stdout_is_flagged_and_the_conversation_goes_on(kernel, server):
    attach_and_initialize(kernel, server)
    answered = kernel.run(f"%send {tool(2, 'chatty')}")
    assert answered.status == "ok"
    assert answered.of_type("display_data")[0]["data"]["application/json"]["id"] == 2
    view = wait_for_display(kernel, r"stdout lines that are not JSON")
    assert "  ! server log: handling chatty  (not JSON: the program wrote a log line to stdout)" in view.splitlines()
    assert re.search(r"^\s+\d+ ! server log: handling chatty", kernel.run("%records").text(), re.M)
    assert kernel.run(f"%send {tool(3, 'echo', text='still here')}").status == "ok"


def test_attach_last_keeps_the_number_and_the_conversation(kernel, server):
    attach_and_initialize(kernel, server)
    kernel.run("%detach")
    refused = kernel.run(f"%send {tool(2, 'echo', text='x')}")
    assert refused.error["evalue"] == "#1 rpc is not attached (detached); %attach --last attaches again"
    again = kernel.run("%attach --last")
    assert again.text().startswith("attached again to #1 rpc ")
    assert kernel.run(f"%send {tool(2, 'echo', text='back')}").status == "ok"
    view = wait_for_display(kernel, r"echo: back")
    assert "  → 1 initialize " in view  # the initialize exchange stays in the history
    kernel.run("%attach -- sleep 60")  # a second program: --last no longer means #1
    kernel.run("%detach 1")
    assert kernel.run("%attach --list").status == "ok"
    hint = kernel.run(f"%send 1 {tool(3, 'echo', text='x')}").error["evalue"]
    assert hint.endswith("; %attach --last attaches again"), hint  # the most recent one not attached
    kernel.run("%attach --kill 2")


def test_a_saved_conversation_replays_against_the_same_and_a_changed_server(kernel, server, tmp_path):
    attach_and_initialize(kernel, server)
    kernel.run(f"%send {tool(2, 'echo', text='hello')}")
    kernel.run(f"%send {tool(3, 'fail')}")  # an error answer is part of the conversation too
    kernel.run(f"%send --no-wait {tool(4, 'roots')}")
    wait_for_display(kernel, r"the program waits for your answer")
    kernel.run('%send {"jsonrpc": "2.0", "id": "roots-1", "result": {"roots": [{"uri": "file:///w"}]}}')
    wait_for_display(kernel, r"1 roots: file:///w")
    saved = kernel.run("%records --save talk.jsonl")
    assert saved.status == "ok" and f"to {tmp_path}/talk.jsonl" in saved.text(), saved.outputs
    lines = [json.loads(line) for line in (tmp_path / "talk.jsonl").read_text().splitlines()]
    assert lines[0]["owsandbox"] == "conversation" and lines[0]["command"] == server and lines[0]["dialect"] == "mcp"
    assert [e["dir"] for e in lines[1:3]] == ["sent", "received"] and all("at" in e for e in lines[1:])
    kernel.run("%attach --kill")

    same = kernel.run("%replay talk.jsonl")
    assert same.status == "ok", same.outputs
    assert "replayed 4 requests of talk.jsonl against #2 replay" in same.text()
    assert ": 4 answers the same, 0 different\n" in same.text() and "ended #2 replay" in same.text()
    changed = kernel.run(f"%replay talk.jsonl --against {server} --changed")
    assert changed.status == "error" and changed.error["ename"] == "ReplayDiffers"
    assert changed.error["evalue"] == "1 of 4 answers differs from talk.jsonl: id 2 (tools/call)"
    diff = changed.text()
    assert "≠ id 2 (tools/call)\n" in diff and '-        "text": "echo: hello",' in diff
    assert '+        "text": "ECHO: hello",' in diff
    assert "= id 1 (initialize), id 3 (tools/call), id 4 (tools/call)" in diff
    ignored = kernel.run(f"%replay talk.jsonl --ignore text --against {server} --changed")
    assert ignored.status == "ok", ignored.outputs


@pytest.fixture(scope="module")
def mcp_server_time() -> Path:
    return installed_mcp_server_time()  # once into the checkout's .cache/tests (tests/mcp_servers.py)


def test_a_real_mcp_server(kernel, mcp_server_time):
    command = f"{mcp_server_time} --local-timezone UTC"
    attach_and_initialize(kernel, command)
    listed = kernel.run('%send {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}')
    names = {t["name"] for t in listed.of_type("display_data")[0]["data"]["application/json"]["result"]["tools"]}
    assert {"get_current_time", "convert_time"} <= names
    request = tool(3, "convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")
    converted = kernel.run(f"%send {request}")
    assert converted.status == "ok", converted.outputs
    result = converted.of_type("display_data")[0]["data"]["application/json"]["result"]
    assert result["structuredContent"]["target"]["datetime"].endswith("T21:00:00+09:00")
    unknown = kernel.run(f"%send --no-check {tool(4, 'nosuch')}")  # the server's own answer to it
    assert unknown.status == "error" and unknown.error["ename"] in ("InvalidParams", "ToolError"), unknown.error
    view = wait_for_display(kernel, r"→ 4 tools/call")
    assert re.search(r"→ 3 tools/call .*· answered in \d+ ms", view), view
    assert kernel.run("%records --save time.jsonl").status == "ok"
    kernel.run("%attach --kill")
    replayed = kernel.run("%replay time.jsonl")
    assert replayed.status == "ok" and "4 answers the same, 0 different" in replayed.text(), replayed.outputs


def test_answers_given_with_attach_go_on_after_a_kernel_restart(tmp_path, server):
    """`--answer` is kept with the program's entry in the sandbox: `%attach --last` in the restarted
    kernel answers the program's requests as the last kernel did, and says so."""
    (tmp_path / "roots.json").write_text(json.dumps({"result": {"roots": [{"uri": "file:///kept"}]}}))
    kernel = KernelSession(tmp_path, connection_file=str(tmp_path / f"kernel-{uuid.uuid4()}.json"))
    try:
        started = kernel.run(f"%attach --name rpc --answer roots/list=roots.json -- {server}")
        assert "answering roots/list requests of #1 rpc from roots.json" in started.text(), started.outputs
        assert kernel.run(f"%send {json.dumps(INITIALIZE)}").status == "ok"
        kernel.restart(now=False)
        again = kernel.run("%attach --last")
        assert again.status == "ok" and "answering roots/list requests of #1 rpc from roots.json" in again.text()
        asked = kernel.run(f"%send {tool(2, 'roots')}")
        assert asked.status == "ok", asked.outputs
        [shown] = asked.of_type("display_data")
        assert shown["data"]["application/json"]["result"]["content"][0]["text"] == "1 roots: file:///kept"
        kernel.run("%attach --kill")
    finally:
        kernel.close()
