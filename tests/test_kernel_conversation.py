"""The sans-I/O parts of %attach's JSON-RPC support, fed records: which record answers which, the
conversation's calls and lanes, the dialects' cancels and progress, error answers by code, the
view's lines, saved conversations and a replay's verdict, and the decoder's flagged stdout lines."""

from __future__ import annotations

import json
import re

import pytest

from owsandbox.channel.errors import BadRecord
from owsandbox.channel.execdws import STDOUT, encode_frame
from owsandbox.channel.jsonlines import JsonLineDecoder, NotJsonLine, Record
from owsandbox.kernel.attach import jsonrpc as R
from owsandbox.kernel.attach import jsonrpc_errors as E
from owsandbox.kernel.attach.answers import error_in
from owsandbox.kernel.attach.conversation import (
    KEEP_NOTIFICATIONS,
    KEEP_RECORDS,
    RECEIVED,
    SENT,
    Conversation,
)
from owsandbox.kernel.attach.dialects import ACP, LSP, MCP, PLAIN, guess
from owsandbox.kernel.attach.replay import compare, parse, report, saved_text
from owsandbox.kernel.attach.timeline import RECORD_CHARS, timeline
from owsandbox.kernel.errors import UsageError

pytestmark = pytest.mark.unit

T = 1_700_000_000.0


def request(rid, method, **params):
    record = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params:
        record["params"] = params
    return record


def notification(method, **params):
    return {"jsonrpc": "2.0", "method": method, "params": params}


def result(rid, value=None):
    return {"jsonrpc": "2.0", "id": rid, "result": value if value is not None else {}}


def error(rid, code, message, data=None):
    body = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": body}


MCP_INIT = request(1, "initialize", protocolVersion="2025-06-18", capabilities={}, clientInfo={"name": "t"})


# -- what a record is ------------------------------------------------------------------------

def test_records_are_requests_notifications_or_responses_by_shape():
    assert R.kind_of(request(1, "ping")) == R.REQUEST
    assert R.kind_of(notification("notifications/initialized")) == R.NOTIFICATION
    assert R.kind_of(result(1)) == R.RESPONSE and R.kind_of(error(1, -1, "x")) == R.RESPONSE
    assert R.kind_of({"id": 1, "method": "x"}) is None  # no "jsonrpc": "2.0": another protocol
    assert R.kind_of({"jsonrpc": "2.0", "id": 1}) is None  # no result, no error, no method
    assert R.waits_for_answer(request(1, "ping")) and not R.waits_for_answer(notification("x"))
    assert not R.waits_for_answer(result(7))  # the answer to the program's own request
    assert R.waits_for_answer({"id": 1, "type": "echo"}) and not R.waits_for_answer({"type": "exit"})


def test_ids_keep_numbers_strings_and_booleans_apart():
    assert R.answers(result(1), request(1, "a")) and R.answers(result(1.0), request(1, "a"))
    assert not R.answers(result("1"), request(1, "a")) and not R.answers(result(True), request(1, "a"))
    assert not R.answers(notification("x"), request(1, "a"))
    # another protocol's records: the first with the id that is not an event
    assert R.answers({"id": 4, "type": "response"}, {"id": 4, "type": "echo"})
    assert not R.answers({"id": 4, "type": "event"}, {"id": 4, "type": "echo"})


# -- the conversation ------------------------------------------------------------------------

def test_a_request_and_its_answer_make_a_call_with_its_latency():
    talk = Conversation()
    sent = talk.sent(MCP_INIT, T)
    assert talk.dialect is MCP and talk.rpc  # initialize's protocolVersion is a date: MCP
    got = talk.received(result(1, {"protocolVersion": "2025-06-18"}), T + 0.025, offset=80)
    assert got.call is sent.call and sent.call.answer is got and sent.call.latency() == pytest.approx(0.025, abs=1e-6)
    assert talk.pending_calls() == [] and talk.counts[SENT] == 1 and talk.counts[RECEIVED] == 1
    late = talk.received(result(1), T + 1)  # a second answer to the same id answers nothing
    assert late.call is None


