"""Kernel subshells (ipykernel 7, JEP 91) are named shells in the sandbox: a second cell while one runs.

Through jupyter_client's raw messages, as a client that creates subshells sends them: a subshell is
made on the control channel, and a cell on it carries its id in the header. Each subshell runs its
cells on a bash shell of its own (`subshell-N`: its own folder and variables; files shared), at the
same time as the main shell's; Stop from a subshell ends only its command; its prompts are asked
for its own cell; `%shells` names it; deleting the subshell closes its shell.
"""

from __future__ import annotations

from typing import Any

import pytest

from .kernel_session import KernelSession
from .waiting import shell_waits_for


@pytest.fixture
def kernel(fresh_kernel: KernelSession) -> KernelSession:
    return fresh_kernel


def _subshell(kernel: KernelSession) -> str:
    reply = kernel.control("create_subshell_request", {})
    assert reply["content"]["status"] == "ok", reply["content"]
    return reply["content"]["subshell_id"]


def _interrupt(kernel: KernelSession, subshell_id: str | None = None) -> dict[str, Any]:
    msg = kernel.kc.session.msg("interrupt_request", {})
    if subshell_id is not None:
        msg["header"]["subshell_id"] = subshell_id
    kernel.kc.control_channel.send(msg)
    while True:
        reply = kernel.kc.control_channel.get_msg(timeout=10)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply


def _output_of(kernel: KernelSession, msg_id: str, text: str) -> None:
    kernel.wait_for(lambda m: m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream"
                    and text in m["content"]["text"], 30, f"'{text}' from the cell")


def test_the_kernel_says_it_has_subshells(kernel):
    kernel.kc.kernel_info()
    reply = kernel.kc.get_shell_msg(timeout=10)
    assert "kernel subshells" in reply["content"]["supported_features"]


def test_a_cell_on_a_subshell_runs_while_the_main_shell_is_busy_on_a_shell_of_its_own(kernel):
    subshell = _subshell(kernel)
    main = kernel.send("echo main-started; sleep 60; echo main-never")
    _output_of(kernel, main, "main-started")
    second = kernel.run_on(subshell, "cd /tmp; SUB=only-here; echo on-the-subshell $PWD")
    assert second.status == "ok", second.outputs
    assert second.text() == "on-the-subshell /tmp\n"
    listed = kernel.run_on(subshell, "%shells").of_type("display_data")[0]["data"]["text/plain"]
    assert "* subshell-1 (kernel subshell)" in listed and "busy" in listed.split("main", 1)[1].split("\n")[0]

    _interrupt(kernel)  # a Stop that names no subshell ends what runs on the main shell
    ended = kernel.collect(main)
    assert ended.reply["content"]["ename"] == "Interrupted" and "main-never" not in ended.text()
    apart = kernel.run('echo "[$SUB]" $PWD')
    assert apart.text() == f"[] {kernel.workspace}\n"  # the main shell's own variables and folder
    kept = kernel.run_on(subshell, 'echo "[$SUB]" $PWD')
    assert kept.text() == "[only-here] /tmp\n"  # and the subshell's, kept from cell to cell


def test_stop_from_a_subshell_ends_its_command_only(kernel):
    subshell = _subshell(kernel)
    # The main cell runs on until the test lets it finish, after the Stop: it was running all along, and
    # none of its messages come while the test reads the subshell's (which drops the others).
    go = kernel.workspace / "main-may-finish"
    main = kernel.send(f"echo main-started; {shell_waits_for(go)}; echo main-finished")
    _output_of(kernel, main, "main-started")
    on_sub = kernel.send("echo sub-started; sleep 60; echo sub-never", subshell_id=subshell)
    _output_of(kernel, on_sub, "sub-started")
    _interrupt(kernel, subshell)
    stopped = kernel.collect(on_sub)
    assert stopped.reply["content"]["ename"] == "Interrupted" and "sub-never" not in stopped.text()
    go.touch()
    finished = kernel.collect(main)
    assert finished.status == "ok" and finished.text() == "main-finished\n"  # "main-started" was read above
    assert kernel.run_on(subshell, "echo still-here").text() == "still-here\n"


def test_a_prompt_on_a_subshell_is_asked_for_its_own_cell(kernel):
    subshell = _subshell(kernel)
    main = kernel.send("echo main-started; sleep 60")
    _output_of(kernel, main, "main-started")
    asking = kernel.send('read -p "name? " who; echo "hello $who"', subshell_id=subshell, allow_stdin=True)
    request = kernel.kc.get_stdin_msg(timeout=30)
    assert request["msg_type"] == "input_request" and request["parent_header"]["msg_id"] == asking
    assert request["content"]["prompt"] == "name? "
    kernel.kc.input("subshell")
    answered = kernel.collect(asking)
    assert answered.status == "ok" and answered.text() == "hello subshell\n"
    _interrupt(kernel)
    assert kernel.collect(main).reply["content"]["ename"] == "Interrupted"


def test_deleting_a_subshell_closes_its_shell_and_a_new_one_gets_a_new_shell(kernel):
    first = _subshell(kernel)
    assert kernel.run_on(first, "cd /tmp && echo ok").text() == "ok\n"
    shells = kernel.run("%shells").of_type("display_data")[0]["data"]["text/plain"]
    assert "subshell-1 (kernel subshell)" in shells
    reply = kernel.control("delete_subshell_request", {"subshell_id": first})
    assert reply["content"]["status"] == "ok"
    shells = kernel.run("%shells").of_type("display_data")[0]["data"]["text/plain"]
    assert "subshell-1" not in shells
    second = _subshell(kernel)
    assert kernel.run_on(second, "pwd").text() == f"{kernel.workspace}\n"
    assert "* subshell-2 (kernel subshell)" in kernel.run_on(second, "%shells").of_type(
        "display_data")[0]["data"]["text/plain"]
