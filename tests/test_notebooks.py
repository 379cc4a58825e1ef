"""The bundled notebooks, run top to bottom by nbclient on the real kernel, with their outputs checked.

`notebooks/tour.ipynb`, `teaching.ipynb` and `debugging.ipynb` are documentation that runs: each is
copied into a temporary folder (the debugging notebook with the `engines/` folder beside it, as in
the repository) and executed once per module on the `owsandbox-test` kernel with errors not
allowed, so any failing cell that is not tagged `raises-exception` fails the run. The tests then read
the outputs nbclient stored, cell by cell: the text a cell printed, the MIME types it displayed, the
errors of the tagged cells (and of no other cell), the answers `%send` showed, and that the records
seen before `%detach` and after `%attach --last` join up with nothing lost or repeated. After each
run no process is left with the notebook's folder as its working folder or on its command line.
Last, `owsandbox tour` itself runs as a console command.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat import NotebookNode

from owsandbox.kernel.cell.notes import is_note

from .conftest import KERNEL_NAME
from .processes import command_line
from .waiting import wait_until

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
RECORD_LINE = re.compile(r"^\s*(\d+) ← (\{.*\})$", re.M)  # a received line of %records: offset, ←, record
SESSION = r"session ([0-9a-f]{8}), cursor (\d+)"


# -- running a notebook ------------------------------------------------------------------------

def processes_in(folder: Path) -> list[str]:
    """Processes whose working folder is under `folder` or whose command line names it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone meanwhile, a zombie, or not ours to read
            continue
        cmdline = command_line(int(entry.name)).strip()
        if cwd == str(folder) or cwd.startswith(f"{folder}{os.sep}") or str(folder) in cmdline:
            found.append(f"{entry.name} in {cwd}: {cmdline}")
    return found


