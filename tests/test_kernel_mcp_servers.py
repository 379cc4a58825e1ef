"""%attach with real MCP servers nobody here wrote, through the real kernel: the reference server
`@modelcontextprotocol/server-everything` (node, from npm) for progress that resets a %send's
timeout, a long-running tool stopped with Stop (the server cancels it: its answer never comes),
and the server's own requests (sampling, elicitation, roots) answered from the notebook, by the
`%send` line the view shows and by `--answer` files while a `%send` waits; `mcp-server-time`
(Python, from the package index) for a tools/call checked against its inputSchema before it is
sent, and Tab completing its methods and tools in a %send line. Both are installed once into the
checkout's .cache/tests (tests/mcp_servers.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .kernel_session import KernelSession
from .mcp_servers import everything_command, mcp_server_time
from .test_kernel_attach import wait_for_display
from .test_kernel_jsonrpc import INITIALIZED, tool

pytestmark = [pytest.mark.system, pytest.mark.needs("npm", "mcp-server-time")]


@pytest.fixture(scope="module")
def everything() -> str:
    return everything_command()


@pytest.fixture(scope="module")
def time_server() -> str:
    return f"{mcp_server_time()} --local-timezone UTC"


@pytest.fixture
def kernel(fresh_kernel: KernelSession) -> KernelSession:
    return fresh_kernel


def initialize(kernel: KernelSession, command: str, capabilities: dict | None = None, options: str = "") -> str:
    """Attach to `command` and go through MCP's initialize; what %attach said."""
    started = kernel.run(f"%attach --name mcp {options} -- {command}")
    assert started.status == "ok", started.outputs
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": capabilities or {},
                        "clientInfo": {"name": "nb", "version": "1"}}}
    answered = kernel.run(f"%send {json.dumps(hello)}")
    assert answered.status == "ok", answered.outputs
    assert kernel.run(f"%send {json.dumps(INITIALIZED)}").status == "ok"
    return started.text()


def answer_of(run) -> dict:
    return run.of_type("display_data")[0]["data"]["application/json"]


def text_of(run) -> str:
    return answer_of(run)["result"]["content"][0]["text"]


def lines_about(kernel: KernelSession, request_id: int) -> list[dict]:
    text = kernel.run(f"%records --id {request_id} --last 1000").text()
    return [json.loads(m.group(1)) for m in re.finditer(r"^\s*\d* [←→] (\{.*\})$", text, re.M)]


def test_progress_of_a_real_server_resets_the_timeout(kernel, everything):
    initialize(kernel, everything)
    # 2.4 s of work under a 1.5 s timeout, kept alive by a progress notification every 0.4 s
    work = tool(2, "trigger-long-running-operation", token="p2", duration=2.4, steps=6)
    done = kernel.run(f"%send --timeout 1.5 {work}")
    assert done.status == "ok", done.outputs
    assert text_of(done) == "Long running operation completed. Duration: 2.4 seconds, Steps: 6."
    progress = [r for r in lines_about(kernel, 2) if r.get("method") == "notifications/progress"]
    assert [r["params"]["progress"] for r in progress] == [1, 2, 3, 4, 5, 6]
    # the same work without a progress token: nothing resets the timeout, and the call is cancelled
    silent = kernel.run(f"%send --timeout 1 {tool(3, 'trigger-long-running-operation', duration=3, steps=1)}")
    assert silent.status == "error" and silent.error["ename"] == "TimedOut", silent.outputs
    assert 'sent notifications/cancelled {"requestId": 3' in silent.error["evalue"]


def test_stop_cancels_a_long_running_tool_and_the_server_drops_its_answer(kernel, everything):
    initialize(kernel, everything)
    msg_id = kernel.send(f"%send {tool(7, 'trigger-long-running-operation', token='p7', duration=3, steps=3)}")
    wait_for_display(kernel, r"→ 7 tools/call .*· pending [\d.]+ m?s, progress 1 of 3")
    kernel.km.interrupt_kernel()
    stopped = kernel.collect(msg_id)
    assert stopped.status == "error" and stopped.error["ename"] == "Interrupted", stopped.outputs
    assert stopped.error["evalue"].endswith('sent notifications/cancelled {"requestId": 7, "reason": "the user pressed '
                                            'Stop in the notebook"}')
    # A second call of the same tool, started after the first, answers after the first would have:
    # by then the server has had every chance to answer 7, and it has not (it saw the cancel).
    later = kernel.run(f"%send --timeout 20 {tool(8, 'trigger-long-running-operation', duration=3, steps=1)}")
    assert later.status == "ok", later.outputs
    about_7 = lines_about(kernel, 7)
    assert about_7[0]["method"] == "tools/call" and "notifications/cancelled" in [r.get("method") for r in about_7]
    assert not [r for r in about_7 if "result" in r or "error" in r], about_7
    view = wait_for_display(kernel, r"→ 8 tools/call .*answered")
    assert re.search(r"→ 7 tools/call .*· pending [\d.]+ m?s, progress \d of 3, cancelled \(notifications/cancelled\)",
                     view), view


def test_a_sampling_request_is_answered_by_the_send_line_the_view_shows(kernel, everything):
    initialize(kernel, everything, {"sampling": {}})
    asked = kernel.run(f"%send --no-wait {tool(2, 'trigger-sampling-request', prompt='a haiku')}")
    assert asked.status == "ok", asked.outputs
    view = wait_for_display(kernel, r"sampling/createMessage .*the program waits for your answer: %send 1 ")
    line = re.search(r"sampling/createMessage .*the program waits for your answer: (%send 1 \{.*\})$", view, re.M)
    assert line is not None, view
    answered = kernel.run(line.group(1))  # the line exactly as the view shows it
    assert answered.status == "ok" and "sent the answer to #1 mcp's request" in answered.text(), answered.outputs
    view = wait_for_display(kernel, r"→ 2 tools/call .*answered")
    assert re.search(r"← \d+ sampling/createMessage .*· answered in \d+ m?s", view), view
    result = [r for r in lines_about(kernel, 2) if "result" in r][0]["result"]["content"][0]["text"]
    assert result.startswith("LLM sampling result:") and '"model": "notebook"' in result, result