def test_progress_notifications_belong_to_their_request_by_dialect():
    mcp = Conversation()
    mcp.sent(request(2, "tools/call", name="slow", _meta={"progressToken": "t2"}), T)
    step = mcp.received(notification("notifications/progress", progressToken="t2", progress=1, total=4), T + 0.5)
    other = mcp.received(notification("notifications/progress", progressToken="nobody", progress=1), T + 0.6)
    assert step.call is not None and step.call.id == 2 and step.call.progress_count == 1 and other.call is None
    lsp = Conversation(LSP)
    lsp.sent(request(3, "workspace/symbol", query="x", workDoneToken="w3"), T)
    assert lsp.received(notification("$/progress", token="w3", value={"kind": "report"}), T).call.id == 3
    acp = Conversation(ACP)
    acp.sent(request(4, "session/prompt", sessionId="s1", prompt=[]), T)
    assert acp.received(notification("session/update", sessionId="s1", update={}), T).call.id == 4
    assert acp.received(notification("session/update", sessionId="s2", update={}), T).call is None


def test_a_request_of_the_program_is_answered_by_a_sent_response():
    talk = Conversation(MCP)
    asked = talk.received(request("r1", "roots/list"), T, offset=10)
    assert asked.call.asked_by == RECEIVED and talk.pending_call("r1", RECEIVED) is asked.call
    answer = talk.sent(result("r1", {"roots": []}), T + 1)
    assert answer.call is asked.call and asked.call.answer is answer and talk.pending_call("r1", RECEIVED) is None
    assert talk.pending_call("r1") is None  # the program's ids and the notebook's are two namespaces


def test_records_of_other_protocols_keep_the_event_rule():
    talk = Conversation()
    sent = talk.sent({"id": 8, "type": "count"}, T)
    talk.received({"type": "event", "id": 8, "n": 1}, T + 0.1)
    assert sent.call.pending
    talk.received({"id": 8, "type": "response", "ok": True}, T + 0.2)
    assert sent.call.answer is not None and not talk.rpc and talk.dialect is PLAIN


def test_lanes_are_bounded_and_calls_outlive_a_flood_of_notifications():
    talk = Conversation()
    talk.sent(MCP_INIT, T)
    talk.received(result(1), T)
    for n in range(KEEP_RECORDS + 10):
        talk.received(notification("notifications/message", n=n), T)
    assert len(talk.records) == KEEP_RECORDS and len(talk.notifications) == KEEP_NOTIFICATIONS
    kept = talk.entries()
    assert kept[0].record == MCP_INIT and kept[1].record == result(1)  # the initialize exchange is still there
    assert [e.seq for e in kept] == sorted(e.seq for e in kept)


def test_stderr_becomes_lines_however_it_is_cut():
    talk = Conversation()
    assert talk.stderr("first li", T) == []
    lines = talk.stderr("ne\nsecond\nthi", T + 1)
    assert [e.text for e in lines] == ["first line", "second"] and talk.stderr_partial == "thi"
    assert lines[0].at == T  # a line is as old as its first bytes


def test_select_filters_by_notification_method_and_id():
    talk = Conversation()
    talk.sent(MCP_INIT, T)
    talk.received(result(1), T)
    talk.sent(notification("notifications/initialized"), T)
    talk.sent(request(2, "tools/call", name="slow", _meta={"progressToken": "p"}), T)
    talk.received(notification("notifications/progress", progressToken="p", progress=1), T)
    talk.received(result(2), T)
    talk.sent(request("2", "tools/list"), T)
    methods = [e.record.get("method") for e in talk.select(notifications=True)]
    assert methods == ["notifications/initialized", "notifications/progress"]
    assert [e.kind for e in talk.select(method="tools/call")] == [R.REQUEST, R.NOTIFICATION, R.RESPONSE]
    assert [e.kind for e in talk.select(request_id=2, by_id=True)] == [R.REQUEST, R.NOTIFICATION, R.RESPONSE]
    assert [e.record["method"] for e in talk.select(request_id="2", by_id=True)] == ["tools/list"]


