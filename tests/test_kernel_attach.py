"""%attach through the real kernel: a JSON-lines program in the sandbox, live records, %send with ids,
detach and reattach (also across a kernel restart) with nothing lost or repeated."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from .kernel_session import KernelSession
from .waiting import patience, shell_waits_for

ENGINE = Path(__file__).resolve().parents[1] / "notebooks" / "engines" / "echo_engine.py"


@pytest.fixture
def kernel(fresh_kernel):
    return fresh_kernel


def display_text(run) -> str:
    shown = run.of_type("display_data") + run.of_type("update_display_data")
    return shown[-1]["data"]["text/plain"] if shown else ""


def wait_for_display(kernel: KernelSession, pattern: str, timeout: float = 20) -> str:
    """The text of an %attach display once it matches `pattern`: as last read (the updates that came while a
    later cell ran were read with that cell's output), or as iopub brings it (its records arrive live)."""
    shown = [text for text in kernel.displays.values() if re.search(pattern, text)]
    if shown:
        return shown[0]
    msg = kernel.wait_for(lambda m: m["msg_type"] in ("display_data", "update_display_data")
                          and re.search(pattern, m["content"]["data"].get("text/plain", "")),
                          patience(timeout), f"a display matching {pattern!r}")
    return msg["content"]["data"]["text/plain"]


def records_of(kernel: KernelSession, extra: str = "") -> list[dict]:
    text = kernel.run(f"%records --last 1000 {extra}").text()
    return [json.loads(m.group(1)) for m in re.finditer(r"^\s*\d+ ← (.*)$", text, re.M)]


def wait_for_ticks(kernel: KernelSession, selector: str, count: int, timeout: float = 20) -> list[int]:
    """The tick numbers of a program once at least `count` have arrived (polled through %records;
    `timeout` on a quiet machine, stretched by its load)."""
    deadline = time.monotonic() + patience(timeout)
    while True:
        ticks = [r["n"] for r in records_of(kernel, f"{selector} --type tick")]
        if len(ticks) >= count or time.monotonic() > deadline:
            return ticks
        time.sleep(0.1)


def test_records_show_live_and_send_waits_for_the_answer_by_id(kernel):
    started = kernel.run(f"%attach --name echo -- {sys.executable} {ENGINE}")
    assert started.status == "ok" and "attached to #1 echo" in started.text()
    display_id = started.of_type("display_data")[0]["transient"]["display_id"]
    assert '"type": "ready"' in wait_for_display(kernel, '"type": "ready"')
    answer = kernel.run('%send {"id": 7, "type": "echo", "text": "hello"}')
    shown = answer.of_type("display_data")[0]["data"]["application/json"]
    assert shown == {"id": 7, "type": "response", "ok": True, "text": "hello"}
    counted = kernel.run('%%send\n{"id": 8, "type": "count", "to": 3}\n{"id": 9, "type": "echo", "text": "b"}')
    answers = [d["data"]["application/json"] for d in counted.of_type("display_data")]
    assert answers == [{"id": 8, "type": "response", "ok": True, "counted": 3},
                       {"id": 9, "type": "response", "ok": True, "text": "b"}]
    events = records_of(kernel, "--type event")
    assert [e["n"] for e in events] == [1, 2, 3]  # events carry the id too, but are not the answer
    update = wait_for_display(kernel, r"counted")
    assert "#1 echo [attached]" in update
    assert display_id.startswith("owsandbox-attach-")


def test_records_keep_arriving_while_other_cells_run(kernel):
    """The cell runs until the test has seen five ticks shown while it ran (at most 30 s): ticks held back
    until the cell ends would leave it waiting in vain."""
    kernel.run(f"%attach -- {sys.executable} {ENGINE} --tick 0.1")
    go = kernel.workspace / f"ticks-seen-{uuid.uuid4().hex[:8]}"
    msg_id = kernel.send(f"{shell_waits_for(go, 30)}; echo cell-done")
    ticks_during = set()
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=60)
        if msg["msg_type"] == "update_display_data":
            ticks_during.update(re.findall(r'"type": "tick", "n": (\d+)', msg["content"]["data"]["text/plain"]))
            if len(ticks_during) >= 5:
                go.touch()
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" \
                and msg["content"]["execution_state"] == "idle":
            break
    assert len(ticks_during) >= 5 and go.exists()


