"""The kernel through jupyter_client: cells, live output, Stop, errors, magics, owdisplay, limits."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import re
import signal
import struct
import subprocess
import tempfile
import time
import uuid
import zlib
from pathlib import Path

import pytest

from .kernel_session import KERNEL_NAME, KernelSession
from .processes import children, command_line, wait_for_file, wait_gone
from .waiting import patience, shell_waits_for


@pytest.fixture(scope="module")
def kernel(module_kernel):
    return module_kernel


def png_bytes(width: int = 2, height: int = 2) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


# -- kernel_info and plain cells ----------------------------------------------------------------

def test_kernel_info_describes_bash_and_the_sandbox(kernel):
    kernel.kc.kernel_info()
    info = kernel.kc.get_shell_msg(timeout=10)["content"]
    language = info["language_info"]
    assert (language["name"], language["mimetype"], language["file_extension"]) == ("bash", "text/x-sh", ".sh")
    assert language["codemirror_mode"] == "shell" and language["pygments_lexer"] == "bash"
    assert "provider local" in info["banner"] and "no isolation" in info["banner"]
    assert "debugger" not in info.get("supported_features", [])


def test_the_first_cell_says_where_commands_run_once_and_not_on_stderr(fresh_kernel):
    first = fresh_kernel.run("%ls")  # a magic first: the line comes all the same
    assert first.notes().startswith("[sandbox: local · no isolation") and first.notes().count("\n") == 1
    assert first.text("stderr") == ""
    later = fresh_kernel.run("echo hi")
    assert later.notes() == "" and later.text() == "hi\n"


def test_stdout_and_stderr_arrive_apart_and_live(kernel):
    """Each line reaches the notebook while the command still runs, on its own stream. The command
    prints its next line only once the test has seen the last one: the two streams are two terminals,
    read as two queues, so lines printed 0.2 s apart could cross on a machine busy enough."""
    seen = Path(tempfile.mkdtemp(dir=kernel.workspace, prefix="seen-"))

    def on_output(msg: dict) -> None:
        if msg["msg_type"] == "stream":
            (seen / msg["content"]["text"].strip()).touch()

    wait = f"until [ -e {seen}/$1 ]; do sleep 0.01; done"
    msg_id = kernel.send(f"after() {{ {wait}; }}; echo out-1; after out-1; echo err-1 >&2; after err-1; echo out-2")
    run = kernel.collect(msg_id, on_output=on_output)
    assert run.status == "ok"
    streams = [(m["content"]["name"], m["content"]["text"]) for m in run.outputs if m["msg_type"] == "stream"]
    assert streams == [("stdout", "out-1\n"), ("stderr", "err-1\n"), ("stdout", "out-2\n")]


def test_quick_mixed_output_is_split_by_stream_from_the_record(kernel):
    run = kernel.run("echo a; echo b >&2; echo c")
    assert run.text("stdout") == "a\nc\n" and run.text("stderr").endswith("b\n")


def test_live_output_arrives_while_the_cell_runs(kernel):
    """The cell prints "two" only once the notebook has been shown "one": output held back to the cell's
    end would leave it waiting in vain, and it says so."""
    seen = kernel.workspace / f"seen-{uuid.uuid4().hex[:8]}"

    def on_output(msg: dict) -> None:
        if msg["msg_type"] == "stream" and "one" in msg["content"]["text"]:
            seen.touch()

    msg_id = kernel.send(f"echo one; {shell_waits_for(seen, 20, 0.02)}; "
                         f"[ -e {seen} ] && echo two || echo one was never seen")
    run = kernel.collect(msg_id, on_output=on_output)
    assert run.text() == "one\ntwo\n"


def test_a_partial_line_and_carriage_returns_and_colour_pass_through(kernel):
    run = kernel.run("printf 'progress 10%%\\rprogress 100%%\\n\\033[31mred\\033[0m'")
    assert run.text() == "progress 10%\rprogress 100%\n\x1b[31mred\x1b[0m"


def test_the_output_rate_takes_a_size_or_off_and_says_what_is_wrong(kernel):
    for wrong, said in (("fast", "%output rate takes a size such as 4M or 200000, not 'fast'"),
                        ("-5", "%output rate takes bytes a second (or off), not -5")):
        run = kernel.run(f"%output rate {wrong}")
        assert run.reply["content"]["ename"] == "UsageError" and run.reply["content"]["evalue"] == said
    assert kernel.run("%output rate 2M").text() == "output rate: 2,000,000 bytes a second, then a live tail\n"
    assert kernel.run("%output").text().endswith("output rate: 2,000,000 bytes a second, then a live tail\n")
    kernel.run("%output rate 500k")


def test_no_line_is_lost_in_300k_lines(kernel):
    """Every line streamed, with no Jupyter server between to pace for (%output rate off)."""
    assert kernel.run("%output rate off").text() == "output rate: not paced\n"
    try:
        run = kernel.run("seq 1 300000", timeout=120)
    finally:
        kernel.run("%output rate 500k")
    assert run.status == "ok"
    assert run.text() == "".join(f"{i}\n" for i in range(1, 300001))


def test_state_persists_between_cells(kernel, module_workspace):
    (module_workspace / "inner").mkdir(exist_ok=True)
    assert kernel.run("cd inner && export COLOR=teal && count=3").status == "ok"
    assert kernel.run("echo $COLOR $count ${PWD##*/}").text() == "teal 3 inner\n"
    kernel.run("cd ..")


def test_a_failing_command_is_an_error_with_exactly_one_error_output(kernel):
    run = kernel.run("echo before; ls /no/such/place")
    assert run.status == "error"
    assert run.reply["content"]["ename"] == "ExitStatus"
    assert run.error["ename"] == "ExitStatus" and "status 2" in run.error["evalue"]
    assert run.text("stdout") == "before\n" and "No such file" in run.text("stderr")
    assert kernel.run("echo next").text() == "next\n"


def test_the_next_cell_sees_the_status_the_failing_one_left(kernel):
    assert kernel.run("ls /no/such/place").status == "error"
    assert kernel.run("%ls").status == "ok"  # a magic runs no shell command: `$?` is untouched
    assert kernel.run("echo $?").text() == "2\n"


def test_what_a_background_job_printed_after_its_cell_shows_in_the_next_cell(kernel, module_workspace):
    marker = module_workspace / "job-printed"
    assert kernel.run(f"(sleep 0.2; echo from the job; touch {marker}) &").status == "ok"
    wait_for_file(marker)
    assert kernel.run("echo from the cell").text("stdout") == "from the job\nfrom the cell\n"


def test_an_empty_cell_is_fine(kernel):
    assert kernel.run("   \n").status == "ok"


# -- Stop ---------------------------------------------------------------------------------------

def _wait_for_text(kernel: KernelSession, msg_id: str, text: str) -> list[dict]:
    seen: list[dict] = []
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id:
            seen.append(msg)
            if msg["msg_type"] == "stream" and text in msg["content"]["text"]:
                return seen


def test_stop_by_message_ends_the_command_and_keeps_the_shell(kernel):
    kernel.run("export KEEP=kept; FOLDER_BEFORE=$PWD")
    msg_id = kernel.send("echo started; sleep 60")
    _wait_for_text(kernel, msg_id, "started")
    asked = time.monotonic()
    kernel.km.interrupt_kernel()  # interrupt_mode "message": an interrupt_request on control
    run = kernel.collect(msg_id)
    assert time.monotonic() - asked < patience(2)  # the `sleep 60` was ended, not waited for
    assert run.status == "error" and run.reply["content"]["ename"] == "Interrupted"
    assert kernel.run('echo $KEEP; [ "$PWD" = "$FOLDER_BEFORE" ] && echo same-folder').text() == "kept\nsame-folder\n"


def test_a_stop_sent_right_after_the_cell_ends_it_whenever_it_lands(kernel):
    """interrupt_request right after execute_request: it may reach the kernel before the cell does
    (control and shell are two channels), while the cell waits to start its command, or while the box
    starts it; every time the cell ends as interrupted at once, and the shell stays as it was."""
    kernel.run("export KEEP=kept")
    said: dict[str, int] = {}
    for _ in range(10):
        msg_id = kernel.send("sleep 30")
        kernel.km.interrupt_kernel()  # at once: an interrupt_request on control
        run = kernel.collect(msg_id, timeout=20)  # the command would take 30 s
        assert run.status == "error" and run.reply["content"]["ename"] == "Interrupted", run.reply["content"]
        evalue = run.reply["content"]["evalue"]
        said[evalue] = said.get(evalue, 0) + 1
    assert set(said) <= {"interrupted by user", "interrupted by user before it started: nothing ran"}, said
    assert kernel.run("echo $KEEP").text() == "kept\n"
    print(f"[stop] through the kernel: {said}")


def test_stop_by_signal_ends_the_command_too(kernel):
    kernel.run("export STILL=yes")
    msg_id = kernel.send("echo started; while true; do :; done")
    _wait_for_text(kernel, msg_id, "started")
    os.kill(kernel.pid, signal.SIGINT)  # what a client with interrupt_mode "signal" does
    run = kernel.collect(msg_id)
    assert run.reply["content"]["ename"] == "Interrupted"
    assert kernel.run("echo $STILL").text() == "yes\n"


def test_a_cell_timeout_stops_the_command_and_reports_it(kernel):
    assert kernel.run("%timeout 0.5").status == "ok"
    try:
        run = kernel.run("echo waiting; sleep 30")
    finally:
        kernel.run("%timeout off")
    assert run.status == "error" and run.error["ename"] == "TimedOut"
    assert "waiting" in run.text()
    assert kernel.run("echo after").text() == "after\n"


# -- is_complete, complete, inspect -------------------------------------------------------------

def test_is_complete_is_answered_locally(kernel):
    for code, status in (("echo hi", "complete"), ("if true; then", "incomplete"), ("echo 'open", "incomplete"),
                         ("fi", "invalid")):
        kernel.kc.is_complete(code)
        assert kernel.kc.get_shell_msg(timeout=5)["content"]["status"] == status, code


def test_completion_offers_commands_paths_variables_and_magics(kernel, module_workspace):
    (module_workspace / "alpha-file.txt").write_text("x")
    (module_workspace / "alpha-dir").mkdir(exist_ok=True)
    kernel.run("export OWS_COMPLETE_ME=1; MY_LOCAL_VAR=2")

    def matches(code: str) -> list[str]:
        kernel.kc.complete(code, len(code))
        return kernel.kc.get_shell_msg(timeout=10)["content"]["matches"]

    assert "echo" in matches("ech")
    assert matches("cat alpha") == ["alpha-dir/", "alpha-file.txt"]
    assert "$OWS_COMPLETE_ME" in matches("echo $OWS_COMP") and "$MY_LOCAL_VAR" in matches("echo $MY_LOC")
    assert matches("%she") == ["%shell", "%shells"]
    assert matches("%read alpha-f") == ["alpha-file.txt"]


def test_completion_is_answered_while_a_cell_runs(kernel):
    """The cell runs until the test has its answers (at most 60 s): answers held back until the cell
    ended would leave the test waiting past the control channel's 10 s."""
    go = kernel.workspace / f"answered-{uuid.uuid4().hex[:8]}"
    msg_id = kernel.send(f"echo started; {shell_waits_for(go)}")
    _wait_for_text(kernel, msg_id, "started")
    try:
        reply = kernel.control("complete_request", {"code": "%sand", "cursor_pos": 5})
        assert reply["content"]["matches"] == ["%sandbox"]
        shells = kernel.control("execute_request", {"code": "%shells", "silent": False})  # on control: not busy-blocked
        assert shells["content"]["status"] == "ok" and not go.exists()
    finally:
        go.touch()
    kernel.collect(msg_id)


