"""The sans-I/O parts of %attach's help with JSON-RPC: the JSON Schema subset a tools/call is checked
against, the tools and methods a session learns, the %send line that answers a program's request,
`--answer` files, and Tab's names inside a %send line."""

from __future__ import annotations

import json

import pytest

from owsandbox.kernel.attach.asked import (
    answer_line,
    answers_to_save,
    auto_answer,
    parse_option,
    saved_answers,
    template_result,
)
from owsandbox.kernel.attach.json_schema import problems, type_of
from owsandbox.kernel.attach.send_completion import send_matches
from owsandbox.kernel.attach.tools import InvalidArguments, Vocabulary
from owsandbox.kernel.errors import UsageError
from owsandbox.kernel.magics.attach import _no_check, _send_options

pytestmark = pytest.mark.unit

SUM = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "integer"}}, "required": ["a", "b"],
       "additionalProperties": False}


def test_type_required_and_unknown_properties_are_named_by_their_path():
    assert problems(SUM, {"a": 1.5, "b": 2}) == []
    assert problems(SUM, {"a": 1}) == ["arguments.b is required but missing"]
    assert problems(SUM, {"a": "1", "b": 2}) == ['arguments.a should be number, not string ("1")']
    assert problems(SUM, {"a": 1, "b": 2.5}) == ["arguments.b should be integer, not number (2.5)"]
    assert problems(SUM, {"a": 1, "b": 2, "c": 3}) == [
        "arguments.c is not a known property (additionalProperties is false; known: a, b)"]
    assert problems(SUM, [1, 2]) == ["arguments should be object, not array ([1, 2])"]
    assert problems(SUM, {"a": True, "b": 1}) == ["arguments.a should be number, not boolean (true)"]


def test_enum_items_nested_objects_and_type_lists():
    schema = {"type": "object", "properties": {
        "mode": {"enum": ["fast", "slow"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"x": {"type": ["integer", "null"]}}, "required": ["x"]},
    }}
    assert problems(schema, {"mode": "fast", "tags": ["a"], "where": {"x": None}}) == []
    assert problems(schema, {"mode": "medium"}) == ['arguments.mode should be one of "fast", "slow", not "medium"']
    assert problems(schema, {"tags": ["a", 2]}) == ["arguments.tags[1] should be string, not integer (2)"]
    assert problems(schema, {"where": {}}) == ["arguments.where.x is required but missing"]
    assert problems(schema, {"where": {"x": "1"}}) == ['arguments.where.x should be integer or null, not string ("1")']
    assert problems({"enum": [1]}, 1.0) == [] and problems({"enum": [1]}, True) != []


def test_what_the_subset_does_not_know_passes_and_so_does_no_schema():
    assert problems({"type": "string", "pattern": "^a", "minLength": 9}, "b") == []
    assert problems(None, {"x": 1}) == [] and problems(True, 3) == [] and problems({}, "x") == []
    assert problems(False, 1) == ["arguments is not allowed (its schema is false)"]
    assert problems({"type": "object", "additionalProperties": {"type": "string"}}, {"k": 1}) == [
        "arguments.k should be string, not integer (1)"]
    assert type_of(3.0) == "integer" and type_of(None) == "null" and type_of({}) == "object"