def test_detach_and_reattach_lose_and_repeat_nothing(kernel):
    kernel.run(f"%attach -- {sys.executable} {ENGINE} --tick 0.05")
    wait_for_display(kernel, r'"tick", "n": 3\b')
    detached = kernel.run("%detach").text()
    assert "detached from #1" in detached and detached.endswith("; %attach --last attaches again\n"), detached
    time.sleep(0.5)  # ticks go on while nobody watches
    again = kernel.run("%attach --last")
    assert "attached again to #1" in again.text()  # the same program keeps its number
    assert again.outputs[0]["msg_type"] == "stream" and again.of_type("display_data")  # the line, then the view
    wait_for_ticks(kernel, "1", 15)
    kernel.run("%detach 1")
    ticks = [r["n"] for r in records_of(kernel, "1 --type tick")]
    assert ticks == list(range(1, len(ticks) + 1))  # each tick exactly once, in order, across both attachments
    kernel.run("%attach --last")
    row = kernel.run("%attach --list").of_type("display_data")[0]["data"]["text/plain"].splitlines()[1]
    assert row.split()[0] == "1" and row.split()[-1] == "attached"
    assert kernel.run("%attach --kill").status == "ok"
    assert "nothing is attached" in kernel.run("%records 1").error["evalue"]  # every attachment went with it


@pytest.mark.parametrize(("named", "now"), [(True, False), (False, False), (False, True), (True, True)],
                         ids=["kernel-id.json", "temporary-file", "temporary-file-now", "kernel-id.json-now"])
def test_a_kernel_restart_keeps_the_program_and_the_cursor(tmp_path, named, now):
    """Whatever the client: named as Jupyter's servers name connection files, or the temporary file a
    plain `KernelManager()` writes (VS Code-style clients, scripts); restarted gently or at once."""
    connection = str(tmp_path / f"kernel-{uuid.uuid4()}.json") if named else None
    kernel = KernelSession(tmp_path, connection_file=connection)
    if not named:
        assert os.path.basename(kernel.km.connection_file).startswith("tmp")
    try:
        kernel.run(f"%attach -- {sys.executable} {ENGINE} --tick 0.05")
        wait_for_ticks(kernel, "", 5)
        kernel.run("%detach")  # so that `before` is exactly what this kernel delivered
        before = [r["n"] for r in records_of(kernel, "--type tick")]
        kernel.restart(now=now)
        assert kernel.run("echo fresh-shell-$((1+1))").text().endswith("fresh-shell-2\n")
        again = kernel.run("%attach --last")
        assert again.status == "ok", again.outputs
        after = wait_for_ticks(kernel, "", 10)
        assert after[0] == before[-1] + 1  # nothing lost, nothing repeated across the restart
        assert after == list(range(after[0], after[0] + len(after)))
        # Restarting while attached: the kernel writes its exact cursor down as it shuts down.
        kernel.restart(now=False)
        assert kernel.run("%attach --last").status == "ok"
        third = wait_for_ticks(kernel, "", 5)
        assert third[0] > after[-1] and third == list(range(third[0], third[0] + len(third)))
        kernel.run("%attach --kill")
    finally:
        kernel.close()


def test_a_program_that_exits_says_so_with_its_stderr(kernel):
    kernel.run(f"%attach -- {sys.executable} {ENGINE}")
    kernel.run('%send {"type": "exit", "code": 3}')
    ended = wait_for_display(kernel, r"ended")
    assert "exited with code 3" in ended and "exiting with 3" in ended  # the stderr tail tells why
    refused = kernel.run('%send {"id": 1, "type": "echo"}')
    assert refused.status == "error" and "not attached" in refused.error["evalue"]
    assert refused.error["evalue"].endswith("; it has ended; %attach -- COMMAND starts a new one")  # not --last