def test_inspect_describes_the_word_at_the_cursor(kernel):
    kernel.kc.inspect("cd /tmp", 1)
    reply = kernel.kc.get_shell_msg(timeout=10)["content"]
    assert reply["found"] is True and "builtin" in reply["data"]["text/plain"]
    kernel.kc.inspect("%read x", 2)
    assert "--lines" in kernel.kc.get_shell_msg(timeout=10)["content"]["data"]["text/plain"]


# -- magics -------------------------------------------------------------------------------------

def test_write_and_read_with_a_precondition(kernel, module_workspace):
    written = kernel.run("%%write notes/today.txt\nfirst line\nsecond line")
    sha = hashlib.sha256(b"first line\nsecond line\n").hexdigest()
    assert written.status == "ok" and sha in written.text()
    assert (module_workspace / "notes" / "today.txt").read_text() == "first line\nsecond line\n"
    assert kernel.run("%read notes/today.txt").text() == "first line\nsecond line\n"
    assert kernel.run("%read notes/today.txt --lines 2:2").text() == "second line\n"
    stale = kernel.run("%%write notes/today.txt --if-match " + "0" * 64 + "\nreplaced")
    assert stale.status == "error" and "changed since it was read" in stale.error["evalue"]
    assert (module_workspace / "notes" / "today.txt").read_text() == "first line\nsecond line\n"
    fresh = kernel.run(f"%%write notes/today.txt --if-match {sha}\nreplaced")
    assert fresh.status == "ok" and (module_workspace / "notes" / "today.txt").read_text() == "replaced\n"
    assert kernel.run("%write notes/one.txt just one line").status == "ok"
    assert (module_workspace / "notes" / "one.txt").read_text() == "just one line\n"
    assert kernel.run("%%write notes/one.txt --new\nagain").status == "error"


