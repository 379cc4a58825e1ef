"""Cells behave as in a terminal, through a real kernel driven by jupyter_client: commands see a
terminal, output shows line by line in the order written, colours pass, prompts become the notebook's
input requests (answered with `kc.input`), Stop ends an open prompt, and `%terminal` / `%stderr`
change how a shell's commands run. The tests that depend on the sandbox run on both the local
provider and the default (bubblewrap) one. Two slow tests answer prompts in the real front ends:
`jupyter console` in a pty, and JupyterLab's input box in Chromium."""

from __future__ import annotations

import hashlib
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from .conftest import DEFAULT_KERNEL_NAME, KERNEL_NAME, require_bwrap
from .kernel_session import CellRun, KernelSession
from .test_kernel_console import open_console  # noqa: F401 - the fixture, for the console test
from .test_runner_terminal import first_line_program

NO_STDIN_NOTE = "[stdin is not available in this run: read got end-of-input]"


@pytest.fixture(scope="module", params=[KERNEL_NAME, DEFAULT_KERNEL_NAME], ids=["local", "bwrap"])
def kernel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    if request.param == DEFAULT_KERNEL_NAME:
        require_bwrap()
    session = KernelSession(tmp_path_factory.mktemp("terminal-ws"), kernel_name=request.param)
    session.run("true")  # the sandbox is up and its first-cell notes are out of the way
    try:
        yield session
    finally:
        session.close()


def streams(run: CellRun) -> list[tuple[str, str]]:
    return [(m["content"]["name"], m["content"]["text"]) for m in run.outputs if m["msg_type"] == "stream"]


def run_answering(kernel: KernelSession, code: str, answers: list[str],
                  timeout: float = 60) -> tuple[CellRun, list[dict[str, Any]]]:
    """Run a cell whose client answers input requests with `answers`, in order (as JupyterLab's input
    box or the console would); the cell's run and the input requests it got."""
    msg_id = kernel.send(code, allow_stdin=True)
    requests: list[dict[str, Any]] = []
    failures: list[BaseException] = []

    def answer() -> None:
        try:
            for value in answers:
                request = kernel.kc.get_stdin_msg(timeout=timeout)
                requests.append(request)
                kernel.kc.input(value)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    answerer = threading.Thread(target=answer, daemon=True)
    answerer.start()
    run = kernel.collect(msg_id, timeout=timeout)
    answerer.join(timeout)
    assert not failures, failures
    return run, requests


def no_more_stdin(kernel: KernelSession) -> None:
    with pytest.raises(Exception):  # noqa: B017 - queue.Empty, whichever queue module it comes from
        kernel.kc.get_stdin_msg(timeout=0.3)


# -- a terminal ---------------------------------------------------------------------------------

def test_stdin_stdout_and_stderr_are_terminals(kernel):
    run = kernel.run("test -t 0 && test -t 1 && test -t 2 && echo all-terminals")
    assert run.status == "ok", run.outputs
    assert run.text() == "all-terminals\n"


def test_a_program_that_buffers_on_pipes_shows_each_line_as_it_prints_it(kernel):
    """The program prints its second line only once the notebook has seen the first: a Python that held
    "one" back (as it does on a pipe) waits in vain and says so, whatever the machine's load."""
    seen_one = kernel.workspace / f"seen-one-{uuid.uuid4().hex[:8]}"

    def on_output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and "one" in msg["content"]["text"]:
            seen_one.touch()

    program = kernel.workspace / f"first_line_{uuid.uuid4().hex[:8]}.py"
    program.write_text(first_line_program(seen_one))
    msg_id = kernel.send(f"unset PYTHONUNBUFFERED; python3 {program}")
    run = kernel.collect(msg_id, on_output=on_output)
    assert run.status == "ok" and run.text() == "one\ntwo\n", run.outputs