def test_a_program_that_exits_at_once_makes_attach_an_error(kernel):
    """Not `attached to #1` and a failing %send later: the cell fails, naming the status and the stderr."""
    missing = kernel.run("%attach -- python3 nosuch.py")
    assert missing.status == "error" and "attached to" not in missing.text()
    error = missing.error
    assert error["ename"] == "AttachedProgramExited"
    assert error["evalue"].startswith("#1 'python3 nosuch.py' exited with status 2 within ")
    assert "nosuch.py': [Errno 2] No such file or directory" in error["evalue"]  # python3's own complaint
    assert missing.reply["content"]["ename"] == "AttachedProgramExited"
    oops = kernel.run("%attach -- sh -c 'echo oops >&2; exit 3'")
    assert oops.status == "error" and oops.error["ename"] == "AttachedProgramExited"
    assert re.search(r"exited with status 3 within \d+\.\d s: oops$", oops.error["evalue"]), oops.error["evalue"]
    silent = kernel.run("%attach -- sh -c 'exit 0'")
    assert "exited with status 0" in silent.error["evalue"] and "nothing to stderr" in silent.error["evalue"]
    chatty = kernel.run("%attach -- sh -c 'echo hello; sleep 30'")  # not JSON: flagged, and the channel reads on
    assert chatty.status == "ok" and "attached to #4" in chatty.text(), chatty.outputs
    flagged = wait_for_display(kernel, "stdout lines that are not JSON")
    assert "! hello  (not JSON: the program wrote a log line to stdout)" in flagged, flagged
    assert "! hello" in kernel.run("%records 4").text()
    assert kernel.run("%attach --kill 4").status == "ok"


def test_attaching_again_to_a_program_that_has_ended_says_so(kernel):
    kernel.run(f"%attach -- {sys.executable} {ENGINE}")
    kernel.run('%send {"type": "exit", "code": 5}')
    wait_for_display(kernel, r"ended")
    for how in ("%attach --last", "%attach --session " + kernel.run("%attach --list").of_type(
            "display_data")[0]["data"]["text/plain"].splitlines()[1].split()[1]):
        again = kernel.run(how)
        assert again.status == "error" and "attached again" not in again.text(), how
        assert again.error["ename"] == "AttachedProgramExited"
        assert "has ended: it exited with status 5" in again.error["evalue"]


def test_the_list_after_a_restart_shows_ids_and_states_in_words(kernel):
    started = kernel.run(f"%attach --name lasting -- {sys.executable} {ENGINE}")
    session = re.search(r"session ([0-9a-f]{8})", started.text()).group(1)
    kernel.run("%detach")
    kernel.run("%attach --name brief -- sh -c 'exit 3'")
    kernel.restart(now=False)
    listing = kernel.run("%attach --list").of_type("display_data")[0]["data"]["text/plain"]
    rows = {line.split()[2]: line.split() for line in listing.splitlines()[1:]}
    assert "True" not in listing and "False" not in listing, listing
    assert rows["lasting"][:2] == ["-", session] and "running" in rows["lasting"], listing
    assert rows["brief"][0] == "-" and re.fullmatch(r"[0-9a-f]{8}", rows["brief"][1]), listing
    assert "exited 3" in " ".join(rows["brief"]), listing
    assert kernel.run(f"%attach --session {session}").status == "ok"
    records = kernel.run("%records")  # only what came since: and it says so, and how to read the rest
    assert records.status == "ok" and "was attached again at offset " in records.notes(), records.outputs
    assert f"%attach --session {session} --since 0" in records.notes()
    listing = kernel.run("%attach --list").of_type("display_data")[0]["data"]["text/plain"]
    row = next(line.split() for line in listing.splitlines() if session in line)
    assert row[0] == "1" and row[-1] == "attached"  # attached in this kernel: its number
    kernel.run("%attach --kill")


