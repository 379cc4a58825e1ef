"""Tab completion and Shift-Tab inspection through a real kernel: what cells defined (functions,
aliases), owdisplay, options from bash-completion, and a shell left exactly as it was."""

from __future__ import annotations

import os

import pytest

from .kernel_session import KernelSession

BASH_COMPLETION = "/usr/share/bash-completion/bash_completion"


@pytest.fixture(scope="module")
def kernel(module_kernel):
    return module_kernel


def matches(kernel: KernelSession, code: str) -> list[str]:
    kernel.kc.complete(code, len(code))
    return kernel.kc.get_shell_msg(timeout=10)["content"]["matches"]


def inspected(kernel: KernelSession, code: str, cursor: int | None = None) -> str:
    kernel.kc.inspect(code, len(code) if cursor is None else cursor)
    reply = kernel.kc.get_shell_msg(timeout=10)["content"]
    return reply["data"].get("text/plain", "") if reply["found"] else ""


def test_functions_and_aliases_that_cells_define_complete_and_inspect(kernel):
    assert kernel.run("greet_user() { echo hi; }\nalias llx='ls -l'").status == "ok"
    assert "greet_user" in matches(kernel, "gree")
    assert "llx" in matches(kernel, "ll")
    assert "owdisplay" in matches(kernel, "owdisp")
    shown = inspected(kernel, "greet_user")
    assert "greet_user is a function" in shown and "echo hi" in shown
    assert "llx is aliased to `ls -l'" in inspected(kernel, "llx")
    assert kernel.run("unset -f greet_user; unalias llx").status == "ok"
    assert "greet_user" not in matches(kernel, "gree") and "llx" not in matches(kernel, "ll")
    assert inspected(kernel, "greet_user") == ""


def test_owdisplay_inspects_as_its_help(kernel):
    shown = inspected(kernel, "owdisplay x.png", 3)
    assert shown.startswith("usage: owdisplay FILE [--mime TYPE] [--id ID]") and "--mime takes: image/png" in shown
    assert "every shell" in shown
    kernel.run("%shell redefines")
    try:
        assert kernel.run("owdisplay() { echo mine; }").status == "ok"  # redefined: shown as it now is
        assert "echo mine" in inspected(kernel, "owdisplay")
    finally:
        kernel.run("%shell main")
    assert "every shell" in inspected(kernel, "owdisplay")  # each shell has its own


def test_completion_leaves_status_and_output_of_the_shell_alone(kernel):
    failed = kernel.run("tracked_fn() { :; }; (exit 3)")
    assert failed.status == "error"
    assert "tracked_fn" in matches(kernel, "tracked")  # the shell is idle: it writes its definitions
    assert "tracked_fn" in inspected(kernel, "tracked_fn")
    after = kernel.run('echo "status=$?"')
    assert after.text() == "status=3\n" and after.text("stderr") == ""
    traced = kernel.run("set -x")
    assert traced.status == "ok"
    try:
        assert "tracked_fn" in matches(kernel, "tracked")
        later = kernel.run("echo plain")
        assert "plain\n" in later.text() and "declare" not in later.text("stderr") + later.text()
    finally:
        kernel.run("set +x")


def test_completion_while_a_cell_runs_knows_what_earlier_cells_defined(kernel):
    assert kernel.run("busy_helper() { echo from-helper; }; alias busyal=true").status == "ok"
    assert "busy_helper" in matches(kernel, "busy_")  # a Tab between the cells, on the idle shell
    msg_id = kernel.send("echo started; sleep 3; echo ended")
    kernel.wait_for(lambda m: m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream"
                    and "started" in m["content"]["text"], what="the cell's first line")
    reply = kernel.control("complete_request", {"code": "busy_", "cursor_pos": 5})
    assert reply["content"]["matches"] == ["busy_helper"]
    assert kernel.control("complete_request", {"code": "busya", "cursor_pos": 5})["content"]["matches"] == ["busyal"]
    shown = kernel.control("inspect_request", {"code": "busy_helper", "cursor_pos": 4, "detail_level": 0})
    assert "from-helper" in shown["content"]["data"]["text/plain"]
    run = kernel.collect(msg_id)  # its first line was read above
    assert run.status == "ok" and run.text() == "ended\n"


@pytest.mark.skipif(not os.path.exists(BASH_COMPLETION) and not os.environ.get("CI"),
                    reason="bash-completion is not installed (CI installs it)")
def test_options_complete_from_bash_completion(kernel, module_workspace):
    (module_workspace / "--colour-file").write_text("")  # a path that matches is offered as a path
    assert "--color" in matches(kernel, "ls --col")
    assert "--color" in matches(kernel, "echo x; ls -l --col")
    offered = matches(kernel, "ls --colo")
    assert offered[0] == "--colour-file" and "--color" in offered
    assert "--color" in matches(kernel, "grep -r --col")
    assert matches(kernel, "cat ./--col") == ["./--colour-file"]