def test_ls_colours_its_listing(kernel):
    folder = kernel.workspace / "colours"
    (folder / "subfolder").mkdir(parents=True, exist_ok=True)
    (folder / "file.txt").write_text("x")
    run = kernel.run("ls --color=auto colours")
    assert run.status == "ok"
    assert "\x1b[" in run.text() and "subfolder" in run.text() and "file.txt" in run.text()
    assert "\x1b[0m" in run.text() or "\x1b[m" in run.text()


def test_cursor_movement_and_titles_are_reduced_and_colours_kept(kernel):
    run = kernel.run(r"printf '\033]0;title\007\033[?25lstep\033[K\r\033[32mdone\033[0m\033[?25h\n'")
    assert run.text() == "step\r\x1b[32mdone\x1b[0m\n"


def test_output_keeps_the_order_stdout_and_stderr_were_written_in(kernel):
    """Two terminals are two queues: when the box is slow to read (a loaded machine), a line on one can
    come before a line written earlier on the other, so the exact order is `%stderr merge`'s promise
    (tested below). Here: every line once, and most pairs as written; grouping by stream anywhere on
    the way (a batch of each stream in turn) would leave next to none together. (A quiet machine keeps
    them; six test workers beside a CPU hog on each core kept 125 of 200.)"""
    run = kernel.run('for i in $(seq 200); do echo "out $i"; echo "err $i" >&2; sleep 0.001; done', timeout=120)
    assert run.status == "ok"
    lines = [(name, line) for name, text in streams(run) for line in text.splitlines()]
    expected = [(name, f"{word} {i}") for i in range(1, 201) for name, word in (("stdout", "out"), ("stderr", "err"))]
    assert sorted(lines) == sorted(expected)
    together = sum(1 for i in range(len(lines) - 1)
                   if lines[i][0] == "stdout" and lines[i + 1] == ("stderr", "err " + lines[i][1][4:]))
    assert together >= 50, (together, lines)  # grouping by stream leaves next to none; a loaded box splits some


# -- prompts ------------------------------------------------------------------------------------

def test_a_prompt_is_answered_through_the_stdin_channel_and_shown_once(kernel):
    run, requests = run_answering(kernel, "read -p 'Your name? ' n; echo \"hello $n\"", ["Ada"])
    assert run.status == "ok", run.outputs
    assert len(requests) == 1
    assert requests[0]["content"] == {"prompt": "Your name? ", "password": False}
    assert requests[0]["parent_header"]["msg_id"] == run.reply["parent_header"]["msg_id"]
    assert run.text() == "hello Ada\n"
    assert "Your name?" not in run.text() + run.text("stderr")
    no_more_stdin(kernel)


def test_a_silent_read_asks_for_a_password(kernel):
    run, requests = run_answering(kernel, "read -s -p 'pw: ' p; echo ${#p}", ["secret"])
    assert requests[0]["content"] == {"prompt": "pw: ", "password": True}
    assert run.text() == "6\n" and "secret" not in run.text() + run.text("stderr")


def test_two_reads_in_one_cell_are_two_requests(kernel):
    run, requests = run_answering(kernel, "python3 -c \"print(input('a? ')); print(input('b? '))\"", ["1", "2"])
    assert [r["content"]["prompt"] for r in requests] == ["a? ", "b? "]
    assert run.status == "ok" and run.text() == "1\n2\n"
    no_more_stdin(kernel)


def test_ctrl_d_is_end_of_input(kernel):
    run, requests = run_answering(kernel, "read -p 'more? ' x || echo got-eof", ["\x04"])
    assert len(requests) == 1 and run.text() == "got-eof\n"


def test_without_stdin_a_read_ends_at_once_with_a_note(kernel):
    started = time.monotonic()
    run = kernel.run("read -p 'Your name? ' n || echo \"no answer [$n]\"", timeout=30)
    assert time.monotonic() - started < 10
    assert run.status == "ok" and "no answer []" in run.text()
    assert NO_STDIN_NOTE in run.notes() and NO_STDIN_NOTE not in run.text("stderr") + run.text()
    no_more_stdin(kernel)