def test_read_pages_a_long_file_and_says_how_to_go_on(kernel, module_workspace):
    (module_workspace / "long.txt").write_text("".join(f"L{i}\n" for i in range(1, 1001)))
    run = kernel.run("%read long.txt")
    assert run.text().splitlines() == [f"L{i}" for i in range(1, 201)]
    assert "lines 1-200 of 1000" in run.notes() and "--lines 201:400" in run.notes()
    assert run.text("stderr") == ""  # the footer is the kernel's note, not the program's stderr
    assert kernel.run("%read long.txt --bytes 0:3").text() == "L1\n"


def test_read_shows_rich_files_by_type(kernel, module_workspace):
    (module_workspace / "pic.png").write_bytes(png_bytes())
    (module_workspace / "page.html").write_text("<b>bold</b>")
    (module_workspace / "data.json").write_text('{"k": [1, 2]}')
    (module_workspace / "doc.md").write_text("# Title")
    png = kernel.run("%read pic.png").of_type("display_data")[0]["data"]
    assert base64.b64decode(png["image/png"]) == png_bytes()
    page = kernel.run("%read page.html").of_type("display_data")[0]["data"]["text/html"]
    # in a frame where no script runs (tests/security/test_untrusted_output.py)
    assert page.startswith('<iframe sandbox="" ') and page.endswith('&lt;b&gt;bold&lt;/b&gt;"></iframe>')
    assert kernel.run("%read data.json").of_type("display_data")[0]["data"]["application/json"] == {"k": [1, 2]}
    assert kernel.run("%read doc.md").of_type("display_data")[0]["data"]["text/markdown"] == "# Title"