# -- dialects --------------------------------------------------------------------------------

def test_dialects_are_guessed_from_initialize_or_a_method_family():
    assert guess(MCP_INIT) is MCP
    assert guess(request(1, "initialize", protocolVersion=1, clientCapabilities={})) is ACP
    assert guess(request(1, "initialize", processId=None, rootUri=None, capabilities={})) is LSP
    assert guess(request(1, "textDocument/hover")) is LSP and guess(notification("session/update")) is ACP
    assert guess(request(1, "tools/list")) is MCP and guess(request(1, "sum")) is None
    assert guess(result(1)) is None and guess({"method": "tools/list"}) is None
    talk = Conversation(LSP)
    talk.sent(MCP_INIT, T)
    assert talk.dialect is LSP  # named by --dialect: never guessed over


def test_each_dialect_cancels_in_its_own_words():
    call = request(5, "tools/call", name="x")
    assert MCP.cancel(call, "why") == {"jsonrpc": "2.0", "method": "notifications/cancelled",
                                      "params": {"requestId": 5, "reason": "why"}}
    assert LSP.cancel(call, "why") == {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 5}}
    assert ACP.cancel(request(6, "session/prompt", sessionId="s"), "") == {
        "jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}}
    assert ACP.cancel(call, "") is None and PLAIN.cancel(call, "") is None


# -- error answers ---------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "dialect", "name"), [
    (-32700, PLAIN, "ParseError"), (-32600, PLAIN, "InvalidRequest"), (-32601, MCP, "MethodNotFound"),
    (-32602, MCP, "InvalidParams"), (-32603, LSP, "InternalError"), (-32050, PLAIN, "ServerError"),
    (-32002, LSP, "ServerNotInitialized"), (-32002, MCP, "ResourceNotFound"), (-32800, LSP, "RequestCancelled"),
    (-32000, ACP, "AuthRequired"), (-32000, MCP, "ServerError"), (42, PLAIN, "JsonRpcError"),
    ("x", PLAIN, "JsonRpcError")])
def test_one_error_class_per_code(code, dialect, name):
    found = E.from_error({"code": code, "message": "m"}, dialect.codes, "request 1")
    assert found.ename == name and isinstance(found, E.JsonRpcError)


def test_an_error_answer_names_code_message_data_and_request():
    talk = Conversation()
    sent = talk.sent(request(3, "resources/read", uri="x"), T)
    talk.received(error(3, -32602, "Invalid params", {"field": "uri"}), T)
    found = error_in(sent.call, talk.dialect.codes, talk.dialect.tool_error, "#1 srv")
    assert found.ename == "InvalidParams" and found.evalue == (
        '-32602 Invalid params (data: {"field": "uri"}), the answer to request 3 (resources/read) to #1 srv')


def test_an_mcp_tool_result_with_is_error_is_a_tool_error():
    talk = Conversation(MCP)
    sent = talk.sent(request(4, "tools/call", name="fetch", arguments={}), T)
    talk.received(result(4, {"content": [{"type": "text", "text": "timed out"}], "isError": True}), T)
    found = error_in(sent.call, MCP.codes, MCP.tool_error, "#1 srv")
    assert found.ename == "ToolError"
    assert found.evalue == 'the tool "fetch" failed: timed out, the answer to request 4 (tools/call) to #1 srv'
    good = talk.sent(request(5, "tools/call", name="fetch"), T)
    talk.received(result(5, {"content": [], "isError": False}), T)
    assert error_in(good.call, MCP.codes, MCP.tool_error, "#1") is None


# -- the view --------------------------------------------------------------------------------