def test_stop_during_a_prompt_ends_the_command_and_the_request(kernel):
    kernel.run("export BEFORE_STOP=kept")
    msg_id = kernel.send("read -p 'waiting? ' x; echo not-reached", allow_stdin=True)
    request = kernel.kc.get_stdin_msg(timeout=30)
    assert request["content"]["prompt"] == "waiting? "
    asked = time.monotonic()
    kernel.km.interrupt_kernel()
    run = kernel.collect(msg_id, timeout=30)
    assert time.monotonic() - asked < 5
    assert run.status == "error" and run.reply["content"]["ename"] == "Interrupted"
    assert "not-reached" not in run.text()
    kernel.kc.input("too late")  # the user answers the old box after all: nothing reads it
    assert kernel.run("echo $BEFORE_STOP").text() == "kept\n"
    again, requests = run_answering(kernel, "read -p 'again? ' y; echo \"[$y]\"", ["fresh"])
    assert [r["content"]["prompt"] for r in requests] == ["again? "] and again.text() == "[fresh]\n"


GETPASS = "python3 -c 'import getpass; print(len(getpass.getpass(\"Secret: \")))'"


def test_getpass_asks_for_a_password_and_gets_the_answer(kernel):
    run, requests = run_answering(kernel, GETPASS, ["hunter2"])
    assert [r["content"] for r in requests] == [{"prompt": "Secret: ", "password": True}]
    assert run.status == "ok" and run.text().endswith("7\n") and "hunter2" not in run.text() + run.text("stderr")
    no_more_stdin(kernel)


def test_getpass_unattended_gets_end_of_input_and_fails_with_its_own_error(kernel):
    run = kernel.run(GETPASS, timeout=60)
    assert run.status == "error" and run.error["ename"] == "ExitStatus", run.outputs  # not SandboxUnreachable
    assert NO_STDIN_NOTE in run.notes() and "EOFError" in run.text("stderr")
    no_more_stdin(kernel)


def test_a_read_of_dev_tty_is_a_prompt(kernel):
    run, requests = run_answering(kernel, "read x </dev/tty; echo \"[$x]\"", ["Ada"])
    assert len(requests) == 1 and run.text() == "[Ada]\n"
    unattended = kernel.run("read x </dev/tty; echo \"[$x]\"")
    assert unattended.text() == "[]\n" and NO_STDIN_NOTE in unattended.notes()


def test_a_line_on_stderr_is_never_cut_by_stdout(kernel):
    """200 runs of `ls` failing (it writes its message in pieces) with a line on stdout after each."""
    for _ in range(5):
        run = kernel.run("for i in $(seq 40); do ls /no-such-$i; echo out$i; done", timeout=60)
        shown = streams(run)
        for (name, text), (after, _) in zip(shown, shown[1:], strict=False):
            assert name == after or text.endswith("\n"), shown
        # a line may come in two stderr messages in a row (shown as one, as JupyterLab joins them); the
        # stream changes only after a newline (above), so stderr's texts together are whole lines
        errors = "".join(text for name, text in shown if name == "stderr").splitlines()
        whole = re.compile(r"ls: cannot access '/no-such-\d+': No such file or directory")
        assert all(whole.fullmatch(line) for line in errors), errors
        assert len(errors) == 40 and run.text() == "".join(f"out{i}\n" for i in range(1, 41))


def test_job_notices_are_notes_and_exit_says_nothing_on_stderr(fresh_kernel):
    started = fresh_kernel.run("sleep 300 &\necho \"started $!\"")
    pid = started.text().split()[-1]
    assert f"[1] {pid}" in started.notes() and started.text("stderr") == ""
    fresh_kernel.run("kill %1")
    own = fresh_kernel.run("echo '[1] 32' >&2")
    assert own.text("stderr") == "[1] 32\n" and "[1] 32" not in own.notes()
    ended = fresh_kernel.run("echo bye; exit 3")
    assert ended.text() == "bye\n" and ended.text("stderr") == "" and ended.error["ename"] == "ShellExited"