def call(name, **arguments):
    return {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def test_a_tools_call_is_checked_against_the_listed_schema_only_once_tools_were_listed():
    words = Vocabulary()
    words.check(call("anything", x=1))  # nothing listed yet: nothing refused
    words.listed("tools/list", {"jsonrpc": "2.0", "id": 2, "result": {"tools": [
        {"name": "get-sum", "inputSchema": SUM}, {"name": "echo"}]}})
    words.check(call("get-sum", a=1, b=2))
    words.check(call("echo", anything="goes"))  # no inputSchema: nothing to check
    with pytest.raises(InvalidArguments) as missing:
        words.check(call("get-sum", a=1))
    assert str(missing.value) == ('the arguments of tools/call "get-sum" do not fit its inputSchema: arguments.b is '
                                  'required but missing; nothing was sent (%send --no-check sends it anyway)')
    assert missing.value.ename == "InvalidArguments"
    with pytest.raises(InvalidArguments, match=r"no tool .nosuch. in the program.s tools/list \(it has: echo, get-sum"):
        words.check(call("nosuch"))
    with pytest.raises(InvalidArguments, match=r'a tools/call needs "params"'):
        words.check({"jsonrpc": "2.0", "id": 3, "method": "tools/call"})
    words.listed("resources/list", {"result": {"tools": [{"name": "not-a-tool"}]}})  # only tools/list counts
    assert list(words.tools) == ["get-sum", "echo"]


def test_methods_said_are_kept_once_in_order():
    words = Vocabulary()
    for method in ("initialize", "tools/list", "initialize", "notifications/progress"):
        words.said({"jsonrpc": "2.0", "method": method})
    words.said({"type": "echo", "method": "not-jsonrpc"})
    assert list(words.methods) == ["initialize", "tools/list", "notifications/progress"]


def test_the_line_that_answers_a_program_request_is_valid_json_with_its_id():
    line = answer_line({"jsonrpc": "2.0", "id": 0, "method": "roots/list"}, 2)
    assert line.startswith("%send 2 {")
    answer = json.loads(line.split(" ", 2)[2])
    assert answer == {"jsonrpc": "2.0", "id": 0, "result": {"roots": [{"uri": "file:///workspace",
                                                                       "name": "workspace"}]}}
    asked = {"jsonrpc": "2.0", "id": "p", "method": "session/request_permission",
             "params": {"options": [{"optionId": "allow-once", "kind": "allow_once"}, {"optionId": "reject"}]}}
    assert template_result(asked) == {"outcome": {"outcome": "selected", "optionId": "allow-once"}}
    assert template_result({"method": "elicitation/create"}) == {"action": "accept", "content": {}}
    assert template_result({"method": "unknown/thing"}) == {}


def test_answer_files_hold_a_result_or_an_error_and_take_the_request_id():
    auto = auto_answer("roots/list", "roots.json", '{"jsonrpc": "2.0", "id": 77, "result": {"roots": []}}')
    assert auto.to({"jsonrpc": "2.0", "id": "r-1", "method": "roots/list"}) == {
        "jsonrpc": "2.0", "id": "r-1", "result": {"roots": []}}
    refusal = auto_answer("sampling/createMessage", "no.json", '{"error": {"code": -1, "message": "no"}}')
    assert refusal.to({"id": 4})["error"] == {"code": -1, "message": "no"}
    assert parse_option("roots/list=a=b.json") == ("roots/list", "a=b.json")
    for bad, said in (("{", "the file is not JSON"), ("[]", 'either "result" or "error"'),
                      ('{"result": 1, "error": {}}', 'either "result" or "error"'),
                      ('{"roots": []}', 'either "result" or "error"'),
                      ('{"result": 1, "extra": 2}', "unknown members extra"),
                      ('{"error": {"code": "x", "message": "m"}}', 'an integer "code"')):
        with pytest.raises(UsageError, match=said):
            auto_answer("m", "f.json", bad)
    for bad in ("roots/list", "=f.json", "roots/list="):
        with pytest.raises(UsageError, match="--answer takes METHOD=FILE.json"):
            parse_option(bad)


def words(number):
    return (["initialize", "tools/list", "tools/call"], ["get-sum", "get-env", "echo"]) if number in (None, 2) \
        else (["other/method"], [])


def complete_at(code):
    cursor = len(code)
    start = cursor
    while start > 0 and code[start - 1] not in ' \t\n"':
        start -= 1
    line_start = code.rfind("\n", 0, start) + 1
    return send_matches(code, line_start, start, code[start:cursor], words)


def test_tab_in_a_send_line_offers_methods_and_the_tools_of_a_tools_call():
    assert complete_at('%send {"jsonrpc": "2.0", "id": 3, "method": "tools/') == ["tools/list", "tools/call"]
    assert complete_at('%send {"jsonrpc": "2.0", "id": 3, "method":"') == ["initialize", "tools/list", "tools/call"]
    assert complete_at('%send {"id": 3, "method": "tools/call", "params": {"name": "get-') == ["get-sum", "get-env"]
    assert complete_at('%send 1 {"id": 3, "method": "') == ["other/method"]  # program #1's own
    assert complete_at('%%send 2\n{"id": 3, "method": "tools/call", "params": {"name": "e') == ["echo"]
    assert complete_at('%send {"id": 3, "method": "tools/list", "params": {"name": "e') is None  # not a tools/call
    assert complete_at('%send {"id": 3, "te') is None  # a key, not a method's value
    assert complete_at('echo "method": "') is None  # not a %send line


def test_no_check_is_one_of_the_send_options_before_the_json():
    assert _no_check('--no-check 2 {"id": 1}') == ('2 {"id": 1}', False)
    assert _send_options(_no_check('2 --no-check --timeout 3 {"id": 1}')[0]) == (2, 3.0, False, '{"id": 1}')
    assert _no_check('{"text": "--no-check"}') == ('{"text": "--no-check"}', True)  # inside the JSON: a value
    assert _no_check("--no-check") == (" ", False)


def test_kept_answers_come_back_and_what_the_sandbox_spoiled_is_dropped():
    """The registry entry is in the sandbox, which may have rewritten it: each kept answer is checked
    as its file was."""
    kept = {"roots/list": auto_answer("roots/list", "roots.json", '{"result": {"roots": []}}'),
            "ping": auto_answer("ping", "err.json", '{"error": {"code": -1, "message": "no"}}')}
    assert saved_answers({"answers": answers_to_save(kept)}) == kept
    spoiled = {"answers": {"roots/list": {"path": "roots.json", "answer": {"result": 1, "error": {}}},
                           "ping": {"path": 3, "answer": {"result": {}}}, "x": "nope",
                           "sampling/createMessage": {"path": "s.json", "answer": {"result": {"ok": True}}}}}
    assert list(saved_answers(spoiled)) == ["sampling/createMessage"]
    assert saved_answers({}) == {} and saved_answers({"answers": []}) == {}