def test_answer_files_answer_the_server_while_a_send_waits(kernel, everything, tmp_path: Path):
    (tmp_path / "roots.json").write_text(json.dumps({"result": {"roots": [{"uri": "file:///lab", "name": "lab"}]}}))
    (tmp_path / "sample.json").write_text(json.dumps({"result": {
        "role": "assistant", "content": {"type": "text", "text": "an old silent pond"}, "model": "a-file"}}))
    (tmp_path / "elicit.json").write_text(json.dumps({"result": {"action": "accept", "content": {"name": "Ada"}}}))
    options = ("--answer roots/list=roots.json --answer sampling/createMessage=sample.json "
               "--answer elicitation/create=elicit.json")
    said = initialize(kernel, everything, {"roots": {}, "sampling": {}, "elicitation": {}}, options)
    assert "answering roots/list requests of #1 mcp from roots.json\n" in said, said
    # Each %send waits for its tool, whose server asks the notebook first: only --answer can answer.
    roots = kernel.run(f"%send --timeout 20 {tool(2, 'get-roots-list')}")
    assert roots.status == "ok", roots.outputs
    assert "1. lab\n   URI: file:///lab" in text_of(roots)
    sampled = kernel.run(f"%send --timeout 20 {tool(3, 'trigger-sampling-request', prompt='a haiku')}")
    assert sampled.status == "ok" and "an old silent pond" in text_of(sampled), sampled.outputs
    elicited = kernel.run(f"%send --timeout 20 {tool(4, 'trigger-elicitation-request')}")
    assert elicited.status == "ok" and "Ada" in json.dumps(answer_of(elicited)), elicited.outputs
    view = wait_for_display(kernel, r"→ 4 tools/call .*answered")
    assert re.search(r"← \d+ sampling/createMessage .*· answered by --answer sample.json in \d+ m?s", view), view
    assert re.search(r"← \d+ elicitation/create .*· answered by --answer elicit.json in \d+ m?s", view), view


def test_a_bad_answer_file_is_refused_before_anything_starts(kernel, everything, tmp_path: Path):
    (tmp_path / "bad.json").write_text('{"roots": []}')
    refused = kernel.run(f"%attach --answer roots/list=bad.json -- {everything}")
    assert refused.status == "error" and refused.error["ename"] == "UsageError"
    assert 'bad.json: the file must hold one JSON object with either "result" or "error"' in refused.error["evalue"]
    missing = kernel.run(f"%attach --answer roots/list=nothing.json -- {everything}")
    assert missing.status == "error" and "--answer roots/list=nothing.json: " in missing.error["evalue"]
    (tmp_path / "good.json").write_text('{"result": {"roots": []}}')
    twice = kernel.run(f"%attach --answer roots/list=good.json --answer roots/list=bad.json -- {everything}")
    assert twice.error["evalue"] == "--answer roots/list is given twice (good.json and bad.json)"
    shapeless = kernel.run(f"%attach --answer roots/list -- {everything}")
    assert "--answer takes METHOD=FILE.json (as in roots/list=roots.json), not 'roots/list'" \
        in shapeless.error["evalue"]
    assert kernel.run("%attach --list").text().startswith("no programs in this sandbox yet")


def complete(kernel: KernelSession, code: str) -> list[str]:
    msg_id = kernel.kc.complete(code, len(code))
    while True:
        reply = kernel.kc.get_shell_msg(timeout=20)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]["matches"]


def test_a_tools_call_is_checked_against_the_real_servers_schema_and_tab_completes_its_tools(kernel, time_server):
    initialize(kernel, time_server)
    unchecked = kernel.run(f"%send {tool(2, 'convert_time', source_timezone='UTC', time=12)}")
    assert unchecked.status == "error" and unchecked.error["ename"] == "ToolError"  # no tools/list yet: the server says
    assert complete(kernel, '%send {"jsonrpc": "2.0", "id": 3, "method": "tools/l') == ["tools/list"]
    assert kernel.run('%send {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}').status == "ok"
    refused = kernel.run(f"%send {tool(4, 'convert_time', source_timezone='UTC', time=12)}")
    assert refused.status == "error" and refused.error["ename"] == "InvalidArguments", refused.outputs
    assert refused.error["evalue"] == (
        'the arguments of tools/call "convert_time" do not fit its inputSchema: arguments.target_timezone is '
        'required but missing; arguments.time should be string, not integer (12); nothing was sent (%send '
        '--no-check sends it anyway)')
    assert lines_about(kernel, 4) == []  # nothing went to the server
    unknown = kernel.run(f"%send {tool(5, 'get_time')}")
    assert unknown.error["evalue"].startswith('no tool "get_time" in the program\'s tools/list (it has: convert_time, '
                                              'get_current_time)')
    forced = kernel.run(f"%send --no-check {tool(6, 'convert_time', source_timezone='UTC', time=12)}")
    assert forced.status == "error" and forced.error["ename"] == "ToolError"  # sent: the server's own refusal
    assert complete(kernel, '%send {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "con') \
        == ["convert_time"]
    assert complete(kernel, '%send 1 {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "') \
        == ["get_current_time", "convert_time"]
    assert "notifications/initialized" in complete(kernel, '%send {"jsonrpc": "2.0", "method": "')