def run_notebook(name: str, tmp_path_factory: pytest.TempPathFactory,
                 before_cell: Callable[[NotebookNode, NotebookNode], None] | None = None) -> tuple[NotebookNode, Path]:
    """Run notebook `name` in a folder of its own; `before_cell(nb, cell)` is called before each code
    cell runs (to wait for what a cell that follows at once would race against)."""
    folder = tmp_path_factory.mktemp(name)
    shutil.copy(NOTEBOOKS / f"{name}.ipynb", folder)
    if name == "debugging":
        shutil.copytree(NOTEBOOKS / "engines", folder / "engines")
    nb = nbformat.read(folder / f"{name}.ipynb", as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), "stored outputs"
    assert nb.metadata.kernelspec == {"name": "owsandbox", "display_name": "Sandbox (bash)", "language": "bash"}
    hook = (lambda cell, cell_index: before_cell(nb, cell)) if before_cell is not None else None
    client = NotebookClient(nb, kernel_name=KERNEL_NAME, timeout=120, resources={"metadata": {"path": str(folder)}},
                            on_cell_execute=hook)
    client.execute()  # raises CellExecutionError at a failing cell not tagged raises-exception
    deadline = time.monotonic() + 10
    while (left := processes_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"still running after the kernel shut down: {left}"
    return nb, folder


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> tuple[NotebookNode, Path]:
    return run_notebook("tour", tmp_path_factory)


def background_job_started(nb: NotebookNode, listing: NotebookNode) -> None:
    """Before the cell that lists the background job: wait until the job is `sleep 300`. Run All sends
    that cell at once, and `ps` may still find the job as the `bash` that forked to exec sleep (a
    person reading the lesson is never that quick)."""
    if not listing.source.startswith("jobs\nps --ppid"):
        return
    found = re.search(r"^\[1\] (\d+)$", notes(cell(nb, "sleep 300 &")), re.M)
    assert found, "the background job's notice is missing"
    pid = int(found.group(1))
    wait_until(lambda: command_line(pid).split() == ["sleep", "300"], 10, f"process {pid} to be sleep 300")


@pytest.fixture(scope="module")
def teaching(tmp_path_factory: pytest.TempPathFactory) -> tuple[NotebookNode, Path]:
    return run_notebook("teaching", tmp_path_factory, before_cell=background_job_started)


@pytest.fixture(scope="module")
def debugging(tmp_path_factory: pytest.TempPathFactory) -> tuple[NotebookNode, Path]:
    return run_notebook("debugging", tmp_path_factory)


# -- reading its outputs -----------------------------------------------------------------------

def cell(nb: NotebookNode, start: str, exact: bool = False) -> NotebookNode:
    """The one code cell whose source starts with `start` (or is `start`, if exact)."""
    found = [c for c in nb.cells if c.cell_type == "code"
             and (c.source == start if exact else c.source.startswith(start))]
    assert len(found) == 1, f"{len(found)} code cells {'are' if exact else 'start with'} {start!r}"
    return found[0]


def text(c: NotebookNode, name: str = "stdout") -> str:
    return "".join(out["text"] for out in c.outputs if out["output_type"] == "stream" and out["name"] == name)


def notes(c: NotebookNode) -> str:
    """The kernel's dimmed notes in a cell (the shell's job notices among them), one a line."""
    return "".join(out["data"]["text/plain"] + "\n" for out in c.outputs
                   if out["output_type"] == "display_data" and is_note(out))


def shown(c: NotebookNode) -> list[dict[str, Any]]:
    """The data bundles a cell displayed, in order."""
    return [out["data"] for out in c.outputs if out["output_type"] in ("display_data", "execute_result")]


def answers(c: NotebookNode) -> list[Any]:
    """What a %send cell showed: each answer as application/json, with its JSON text as text/plain."""
    bundles = shown(c)
    for bundle in bundles:
        assert json.loads(bundle["text/plain"]) == bundle["application/json"]
    return [bundle["application/json"] for bundle in bundles]


def records(c: NotebookNode) -> list[tuple[int, dict[str, Any]]]:
    return [(int(m.group(1)), json.loads(m.group(2))) for m in RECORD_LINE.finditer(text(c))]


def assert_errors_only_where_tagged(nb: NotebookNode, expected: dict[str, str]) -> None:
    """The cells that failed are exactly the cells tagged raises-exception, each with its ename."""
    failed = {c.source.splitlines()[0]: [o["ename"] for o in c.outputs if o["output_type"] == "error"]
              for c in nb.cells if c.cell_type == "code"}
    failed = {first: names for first, names in failed.items() if names}
    tagged = {c.source.splitlines()[0] for c in nb.cells
              if c.cell_type == "code" and "raises-exception" in c.metadata.get("tags", [])}
    assert set(failed) == tagged
    assert failed == {first: [ename] for first, ename in expected.items()}


# -- the tour ----------------------------------------------------------------------------------

def test_tour_shells_keep_state_and_stderr_is_apart(tour):
    nb, folder = tour
    first = cell(nb, "%sandbox")
    assert first is next(c for c in nb.cells if c.cell_type == "code")  # the tour opens with where it runs
    summary = shown(first)
    assert summary[0]["text/plain"].startswith("[sandbox: local · no isolation")  # the first cell's one line
    rows = summary[1]["text/plain"].splitlines()
    assert [row.split("  ")[0] for row in rows[:4]] == ["Isolation", "Writes to", "Network", "Limits"], rows
    assert len(summary) == 2 and len(rows) <= 25 and "local provider" in summary[1]["text/plain"]
    assert text(cell(nb, "mkdir -p tour-demo")) == f"{folder}/tour-demo\n"
    assert text(cell(nb, 'echo "$GREETING')) == "hello from the sandbox, in tour-demo\n"
    assert text(cell(nb, "%%shell scratch")) == "scratch shell is in /tmp; GREETING is ''\n"
    shells = shown(cell(nb, "%shells"))[0]["text/plain"]
    assert re.search(r"\* main\s+\S*/tour-demo\s+idle", shells) and re.search(r"scratch\s+/tmp\s+idle", shells)
    live = cell(nb, "for step in")
    assert text(live) == "step 1\nstep 2\nstep 3\n" and text(live, "stderr") == "a warning\n"
    assert text(cell(nb, "%timeout off")).endswith("\nstill here: hello from the sandbox\n")


def test_tour_failing_cells_fail_as_tagged(tour):
    nb, _ = tour
    assert_errors_only_where_tagged(nb, {"echo 'starting a long job'; sleep 30": "TimedOut",
                                         "ls /no/such/folder": "ExitStatus",
                                         "%%write notes.txt --if-match c2097f55f01fc297fc7f4acf21438123e06e4d409a8185"
                                         "24428534e850642f4f": "UsageError"})
    assert text(cell(nb, "echo 'starting a long job'")) == "starting a long job\n"
    assert "No such file or directory" in text(cell(nb, "ls /no/such/folder"), "stderr")
    refused = next(o for o in cell(nb, "%%write notes.txt --if-match").outputs if o["output_type"] == "error")
    assert "changed since it was read" in refused["evalue"]


def test_tour_files_search_and_a_picture(tour):
    nb, folder = tour
    wrote = text(cell(nb, "%%write notes.txt\n"))
    assert "wrote 23 bytes" in wrote and "c2097f55f01fc297fc7f4acf21438123e06e4d409a818524428534e850642f4f" in wrote
    assert text(cell(nb, "%read notes.txt", exact=True)).startswith("first line\nsecond line\n")
    assert text(cell(nb, "%read notes.txt --lines 2:3")) == "second line\nsomeone else adds a line\n"
    found = shown(cell(nb, "%search"))[0]["text/plain"]
    assert "3 matches" in text(cell(nb, "%search")) + found and "someone else adds a line" in found
    pictures = shown(cell(nb, "python3 - <<'EOF'"))
    assert len(pictures) == 1 and "image/svg+xml" in pictures[0]
    svg = pictures[0]["image/svg+xml"]
    assert svg.startswith("<svg") and svg.count("<rect") == 5
    assert text(cell(nb, "cd .. && rm -rf tour-demo")) == "done\n"
    assert sorted(p.name for p in folder.iterdir()) == ["tour.ipynb"]


# -- the lesson --------------------------------------------------------------------------------

def test_teaching_files_and_folders(teaching):
    nb, folder = teaching

    def plain(source: str) -> str:
        """What a cell printed, without the colours ls has at a login."""
        return re.sub(r"\x1b\[[0-9;]*m", "", text(cell(nb, source)))

    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source == "pwd" and text(first) == f"{folder}\n"
    assert plain("mkdir -p shell-lesson") == f"{folder}/shell-lesson\n.  ..\n"  # ls on a terminal: columns
    assert plain('echo "Hello, shell!"') == "hello.txt\nHello, shell!\n"
    assert text(cell(nb, 'echo "A second line."')) == "Hello, shell!\nA second line.\n---\nStart over.\n"
    assert plain("mkdir -p notes/week1") == (
        f"notes:\nweek1\n\nnotes/week1:\ntip.txt\n{folder}/shell-lesson/notes/week1\n{folder}/shell-lesson\n")


def test_teaching_pipes_count_words(teaching):
    nb, _ = teaching
    assert "wrote 66 bytes" in text(cell(nb, "%%write words.txt"))
    assert text(cell(nb, "wc -l words.txt")).startswith("10 words.txt\n")

    def counts(source: str) -> list[tuple[int, str]]:
        shown_text = text(cell(nb, source, exact=True))
        return [(int(n), word) for n, word in (line.split() for line in shown_text.splitlines())]

    assert counts("sort words.txt | uniq -c") == [(2, "apple"), (4, "banana"), (3, "cherry"), (1, "date")]
    assert counts("sort words.txt | uniq -c | sort -rn") == [(4, "banana"), (3, "cherry"), (2, "apple"),
                                                                (1, "date")]
    assert counts("sort words.txt | uniq -c | sort -rn | head -n 1") == [(4, "banana")]


def test_teaching_a_background_job_is_listed_killed_and_waited_for(teaching):
    nb, _ = teaching
    started = cell(nb, "sleep 300 &")
    pid = re.fullmatch(r"\[1\] (\d+)\n", notes(started)).group(1)  # bash's job-control notice, as a note
    assert text(started) == f"sleep is running in the background as process {pid}\n"
    assert text(started, "stderr") == ""
    listed = text(cell(nb, "jobs\nps --ppid"))
    assert re.match(r"\[1\]\+\s+Running\s+sleep 300 &\n", listed)
    assert re.search(rf"^\s*{pid} \S+\s+sleep 300$", listed, re.M)
    assert text(cell(nb, 'kill "$sleeper"')) == f"sent TERM to process {pid}\n"
    waited = text(cell(nb, 'wait "$sleeper"'))
    assert waited.startswith("the sleep job ended with status 143\n")  # 128 + SIGTERM
    assert waited.endswith(f"process {pid} is gone\n")  # ps -p found nothing


def test_teaching_exit_statuses_and_the_failing_cell(teaching):
    nb, folder = teaching
    statuses = cell(nb, "ls hello.txt")
    assert text(statuses) == "hello.txt\nls finished with status 0\nls finished with status 2\n"
    assert "no-such-file.txt" in text(statuses, "stderr")
    assert text(cell(nb, "true\n")) == "true gives 0\nfalse gives 1\n"
    assert text(cell(nb, "grep -q apple")) == (
        "words.txt mentions apple\nwords.txt has no mango\nhello.txt is backed up\n")
    unanswered = '%%check --hint "not yet: end your pipeline with > answer.txt, run it, then run this check again"'
    assert_errors_only_where_tagged(nb, {"cat no-such-file.txt": "ExitStatus", unanswered: "CheckFailed"})
    failed = cell(nb, "cat no-such-file.txt")
    assert "No such file or directory" in text(failed, "stderr")
    error = next(o for o in failed.outputs if o["output_type"] == "error")
    assert "status 1" in error["evalue"]
    after = nb.cells[nb.cells.index(failed) + 2]  # the cell after the note that nothing is broken
    assert after.source.endswith("pwd")
    assert text(after) == f"the cell above ended with status 1\n{folder}/shell-lesson\n"


def test_teaching_set_e_stops_the_script_not_the_shell(teaching):
    nb, _ = teaching
    ran = cell(nb, "%stderr merge\nbash careful.sh")
    missing = "cat: no-such-file.txt: No such file or directory\n"
    assert text(ran) == ("shell 'main': stderr merge\n"
                         "step 1\nno mango: handled by ||, so the script goes on\n"
                         f"{missing}step 2: cat failed inside a pipeline, but sort (the last command) worked\n"
                         f"{missing}careful.sh stopped early with status 1\n")  # in the exact order written
    assert text(ran, "stderr") == ""
    assert text(cell(nb, "%stderr apart", exact=True)) == "shell 'main': stderr apart\n"


def test_teaching_exercise_answer_its_checks_and_tidy_up(teaching):
    nb, folder = teaching
    assert cell(nb, "# Your turn").outputs == []
    unanswered = cell(nb, "%%check --hint")
    assert text(unanswered) == ("✗ not yet: end your pipeline with > answer.txt, run it, then run this check "
                                "again\n")  # three failing tests, one hint
    assert [(o["ename"], o["evalue"]) for o in unanswered.outputs if o["output_type"] == "error"] == [
        ("CheckFailed", "3 of 3 checks failed")]
    assert text(cell(nb, "tr -s")).split() == ["4", "the"]
    answered = cell(nb, "%%check\n")
    assert text(answered) == "✓ 3 checks passed\n" and text(answered, "stderr") == ""
    assert text(cell(nb, "cd ..\nrm -r shell-lesson")) == "shell-lesson is gone; well done!\n"
    assert sorted(p.name for p in folder.iterdir()) == ["teaching.ipynb"]


# -- the debugging session ---------------------------------------------------------------------

def test_debugging_attach_send_and_records(debugging):
    nb, _ = debugging
    assert "one JSON object per line" in text(cell(nb, "%read engines/echo_engine.py"))
    attached = cell(nb, "%attach --name echo")
    assert re.fullmatch(r"attached to #1 echo \(session [0-9a-f]{8}\)\n", text(attached))
    header = shown(attached)[0]["text/plain"].splitlines()[0]
    assert header.startswith("#1 echo [attached] session ") and header.endswith("--tick 0.5 2>echo-engine.log")
    assert answers(cell(nb, '%send {"id": 1,')) == [{"id": 1, "type": "response", "ok": True,
                                                     "text": "hello, engine"}]
    so_far = [record for _, record in records(cell(nb, "%records", exact=True))]
    assert so_far[0] == {"type": "ready", "engine": "echo", "version": 1}
    assert [r for r in so_far if r.get("type") != "tick"][1:] == [{"id": 1, "type": "response", "ok": True,
                                                                    "text": "hello, engine"}]
    assert answers(cell(nb, '%send {"id": 2,')) == [{"id": 2, "type": "response", "ok": True, "counted": 3}]
    assert answers(cell(nb, "%%send")) == [{"id": 3, "type": "response", "ok": True, "text": "one"},
                                           {"id": 4, "type": "response", "ok": True, "counted": 2},
                                           {"id": 5, "type": "response", "ok": True, "text": "two"}]
    events = records(cell(nb, "%records --type event"))
    assert [(r["id"], r["n"], r["of"]) for _, r in events] == [(2, 1, 3), (2, 2, 3), (2, 3, 3), (4, 1, 2), (4, 2, 2)]
    assert [offset for offset, _ in events] == sorted(offset for offset, _ in events)
    assert answers(cell(nb, '%send {"id": 6,')) == [{"id": 6, "type": "response", "ok": False,
                                                     "error": "pretend the disk is full"}]
    assert answers(cell(nb, '%send {"id": 7,')) == [{"id": 7, "type": "response", "ok": True, "slept": 1}]
    # the echo engine's error answer is data; the JSON-RPC server's fail their cells, as tagged
    assert_errors_only_where_tagged(nb, {
        '%send {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "divide", "arguments": {"a": 1, '
        '"b": 0}}}': "ToolError",
        '%send {"jsonrpc": "2.0", "id": 5, "method": "prompts/list"}': "MethodNotFound",
        "%replay tools-session.jsonl --against python3 engines/tools_server.py --v2": "ReplayDiffers"})


def test_debugging_detach_and_reattach_lose_and_repeat_nothing(debugging):
    nb, folder = debugging
    detached = re.fullmatch(rf"detached from #1 echo \({SESSION}\); %attach --last attaches again\n",
                            text(cell(nb, "%detach")))
    session, cursor = detached.group(1), int(detached.group(2))
    log = text(cell(nb, "sleep 2"))
    assert "echo-engine: failing on purpose: pretend the disk is full\n" in log
    assert log.endswith("requests handled: 7\n")
    listing = shown(cell(nb, "%attach --list"))[0]
    assert "text/html" in listing
    row = next(line for line in listing["text/plain"].splitlines() if session in line).split()
    running, offset, listed_cursor, state = row[-4:]
    assert (running, int(listed_cursor), state) == ("running", cursor, "detached")
    assert int(offset) > cursor  # ticks were written while nobody watched
    again = re.fullmatch(r"attached again to #1 echo \(session ([0-9a-f]{8})\), reading on from offset (\d+) "
                         r"\(execd replays from offset \d+: the bytes up to \2 are checked against what was read "
                         r"last, not shown again\)\n", text(cell(nb, "%attach --last")))
    assert again.group(1) == session and int(again.group(2)) == cursor  # the same #1, resumed where it stopped
    ticks = records(cell(nb, "%records --type tick"))
    before = [(offset, r) for offset, r in ticks if offset <= cursor]
    after = [(offset, r) for offset, r in ticks if offset > cursor]
    assert before and after  # the 1 s request kept #1 attached past a tick; `sleep 2` left ticks to replay
    numbers = [r["n"] for _, r in ticks]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # each tick once, in order
    # The reattach resumed exactly at the cursor: its first record starts there, and each ends where the next starts.
    position = cursor
    for offset, record in after:
        position += len(json.dumps(record, ensure_ascii=False).encode()) + 1
        assert offset == position
    ended = text(cell(nb, "%attach --kill", exact=True))
    assert ended.startswith(f"ended #1 echo (session {session}")
    assert text(cell(nb, "rm -f echo-engine.log")) == "tidied up\n"
    assert sorted(p.name for p in folder.iterdir()) == ["debugging.ipynb", "engines"]


def test_debugging_a_json_rpc_server(debugging):
    nb, _ = debugging
    assert "JSON-RPC 2.0, one message per" in text(cell(nb, "%read engines/tools_server.py"))
    assert re.fullmatch(r"attached to #2 tools \(session [0-9a-f]{8}\)\n", text(cell(nb, "%attach --name tools")))
    [initialized] = answers(cell(nb, '%send {"jsonrpc": "2.0", "id": 1,'))
    assert initialized["result"]["serverInfo"] == {"name": "tools-server", "version": "1"}
    bundle = shown(cell(nb, '%send {"jsonrpc": "2.0", "id": 1,'))[0]
    assert bundle["text/plain"] == json.dumps(initialized, indent=2)  # expanded, not one long line
    assert text(cell(nb, '%send {"jsonrpc": "2.0", "method"')).startswith("sent the notification "
                                                                          "notifications/initialized to #2 tools")
    [added] = answers(cell(nb, '%send {"jsonrpc": "2.0", "id": 2,'))
    assert added["result"]["content"][0]["text"] == "5"
    [slept] = answers(cell(nb, "%send --timeout 1"))
    assert slept["result"]["content"][0]["text"] == "slept 2 s"  # 2 s under a 1 s timeout: progress reset it
    call = text(cell(nb, "%records --id 3")).splitlines()
    assert call[0].split()[0] == "→" and len(call) == 5 and '"method": "notifications/progress"' in call[2]
    tool_error = [o for o in cell(nb, '%send {"jsonrpc": "2.0", "id": 4,').outputs if o["output_type"] == "error"]
    assert tool_error[0]["evalue"].startswith('the tool "divide" failed: division by zero, the answer to request 4')
    unknown = [o for o in cell(nb, '%send {"jsonrpc": "2.0", "id": 5,').outputs if o["output_type"] == "error"]
    assert unknown[0]["evalue"].startswith("-32601 Method not found (data: prompts/list)")
    assert answers(cell(nb, '%send {"jsonrpc": "2.0", "id": 6,'))[0]["result"]["content"][0]["text"] == "done"
    flagged = text(cell(nb, "%records --last 3")).splitlines()
    assert flagged[1].split("!", 1)[1] == (" tools-server: chatty was called  (not JSON: the program wrote a log "
                                           "line to stdout)")
    assert "saved " in text(cell(nb, "%records --save")) and "%replay tools-session.jsonl" in text(
        cell(nb, "%records --save"))
    same = text(cell(nb, "%replay tools-session.jsonl", exact=True))
    assert ": 6 answers the same, 0 different\n" in same and "ended #3 replay" in same
    changed = cell(nb, "%replay tools-session.jsonl --against")
    said = text(changed)
    assert ": 5 answers the same, 1 different\n≠ id 2 (tools/call)\n" in said
    assert '-        "text": "5",' in said and '+        "text": "23",' in said
    error = [o for o in changed.outputs if o["output_type"] == "error"][0]
    assert error["evalue"] == "1 of 6 answers differs from tools-session.jsonl: id 2 (tools/call)"
    assert text(cell(nb, "%attach --kill 2")).startswith("ended #2 tools")


# -- the console command -----------------------------------------------------------------------

def test_owsandbox_tour_command_runs_the_tour():
    done = subprocess.run([sys.executable, "-m", "owsandbox.cli", "tour", "--kernel", KERNEL_NAME],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "without encryption" not in done.stderr and "TCP" not in done.stderr  # its kernel runs over IPC
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"ran \d+ cells of tour\.ipynb: all as expected", lines[-1])
    assert "│ %sandbox" in lines and "<image/svg+xml: " in done.stdout
    workspace = Path(re.search(r"^(?:Writes to|Starts in)\s+(/[^\s;]+)", done.stdout, re.M).group(1))  # %sandbox
    assert workspace.name.startswith("owsandbox-tour-") and not workspace.exists()  # removed when done
    assert not processes_in(workspace)


def test_owsandbox_tour_runs_in_a_copy_of_the_notebooks_folder(tmp_path):
    """What a notebook reads beside it is there (notebooks/debugging.ipynb reads engines/); what it writes
    is not left in the original folder."""
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "data.txt").write_text("beside the notebook\n")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in
                                               ("cat engines/data.txt", "echo made > made.txt; ls -1 --color=never")])
    nbformat.write(notebook, str(tmp_path / "reads.ipynb"))
    done = subprocess.run([sys.executable, "-m", "owsandbox.cli", "tour", str(tmp_path / "reads.ipynb"), "--kernel",
                           KERNEL_NAME], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "beside the notebook\n" in done.stdout and "made.txt\n" in done.stdout
    assert not (tmp_path / "made.txt").exists()


def test_owsandbox_tour_stops_listing_at_the_cell_that_failed(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in
                                               ("echo first", "echo second; false", "echo never-ran")])
    path = tmp_path / "fails.ipynb"
    nbformat.write(notebook, str(path))
    done = subprocess.run([sys.executable, "-m", "owsandbox.cli", "tour", str(path), "--kernel", KERNEL_NAME],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "│ echo first\n[sandbox: local · no isolation" in done.stdout and "]\nfirst\n" in done.stdout
    assert "second\n✗ ExitStatus" in done.stdout
    assert "never-ran" not in done.stdout  # not listed as if it had run
    assert "the notebook stopped at this cell; 1 cell after it did not run" in done.stderr