# -- %terminal and %stderr ------------------------------------------------------------------------

def test_stderr_merged_is_one_stream_in_the_exact_order(fresh_kernel):
    assert fresh_kernel.run("%stderr merge").status == "ok"
    run = fresh_kernel.run('for i in $(seq 100); do echo "out $i"; echo "err $i" >&2; done')
    assert run.text() == "".join(f"out {i}\nerr {i}\n" for i in range(1, 101))
    assert [name for name, _ in streams(run)] == ["stdout"] * len(streams(run))
    assert "stderr merge" in fresh_kernel.run("%stderr").text()
    assert fresh_kernel.run("%stderr apart").status == "ok"
    apart = fresh_kernel.run("echo out; echo err >&2")
    assert apart.text() == "out\n" and apart.text("stderr") == "err\n"


def test_terminal_off_gives_pipes_and_exact_bytes(fresh_kernel):
    assert fresh_kernel.run("%terminal off").status == "ok"
    assert fresh_kernel.run("test -t 1 || echo pipe").text() == "pipe\n"
    run = fresh_kernel.run("head -c 100000 /dev/urandom | base64 | tee data.b64; sha256sum data.b64 >&2")
    assert run.status == "ok"
    assert hashlib.sha256(run.text().encode()).hexdigest() == run.text("stderr").split()[0]
    assert Path(fresh_kernel.workspace / "data.b64").read_text() == run.text()


def test_terminal_settings_are_per_shell_and_have_a_size(fresh_kernel):
    shown = fresh_kernel.run("%terminal")  # printed, as every magic's answer, never Out[n]
    assert shown.text() == "shell 'main': on a 120x50 terminal; stderr apart\n" and not shown.of_type("execute_result")
    assert fresh_kernel.run("stty size").text() == "50 120\n"
    assert fresh_kernel.run("%terminal cols 80 rows 20").status == "ok"
    assert fresh_kernel.run("stty size; tput cols").text() == "20 80\n80\n"
    assert fresh_kernel.run("%terminal off").status == "ok"
    assert fresh_kernel.run("%%shell side\ntest -t 1 && echo side-has-a-terminal").text() == "side-has-a-terminal\n"
    assert fresh_kernel.run("test -t 1 || echo main-has-pipes").text() == "main-has-pipes\n"
    assert fresh_kernel.run("%terminal").text() == "shell 'main': on pipes, exact bytes (terminal off); stderr apart\n"
    assert fresh_kernel.run("%terminal on").status == "ok"
    assert fresh_kernel.run("stty size").text() == "20 80\n"  # the size is kept while off
    bad = fresh_kernel.run("%terminal cols wide")
    assert bad.status == "error" and "whole number" in bad.error["evalue"]
    assert "usage: %terminal" in fresh_kernel.run("%terminal --help").text()
    assert "usage: %stderr" in fresh_kernel.run("%stderr --help").text()


# -- in a terminal front end ------------------------------------------------------------------------