def test_the_view_shows_calls_with_answers_under_them_and_lanes():
    talk = Conversation()
    talk.sent(MCP_INIT, T)
    talk.received(result(1, {"ok": True}), T + 0.012)
    talk.sent(notification("notifications/initialized"), T + 0.02)
    talk.sent(request(2, "tools/call", name="slow", _meta={"progressToken": "p"}), T + 1)
    talk.received(notification("notifications/progress", progressToken="p", progress=2, total=5), T + 2)
    talk.received(request("s1", "sampling/createMessage"), T + 2)
    talk.stderr("booting\n", T)
    talk.stdout_text("Server ready on stdio\n", T, 99)
    lines = timeline(talk, 1, T + 3.5)
    assert lines[0] == "MCP · 3 calls, 2 pending · 2 notifications"
    i = lines.index("calls")
    assert lines[i + 1].startswith("  → 1 initialize {") and lines[i + 1].endswith("· answered in 12 ms")
    assert lines[i + 2] == '      ← {"jsonrpc": "2.0", "id": 1, "result": {"ok": true}}'
    assert lines[i + 3].endswith("· pending 2.5 s, progress 2 of 5")
    assert lines[i + 4] == ('  ← "s1" sampling/createMessage  · pending 1.5 s: the program waits for your answer: '
                            '%send 1 {"jsonrpc": "2.0", "id": "s1", "result": {"role": "assistant", "content": '
                            '{"type": "text", "text": "..."}, "model": "notebook", "stopReason": "endTurn"}}')
    assert "  → notifications/initialized {}" in lines and "  booting" in lines
    assert "  ! Server ready on stdio  (not JSON: the program wrote a log line to stdout)" in lines


def test_the_view_of_other_programs_shows_records_both_ways_and_cuts_long_lines():
    talk = Conversation()
    talk.received({"type": "ready"}, T)
    talk.sent({"id": 1, "type": "echo", "text": "x" * 5000}, T)
    lines = timeline(talk, 3, T + 0.5)
    assert lines[0] == '← {"type": "ready"}'
    assert lines[1].startswith('→ {"id": 1, "type": "echo"') and len(lines[1]) < RECORD_CHARS + 100
    assert re.search(r"… \(\d{4} characters; %records 3 prints it whole\)$", lines[1])


# -- saving and replaying --------------------------------------------------------------------

def conversation_of(echo: str) -> Conversation:
    talk = Conversation()
    talk.sent(MCP_INIT, T)
    talk.received(result(1, {"serverInfo": {"version": "1"}}), T + 0.1)
    talk.sent(notification("notifications/initialized"), T + 0.2)
    talk.sent(request(2, "tools/call", name="echo"), T + 0.3)
    talk.received(result(2, {"content": [{"type": "text", "text": echo}], "at": T}), T + 0.4)
    talk.stderr("log\n", T)
    return talk


def test_a_saved_conversation_reads_back_with_its_client_side():
    text, count = saved_text(conversation_of("hi"), {"program": "srv", "command": "python3 srv.py", "cwd": "/w"})
    header, *entries = [json.loads(line) for line in text.splitlines()]
    assert header["owsandbox"] == "conversation" and header["command"] == "python3 srv.py"
    assert header["dialect"] == "mcp" and count == len(entries) == 6
    assert entries[0] == {"at": T, "dir": "sent", "record": MCP_INIT}
    saved = parse(text, "talk.jsonl")
    assert saved.client_side == [MCP_INIT, notification("notifications/initialized"), request(2, "tools/call",
                                                                                              name="echo")]
    assert [c.id for c in saved.calls()] == [1, 2] and all(c.answer is not None for c in saved.calls())
    bare = parse('{"id": 1, "type": "echo"}\n\n{"type": "exit"}\n', "script.jsonl")
    assert bare.header == {} and bare.client_side == [{"id": 1, "type": "echo"}, {"type": "exit"}]


def test_a_save_of_a_long_conversation_says_how_much_came_before_it():
    talk = Conversation()
    for n in range(KEEP_RECORDS + 50):
        talk.sent(request(n, "ping"), T + n)
        talk.received(result(n, {}), T + n + 0.5)
    text, count = saved_text(talk, {})
    header = json.loads(text.splitlines()[0])
    assert talk.made == 2 * (KEEP_RECORDS + 50) and count < talk.made
    assert header["dropped"] == talk.made - count and header["entries"] == count
    assert "dropped" not in json.loads(saved_text(conversation_of("hi"), {})[0].splitlines()[0])  # all kept