def test_the_lines_of_an_attachment_agree_with_its_header_on_the_cursor(kernel):
    """The header counts the cursor live; a line under it must not name an older cursor as `cursor`."""
    started = kernel.run(f"%attach -- {sys.executable} {ENGINE} --tick 0.05")
    header = wait_for_display(kernel, r'"tick", "n": 3\b').splitlines()[0]
    now = int(re.search(r"cursor (\d+)", header).group(1))
    assert now > 0
    assert all(int(n) == now for n in re.findall(r"cursor (\d+)", started.text())), (started.text(), header)
    msg_id = kernel.send("%detach")
    headers, said = [], ""
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=30)
        if msg["msg_type"] == "update_display_data":
            headers.append(msg["content"]["data"]["text/plain"].splitlines()[0])
        elif msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == msg_id:
            said += msg["content"]["text"]
        elif msg["msg_type"] == "status" and msg["parent_header"].get("msg_id") == msg_id \
                and msg["content"]["execution_state"] == "idle":
            break
    final = re.search(r"cursor (\d+)", headers[-1]).group(1)
    assert "[detached]" in headers[-1] and f"cursor {final})" in said, (headers[-1], said)
    kernel.run("%attach --kill")


def test_bad_uses_of_the_attach_magics_are_clear_errors(kernel):
    assert "nothing is attached" in kernel.run('%send {"id": 1}').error["evalue"]
    assert "needs a command after --" in kernel.run("%attach --name x").error["evalue"]
    assert "no program was attached" in kernel.run("%attach --last").error["evalue"]
    kernel.run(f"%attach -- {sys.executable} {ENGINE}")
    assert "not JSON" in kernel.run("%send {not json}").error["evalue"]
    assert "JSON object" in kernel.run("%send [1, 2]").error["evalue"]
    assert "no attached program #9" in kernel.run("%records 9").error["evalue"]
    assert "--header takes K:V" in kernel.run("%attach --url http://127.0.0.1:1 --header bad -- x").error["evalue"]
    unknown = kernel.run("%attach --session 00000000-0000-0000-0000-000000000000")
    assert unknown.status == "error" and "could not attach" in unknown.error["evalue"]
    assert unknown.error["evalue"].endswith('"code": "NOT_FOUND", "message": "no session '
                                            '00000000-0000-0000-0000-000000000000"}')  # execd's body, as text
    assert "usage: %attach" in kernel.run("%attach --help").text()