def test_listing_stat_and_search_show_text_and_html(kernel, module_workspace):
    (module_workspace / "found.txt").write_text("needle here\nnothing\nneedle again\n")
    listing = kernel.run("%ls").of_type("display_data")[0]["data"]
    assert "found.txt" in listing["text/plain"] and "<table>" in listing["text/html"]
    stat = kernel.run("%stat found.txt").of_type("display_data")[0]["data"]["text/plain"]
    assert hashlib.sha256(b"needle here\nnothing\nneedle again\n").hexdigest() in stat
    search = kernel.run("%search ^needle found.txt").of_type("display_data")[0]["data"]["text/plain"]
    assert "needle here" in search and "needle again" in search and "2 matches" in search
    assert kernel.run("%stat missing.txt").error["ename"] == "UsageError"


def test_shell_magics_switch_run_on_and_list_shells(kernel):
    assert kernel.run("%shell side").status == "ok"
    kernel.run("export WHERE=side; cd /")
    assert kernel.run("%shell main").status == "ok"
    assert kernel.run("echo [$WHERE]").text() == "[]\n"
    assert kernel.run("%%shell side\necho $WHERE $PWD").text() == "side /\n"
    listing = kernel.run("%shells").of_type("display_data")[0]["data"]["text/plain"]
    assert "* main" in listing and "side" in listing and "idle" in listing


def test_a_line_magic_can_be_followed_by_shell_lines(kernel):
    run = kernel.run("%shell other\necho on-$OWSANDBOX_SHELL")
    kernel.run("%shell main")
    assert run.text().endswith("on-other\n")