@pytest.mark.parametrize(("text", "said"), [("", "is empty"), ("{nope\n", "line 1, is not JSON"),
                                            ("[1]\n", "line 1, is not a JSON object"),
                                            ('{"owsandbox": "conversation", "version": 9}\n', "version 9"),
                                            ('{"owsandbox": "conversation", "version": 1}\n{"x": 1}\n', 'no "dir"'),
                                            ('{"owsandbox": "conversation", "version": 1}\n', "nothing the client")])
def test_a_file_that_is_not_a_conversation_is_refused_naming_why(text, said):
    with pytest.raises(UsageError, match=said):
        parse(text, "f.jsonl")


def test_a_replay_verdict_aligns_answers_by_id_and_ignores_what_it_is_told():
    saved = parse(saved_text(conversation_of("hi"), {})[0], "a.jsonl")
    same = compare(saved.calls(), parse(saved_text(conversation_of("hi"), {})[0], "b").calls())
    assert [c.id for c in same.same] == [1, 2] and not same.differ
    changed = compare(saved.calls(), parse(saved_text(conversation_of("HI"), {})[0], "b").calls())
    assert [c.id for c in changed.same] == [1] and [c.id for c, _ in changed.differ] == [2]
    diff = changed.differ[0][1]
    assert '-        "text": "hi",' in diff and '+        "text": "HI",' in diff
    assert report(changed, "a.jsonl", "#2 srv").startswith(
        "replayed 2 requests of a.jsonl against #2 srv: 1 answer the same, 1 different\n≠ id 2 (tools/call)\n")
    assert not compare(saved.calls(), parse(saved_text(conversation_of("HI"), {})[0], "b").calls(),
                       frozenset({"text"})).differ
    missing = compare(saved.calls(), saved.calls()[:1])
    assert [c.id for c, _ in missing.differ] == [2] and "+(not sent in the replay)" in missing.differ[0][1]


def test_an_id_used_twice_is_matched_by_its_use():
    def twice(first: str, second: str) -> Conversation:
        talk = Conversation()
        for text in (first, second):
            talk.sent(request(1, "echo"), T)
            talk.received(result(1, {"text": text}), T)
        return talk

    verdict = compare(parse(saved_text(twice("a", "b"), {})[0], "x").calls(),
                      parse(saved_text(twice("a", "c"), {})[0], "y").calls())
    assert len(verdict.same) == 1 and len(verdict.differ) == 1 and '+    "text": "c"' in "\n".join(
        verdict.differ[0][1])


# -- the decoder's flagged lines -------------------------------------------------------------

def test_a_log_line_on_stdout_is_an_event_when_asked_for_and_fatal_otherwise():
    stream = b'{"n": 1}\nServer listening\n[2]\n{"n": 2}\n'
    events = JsonLineDecoder(flag_non_json=True).feed(encode_frame(STDOUT, stream))
    assert [type(e).__name__ for e in events] == ["Record", "NotJsonLine", "NotJsonLine", "Record"]
    flagged = events[1]
    assert isinstance(flagged, NotJsonLine) and flagged.text == "Server listening"
    assert (flagged.start, flagged.offset, flagged.what) == (9, 26, "non-JSON stdout")
    assert events[2].what == "JSON record is not an object"
    assert isinstance(events[3], Record) and events[3].offset == len(stream)
    with pytest.raises(BadRecord):
        JsonLineDecoder().feed(encode_frame(STDOUT, stream))


def test_answers_that_changed_alike_are_one_diff_in_the_report():
    def echoes(text: str) -> Conversation:
        talk = Conversation()
        for rid in (2, 3):
            talk.sent(request(rid, "tools/call", name="add"), T)
            talk.received(result(rid, {"text": text}), T)
        return talk

    verdict = compare(parse(saved_text(echoes("5"), {})[0], "x").calls(), parse(saved_text(echoes("23"), {})[0],
                                                                               "y").calls())
    said = report(verdict, "x.jsonl", "#2")
    assert said.count("≠ ") == 1 and "≠ id 2 (tools/call), id 3 (tools/call) (2 answers, this same diff)\n" in said