def test_a_chatty_program_keeps_the_kernel_small(kernel):
    kernel.run(f"%attach -- {sys.executable} {ENGINE}")

    def kernel_rss() -> int:
        with open(f"/proc/{kernel.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    before = kernel_rss()
    answer = kernel.run('%%send --wait 120\n{"id": "big", "type": "count", "to": 100000}', timeout=180)
    assert answer.status == "ok"
    kept = records_of(kernel)
    assert len(kept) == 1000 and kept[-1]["id"] == "big"  # only the most recent records are kept
    assert kernel_rss() - before < 60 * 1024  # kB


def test_registry_lives_in_the_sandbox(kernel):
    kernel.run(f"%attach --name remembered -- {sys.executable} {ENGINE}")
    kernel.run("%detach")
    listing = kernel.run("%attach --list").of_type("display_data")[0]["data"]["text/plain"]
    row = listing.splitlines()[1].split()
    assert "remembered" in row and "running" in row  # known from the registry, running in execd


def test_attach_to_another_execd_by_url_and_header(kernel, tmp_path):
    """As against a real OpenSandbox execd: an endpoint given by URL, its token as a header."""
    from owsandbox.box.execd.endpoint import ExecdServer

    server = ExecdServer("a-token", tcp_host="127.0.0.1", cwd=str(tmp_path))
    server.start()
    try:
        url = server.address()["url"]
        refused = kernel.run(f"%attach --url {url} --header X-EXECD-ACCESS-TOKEN:wrong -- {sys.executable} {ENGINE}")
        assert refused.status == "error" and "401" in refused.error["evalue"]
        started = kernel.run(f"%attach --url {url} --header X-EXECD-ACCESS-TOKEN:a-token -- {sys.executable} {ENGINE}")
        assert started.status == "ok", started.error["evalue"]
        answer = kernel.run('%send {"id": "u1", "type": "echo", "text": "elsewhere"}')
        assert answer.of_type("display_data")[0]["data"]["application/json"]["text"] == "elsewhere"
        assert kernel.run("%attach --kill").status == "ok"
    finally:
        server.stop()


def test_attach_to_a_released_execd(kernel, released_execd):
    """Against a released execd (the stand-in's release mode: `command` ignored, no takeover, an ended
    program restarted by a new connection, `exit` before the last output; and an external execd named
    by OWS_TEST_EXECD_URL): start, reattach after another client let go, and an ended program is
    reported as ended, never started again. Seen through execd's own API only."""
    from websockets.sync.client import connect

    from owsandbox.channel import ExecdControl, ExecdEndpoint
    from owsandbox.channel.endpoint import TOKEN_HEADER

    address = released_execd.address()
    where = f"--url {address['url']} --header X-EXECD-ACCESS-TOKEN:{address['token']}"
    started = kernel.run(f"%attach {where} -- {sys.executable} {ENGINE} --tick 0.05")
    assert started.status == "ok", started.error["evalue"]
    wait_for_display(kernel, r'"tick", "n": 3\b')
    [shown] = [m for m in started.outputs if m["msg_type"] == "display_data"
               and m["content"].get("transient", {}).get("display_id", "").startswith("owsandbox-attach-")]
    session_id = re.fullmatch(r"owsandbox-attach-(.+)-1", shown["content"]["transient"]["display_id"]).group(1)
    assert f"(session {session_id[:8]})" in started.text()
    assert "detached from #1" in kernel.run("%detach").text()
    holding = threading.Event()

    def hold() -> None:  # another client holds the session for a second: 409s, whatever takeover says
        with connect(f"ws://{address['url'][len('http://'):]}/pty/{session_id}/ws?pty=0&since=999999999",
                     additional_headers={"X-EXECD-ACCESS-TOKEN": address["token"]}, proxy=None):
            holding.set()
            time.sleep(1.0)

    threading.Thread(target=hold, daemon=True).start()
    assert holding.wait(10)
    asked = time.monotonic()
    again = kernel.run(f"%attach --last {where}")
    assert "attached again to #1" in again.text(), again.outputs
    # what it asked execd for: a replay from before the cursor, whose bytes up to the cursor are checked, not shown
    said = re.search(r"reading on from offset (\d+) \(execd replays from offset (\d+): the bytes up to (\d+) are "
                     r"checked against what was read last, not shown again\)\n", again.text())
    assert said and int(said.group(2)) < int(said.group(1)) == int(said.group(3)), again.text()
    assert time.monotonic() - asked > 0.5  # tried again until the holder let go
    ticks = wait_for_ticks(kernel, "1", 5)
    answer = kernel.run('%send {"id": "r1", "type": "echo", "text": "released"}')
    assert answer.of_type("display_data")[0]["data"]["application/json"]["text"] == "released"
    kernel.run('%send {"type": "exit", "code": 5}')
    wait_for_display(kernel, r"ended")
    ended = kernel.run(f"%attach --last {where}")
    assert ended.status == "error" and ended.error["ename"] == "AttachedProgramExited", ended.outputs
    assert "no longer running" in ended.error["evalue"] and "not attached again" in ended.error["evalue"]
    control = ExecdControl(ExecdEndpoint(origin=address["url"], headers={TOKEN_HEADER: address["token"]}))
    assert ticks and control.status(session_id)["running"] is False  # not restarted