def test_sandbox_magic_sums_the_sandbox_up_and_has_every_detail_and_the_raw_description(kernel, module_workspace):
    shown = kernel.run("%sandbox").of_type("display_data")
    assert len(shown) == 1
    text = shown[0]["data"]["text/plain"]
    assert len(text.splitlines()) <= 25 and "<th" in shown[0]["data"]["text/html"]
    for row in ("Isolation", "Writes to", "Network", "Limits", "Shells", "Cell limits"):
        assert re.search(rf"^{row} +\S", text, re.M), (row, text)
    assert "none: commands run on this machine" in text
    assert re.search(rf"^Starts in +{re.escape(str(module_workspace))}$", text, re.M), text
    assert "4,000,000 characters" in text and "instance" not in text and "_" not in text.split("%sandbox")[0]
    every = kernel.run("%sandbox --all").of_type("display_data")[0]["data"]["text/plain"]
    for row in ("provider", "instance id", "restarts", "uptime", "socket", "output limit"):
        assert re.search(rf"^{row} +\S", every, re.M), (row, every)
    assert "instance_id" not in every and re.search(r"^uptime +[0-9.]+ s$", every, re.M)
    raw = kernel.run("%sandbox --json").of_type("display_data")[0]["data"]
    assert raw["application/json"]["provider"] == "local" and "instance_id" in raw["application/json"]
    assert json.loads(raw["text/plain"]) == raw["application/json"]
    assert "not allowed with argument" in kernel.run("%sandbox --all --json").error["evalue"]


def test_help_lists_every_magic_and_each_magic_has_help(kernel):
    listing = kernel.run("%magics").of_type("display_data")[0]["data"]["text/plain"]
    for name in ("%read", "%%write", "%write", "%ls", "%stat", "%search", "%shell", "%%shell", "%shells",
                 "%sandbox", "%timeout", "%output", "%help"):
        assert name in listing
    assert "usage: %read" in kernel.run("%read --help").text()


def test_bad_magic_use_gets_a_clear_error(kernel):
    assert "did you mean %read" in kernel.run("%raed x").error["evalue"]
    assert "the following arguments are required: path" in kernel.run("%read").error["evalue"]
    assert "not both" in kernel.run("%read x --lines 1:2 --bytes 0:1").error["evalue"]
    assert "whole numbers" in kernel.run("%read x --lines a:b").error["evalue"]
    assert "%%write" in kernel.run("%write").error["evalue"] or "required" in kernel.run("%write").error["evalue"]
    assert "not a line magic" in kernel.run("%shell").error["evalue"] or kernel.run("%shell").status == "error"
    assert "seconds" in kernel.run("%timeout soon").error["evalue"]
    assert "no such file" in kernel.run("%read nothing-here.txt").error["evalue"]


# -- owdisplay and the output limit -------------------------------------------------------------

def test_owdisplay_shows_a_file_and_updates_it_by_id(kernel, module_workspace):
    (module_workspace / "plot.png").write_bytes(png_bytes(2, 2))
    (module_workspace / "plot2.png").write_bytes(png_bytes(3, 3))
    first = kernel.run("echo before; owdisplay plot.png --id fig; echo after")
    assert first.text() == "before\nafter\n"
    shown = first.of_type("display_data")[0]
    assert base64.b64decode(shown["data"]["image/png"]) == png_bytes(2, 2)
    assert shown["transient"]["display_id"] == "owsandbox-box-fig"  # the box's ids: a namespace of their own
    order = [m["content"].get("text") or m["content"].get("transient", {}).get("display_id")
             for m in first.outputs if m["msg_type"] in ("stream", "display_data")]
    before, fig = order.index("before\n"), order.index("owsandbox-box-fig")  # (a dimmed note is display_data too)
    assert before < fig < order.index("after\n"), order  # shown in order
    second = kernel.run("owdisplay plot2.png --id fig")
    update = second.of_type("update_display_data")[0]
    assert base64.b64decode(update["data"]["image/png"]) == png_bytes(3, 3)
    assert update["transient"]["display_id"] == "owsandbox-box-fig"
    svg = kernel.run("echo '<svg xmlns=\"http://www.w3.org/2000/svg\"/>' > s.svg; owdisplay s.svg")
    assert "image/svg+xml" in svg.of_type("display_data")[0]["data"]
    assert kernel.run("owdisplay missing.png").status == "error"


def test_past_the_output_limit_the_notebook_is_told_where_the_rest_is(kernel):
    assert kernel.run("%output limit 100000").status == "ok"
    try:
        run = kernel.run("seq 1 200000", timeout=120)
    finally:
        kernel.run("%output limit 4M")
    shown = run.text()
    notices = run.notes()
    assert run.text("stderr") == ""
    assert shown.startswith("1\n2\n") and len(shown) < 110_000
    assert "output limit of 100000 characters reached" in notices
    log = notices.split("are in ", 1)[1].split(";", 1)[0]
    assert f"%read {log}" in notices
    assert shown.endswith("199999\n200000\n")  # the end of the output is shown after the notice
    assert Path(log).read_text() == "".join(f"{i}\n" for i in range(1, 200001))