@pytest.mark.system
@pytest.mark.slow
def test_a_prompt_is_typed_in_the_console(open_console) -> None:  # noqa: F811 - the imported fixture
    """`jupyter console` answers input requests by reading a line (getpass for a password)."""
    console = open_console()
    # The prompts are spelled through a variable so that the echoed command line never matches them:
    # text typed before the input request arrives is lost (getpass flushes pending input).
    console.child.send("q=name; read -p \"Your $q? \" n; echo \"hello $n\"\r")
    console.count += 1
    console.child.expect("Your name\\? ")
    console.child.send("Ada\r")
    console.child.expect("hello Ada")
    console.expect_prompt()
    console.child.send("w=w; read -s -p \"p$w: \" p; echo \"length ${#p}\"\r")
    console.count += 1
    console.child.expect("pw: ")
    console.child.send("secret\r")
    shown = console.expect_prompt()
    assert "length 6" in shown and "secret" not in shown
    console.child.send("python3 -c 'import getpass; print(\"getpass\", len(getpass.getpass()))'\r")
    console.count += 1
    console.child.expect("Password: ")
    console.child.send("hunter2\r")
    shown = console.expect_prompt()
    assert "getpass 7" in shown and "hunter2" not in shown


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.timeout(600)  # a hang guard (155 s with two test runs at once); its waits scale with the load
def test_a_prompt_opens_an_input_box_in_jupyterlab_and_stop_ends_it(tmp_path: Path) -> None:
    """JupyterLab in Chromium: a prompt becomes the input box under the cell (a password box for
    `read -s`), what is typed there reaches the command, and ■ ends a cell waiting at its box."""
    from playwright.sync_api import expect

    from .lab_browser import STDOUT, code_cell, lab_in_chromium, notebook_for_test_kernel, stop_from_toolbar

    sources = ["read -p 'Your name? ' n; echo \"hello $n\"", "read -s -p 'pw: ' p; echo \"length ${#p}\"",
               "read -p 'stop me? ' x; echo not-reached", "echo after-stop",
               "python3 -c 'import getpass; print(\"getpass\", len(getpass.getpass()))'"]
    with lab_in_chromium(tmp_path, "jupyterlab-prompts.png") as (lab, page):
        notebook = notebook_for_test_kernel(lab.root, "prompts.ipynb", {
            "cells": [code_cell(source) for source in sources], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
        lab.open(page, "prompts.ipynb")
        display_name = notebook["metadata"]["kernelspec"]["display_name"]
        expect(page.locator("#jp-main-statusbar").get_by_text(f"{display_name} | Idle")).to_be_visible(timeout=60_000)
        cells = page.locator(".jp-NotebookPanel .jp-Notebook .jp-CodeCell")

        def run(index: int) -> Any:
            cells.nth(index).locator(".jp-InputPrompt").click()
            page.keyboard.press("Shift+Enter")
            return cells.nth(index)

        cell = run(0)
        box = cell.locator(".jp-Stdin")
        expect(box.locator(".jp-Stdin-prompt")).to_have_text("Your name?")
        box.locator(".jp-Stdin-input").fill("Ada")
        box.locator(".jp-Stdin-input").press("Enter")
        expect(cell.locator(STDOUT).filter(has_text="hello")).to_have_text("hello Ada")
        # JupyterLab keeps the answered prompt as a line of output; the kernel did not print it too
        expect(cell.locator(STDOUT)).to_have_text(["Your name? Ada", "hello Ada"])

        cell = run(1)
        field = cell.locator(".jp-Stdin .jp-Stdin-input")
        expect(field).to_have_attribute("type", "password")
        field.fill("secret")
        field.press("Enter")
        expect(cell.locator(STDOUT).filter(has_text="length")).to_have_text("length 6")
        expect(cell.locator(STDOUT).first).to_have_text(re.compile(r"^pw: +·+\s*$"))  # the answer hidden
        expect(cell.locator(STDOUT).filter(has_text="secret")).to_have_count(0)

        cell = run(2)
        expect(cell.locator(".jp-Stdin .jp-Stdin-prompt")).to_have_text("stop me?")
        stop_from_toolbar(page, cell)
        cell = run(3)
        expect(cell.locator(STDOUT)).to_have_text("after-stop")

        cell = run(4)  # getpass reads /dev/tty, not stdin: a password box all the same
        field = cell.locator(".jp-Stdin .jp-Stdin-input")
        expect(cell.locator(".jp-Stdin .jp-Stdin-prompt")).to_have_text("Password:")
        expect(field).to_have_attribute("type", "password")
        field.fill("hunter2")
        field.press("Enter")
        expect(cell.locator(STDOUT).filter(has_text="getpass")).to_have_text("getpass 7")