# -- failures of the sandbox ----------------------------------------------------------------------

def test_a_cut_relay_during_a_cell_loses_and_repeats_nothing(fresh_kernel):
    fresh_kernel.run("true")
    msg_id = fresh_kernel.send("for i in $(seq 1 30); do echo line-$i; sleep 0.05; done")
    seen = _wait_for_text(fresh_kernel, msg_id, "line-")
    relays = [pid for pid in children(fresh_kernel.pid) if " attach " in command_line(pid)]
    assert relays
    for pid in relays:
        os.kill(pid, signal.SIGKILL)
    run = fresh_kernel.collect(msg_id)
    # What the wait read first is the start of the cell's output: a line or more (on a busy machine
    # one batch held line-1 and line-2).
    text = "".join(m["content"]["text"] for m in seen
                   if m["msg_type"] == "stream" and m["content"]["name"] == "stdout") + run.text()
    assert run.status == "ok"
    assert text == "".join(f"line-{i}\n" for i in range(1, 31))


def test_a_sandbox_restart_during_a_cell_is_reported_and_the_next_cell_works(fresh_kernel):
    (fresh_kernel.workspace / "deep").mkdir()
    daemon_pid = int(fresh_kernel.run("cd deep; export GONE=1; echo $PPID").text().strip().splitlines()[-1])
    msg_id = fresh_kernel.send("echo started; sleep 60")
    _wait_for_text(fresh_kernel, msg_id, "started")
    os.kill(daemon_pid, signal.SIGKILL)  # the sandbox goes away mid-command
    run = fresh_kernel.collect(msg_id)
    assert run.status == "error" and run.error["ename"] == "SandboxRestarted"
    assert "outcome of this command is unknown" in run.error["evalue"]
    after = fresh_kernel.run("echo [$GONE] ${PWD##*/}")
    assert after.text() == "[] deep\n"


def _described(kernel) -> dict:
    return kernel.run("%sandbox --json").of_type("display_data")[0]["data"]["application/json"]


def test_restart_gives_fresh_shells_and_shutdown_leaves_nothing(fresh_kernel):
    fresh_kernel.run("export BEFORE=1")
    old_daemon = int(fresh_kernel.run("echo $PPID").text().strip().splitlines()[-1])
    before = _described(fresh_kernel)
    assert before["kept"] is False
    fresh_kernel.restart(now=False)
    assert fresh_kernel.run("echo [$BEFORE]").text().endswith("[]\n")
    after = _described(fresh_kernel)  # the box kept, and %sandbox says so: its uptime goes on
    assert after["kept"] is True and after["instance_id"] == before["instance_id"]
    assert after["uptime_s"] >= before["uptime_s"]
    summary = fresh_kernel.run("%sandbox").of_type("display_data")[0]["data"]["text/plain"]
    assert "box kept from before the kernel's restart, up " in summary, summary
    new_daemon = int(fresh_kernel.run("echo $PPID").text().strip().splitlines()[-1])
    shell_pid = int(fresh_kernel.run("echo $$").text().strip().splitlines()[-1])
    fresh_kernel.run("sleep 300 &")
    assert new_daemon == old_daemon  # the sandbox lives on for the restarted kernel (fresh shells in it)
    fresh_kernel.close()
    assert wait_gone([old_daemon, new_daemon, shell_pid]) == []


def test_a_shut_down_kernel_exits_by_itself_and_is_never_killed(tmp_path):
    """After its shutdown reply the kernel's process must end on its own (status 0). ipykernel's
    control thread still publishes through IOPub then; had IOPub been stopped first at exit, it would
    wait in vain and the client would kill the kernel after 2.5 s, on about half of all shutdowns
    (every restart and every test kernel paid it). Four kernels, each first asked a magic."""
    statuses = []
    for round_ in range(4):
        folder = tmp_path / f"k{round_}"
        folder.mkdir()
        session = KernelSession(folder)
        try:
            assert session.run("%ls").status == "ok"
            process = session.km.provisioner.process
        finally:
            session.close()
        statuses.append(process.wait(10))
    assert statuses == [0, 0, 0, 0]


def test_two_cells_on_two_shells_run_at_the_same_time_in_subshells(kernel):
    subshell = kernel.control("create_subshell_request", {})["content"]["subshell_id"]
    try:
        # A meeting: each cell says it is there and waits for the other, which only cells running at the
        # same time both get past (one after the other, the first would wait its 20 s in vain).
        meet = kernel.workspace / f"meet-{uuid.uuid4().hex[:8]}"

        def cell(me: str, other: str) -> str:
            return (f"%%shell {me}\ntouch {meet}-{me}; {shell_waits_for(f'{meet}-{other}', 20, 0.02)}; "
                    f"[ -e {meet}-{other} ] && echo {me}-met || echo {me}-alone")

        first = kernel.send(cell("left", "right"))
        second = kernel.send(cell("right", "left"), subshell_id=subshell)
        runs = kernel.collect_all([first, second])
        assert runs[first].text() == "left-met\n" and runs[second].text() == "right-met\n"
    finally:
        kernel.control("delete_subshell_request", {"subshell_id": subshell})


def test_more_than_the_record_keeps_is_still_shown_whole_within_the_display_limit(kernel):
    """The sandbox keeps at most 16M characters of a command in memory; a display limit above what
    a command prints still shows every line, the last batch coming from the record's tail."""
    assert kernel.run("%output limit 30M").status == "ok" and kernel.run("%output rate off").status == "ok"
    try:
        run = kernel.run("seq 1 3000000", timeout=300)
    finally:
        kernel.run("%output limit 4M")
        kernel.run("%output rate 500k")
    assert run.status == "ok"
    assert run.text() == "".join(f"{i}\n" for i in range(1, 3000001))
    assert "output limit" not in run.notes()


def test_a_shell_that_exits_says_what_the_next_cell_gets(fresh_kernel, tmp_path):
    (tmp_path / "sub").mkdir()
    fresh_kernel.run("cd sub; export KEPT=no")
    ended = fresh_kernel.run("set -e; false")
    assert ended.status == "error" and ended.error["ename"] == "ShellExited"
    assert ended.error["evalue"] == (f"the shell 'main' exited (status 1); the next cell starts a new shell in "
                                    f"{tmp_path / 'sub'} (variables are gone)")
    assert fresh_kernel.run("echo [$KEPT] ${PWD##*/}").text() == "[] sub\n"
    typed = fresh_kernel.run("exit")  # typed as a whole cell: leave, as a terminal would (the console does)
    assert typed.status == "ok" and typed.reply["content"]["payload"] == [{"source": "ask_exit", "keepkernel": False}]
    assert "the shell 'main' exited (status 0)" in typed.notes()
    failing = fresh_kernel.run("exit 4")  # a failure is an error all the same: a notebook run stops there
    assert failing.status == "error" and failing.error["ename"] == "ShellExited"


def test_the_kernel_never_imports_a_debugger_so_its_frozen_modules_warning_never_shows(tmp_path):
    """ipykernel's own kernel_info imports debugpy to offer a debugger; this kernel has none, so the import
    (a second of CPU, and pydevd's "frozen modules" warning, which `jupyter console` prints) never happens.
    Read as a console reads: every IOPub message from the kernel's start, no wait_for_ready (which drains)."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name=KERNEL_NAME)
    km.start_kernel(cwd=str(tmp_path), stderr=subprocess.DEVNULL)
    kc = km.client()
    kc.start_channels()
    try:
        info = kc.kernel_info(reply=True, timeout=60)
        assert "debugger" not in info["content"]["supported_features"]
        said = []

        def keep(message: dict) -> None:
            if message["msg_type"] == "stream":
                said.append(message["content"]["text"])

        # IOPub is a subscription that joins late: the reply above does not mean it hears yet. Ask again
        # until IOPub carries a status for one of the asks, keeping every message it carried before.
        asks: set[str] = set()
        heard = False
        while not heard:
            asks.add(kc.kernel_info())
            try:
                while not heard:
                    message = kc.get_iopub_msg(timeout=1)
                    keep(message)
                    heard = message["parent_header"].get("msg_id") in asks
            except queue.Empty:
                assert len(asks) < 120, "IOPub never heard a kernel_info's status in two minutes"
        msg_id = kc.execute("echo done")
        while True:
            message = kc.get_iopub_msg(timeout=60)
            keep(message)
            if (message["msg_type"] == "status" and message["content"]["execution_state"] == "idle"
                    and message["parent_header"].get("msg_id") == msg_id):
                break
        assert "done\n" in said and not any("frozen" in text or "Debugger" in text for text in said), said
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)  # as a client ends it: the kernel ends its sandbox
