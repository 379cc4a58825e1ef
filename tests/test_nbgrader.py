"""nbgrader grades a bash lesson on the owsandbox kernel, and a hostile submission gets nothing out of it.

A course (tests/nbgrader_course.py) releases tests/nbgrader/source/lesson1 with the real `nbgrader
generate_assignment`, then grades the students with `nbgrader autograde` and `nbgrader
generate_feedback`, each run as a subprocess with tests/nbgrader/nbgrader_config.py (a bash code stub,
a 5 s cell timeout, the kernel run in a throw-away copy of the notebook's folder) and the kernel taken
from the notebook's metadata: `owsandbox`, found through the grader's JUPYTER_PATH, a kernelspec with
the bubblewrap provider and at most 256 processes. The gradebook is read with `nbgrader.api.Gradebook`
and the feedback page as the student gets it.

* alice answers everything right and gets full marks;
* bob gets question 1 right and the other two wrong: their test cells score zero, question 1 counts;
* carol hands in the released notebook untouched and scores nothing;
* mallory's answer cells try to read the grader's files, the gradebook, the solutions and the grader's
  home, to write into the course, into alice's grades and into the host's /tmp, plant links and a FIFO
  for the grader to follow, leave a process behind, loop forever, and fork without end; her
  submission also asks for the python3 kernel. She gets the points she answered for (questions 1 and
  3), the loop is stopped at nbgrader's cell timeout by the kernel's Stop and the cells after it are
  graded, the fork bomb ends at the sandbox's process limit, and nothing outside her sandbox changes:
  the course's files, the other students' rows in the gradebook, the host's /tmp; no secret shows in
  her autograded notebook or her feedback. Her submission is graded by root and, at the same time in
  a copy of the course, by a plain grader (a user made with useradd, running the system Python), as
  tests/security/ does for every promise.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from nbformat import NotebookNode

from .conftest import require_bwrap
from .machine_lock import ensure_user, machine_lock
from .nbgrader_course import (
    ASSIGNMENT,
    POINTS,
    Grader,
    Hostile,
    Run,
    autograde,
    autograded,
    cell_seconds_of,
    chown_tree,
    correct_answers,
    generate_feedback,
    gradebook_rows,
    make_course,
    make_grader,
    scores,
    submit,
    text_of,
    tree,
    wrong_answers,
)
from .plain_python import make_plain_python
from .processes import command_line
from .waiting import WaitTimeout, wait_until

# The module's fixtures autograde a class (several minutes on a loaded machine) inside the first test's
# timeout, which is here a hang guard only.
pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

PLAIN_GRADER = "owsbx-grader"
BANNER = re.compile(r"\[sandbox: bubblewrap · writes to (\S+) · no network · 1 GiB, 256 processes\]")
MALLORY_EXPECTED = {"files_test": 1.0, "pipeline_test": 0.0, "status_test": 2.0}


@dataclass(frozen=True)
class Snapshot:
    """What a hostile run must leave alone: the course's files, the gradebook less the student's own
    rows, the host's canary file (content and mode) and whether its own files appeared on the host."""

    files: dict[str, tuple[str, int, str]]
    rows: dict[str, set[tuple[object, ...]]]
    canary: tuple[bytes, int]
    host_files: list[bool]

    @classmethod
    def take(cls, course: Path, hostile: Hostile) -> Snapshot:
        return cls(tree(course), gradebook_rows(course, leave_out="mallory"),
                   (hostile.host_canary.read_bytes(), stat.S_IMODE(hostile.host_canary.stat().st_mode)),
                   [path.exists() for path in hostile.host_files])


@dataclass(frozen=True)
class Attack:
    """A hostile submission's autograde: the course, the grader, the run, and the course before and after."""

    course: Path
    grader: Grader
    hostile: Hostile
    run: Run
    before: Snapshot
    after: Snapshot


@dataclass(frozen=True)
class Course:
    """The graded course and every nbgrader run made on it."""

    course: Path
    grader: Grader
    secret: str
    honest: Run  # alice's, bob's and carol's autograde, in one run
    attack: Attack  # mallory's, graded by root
    feedback: Run
    plain: Future[Attack] | None  # mallory's in a copy of the course, graded by a plain user (as root only)


@contextmanager
def host_canary(secret: str) -> Iterator[Path]:
    """A file in the host's own /tmp (not the tests' TMPDIR) that the hostile submission goes for."""
    handle, name = tempfile.mkstemp(prefix="owsbx-nbgrader-canary-", dir="/tmp")
    os.write(handle, f"host secret {secret}-host-tmp\n".encode())
    os.close(handle)
    os.chmod(name, 0o644)
    try:
        yield Path(name)
    finally:
        os.unlink(name)


@contextmanager
def open_folder(prefix: str) -> Iterator[Path]:
    """A new folder any user can pass through (a plain grader works under it), removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def attack(course: Path, grader: Grader, canary: Path, owner: str | None = None) -> Attack:
    """mallory submits the hostile notebook (asking for the python3 kernel) and nbgrader autogrades it."""
    hostile = Hostile(course, grader.home, canary, secrets.token_hex(6))
    submit(course, "mallory", hostile.answers(course), before=hostile.extra_cells(), owner=owner,
           kernel={"name": "python3", "display_name": "Python 3", "language": "python"})
    before = Snapshot.take(course, hostile)
    run = autograde(course, grader, "mallory")
    after = Snapshot.take(course, hostile)
    return Attack(course, grader, hostile, run, before, after)


def plain_attack(stack: ExitStack, copy: Path, secret: str) -> Attack:
    """The hostile run by a plain grader: on a copy of the course made before root's (alice, bob and
    carol graded), owned by a user made with useradd, who runs nbgrader with the system Python. What it
    makes goes on `stack`, to be removed after the tests. The grader's account is the machine's: its
    processes count against the per-user process limit mallory's fork bomb meets, so one test process
    at a time grades as that user."""
    stack.enter_context(machine_lock("plain-grader"))
    owner = ensure_user(PLAIN_GRADER)
    chown_tree(copy, owner)
    os.chmod(copy, 0o700)
    plain = make_plain_python()
    stack.callback(shutil.rmtree, plain.root, ignore_errors=True)
    canary = stack.enter_context(host_canary(secret))
    grader = make_grader(stack.enter_context(open_folder("owsbx-g-")), secret, python=plain.python,
                         base_env=plain.env, user=PLAIN_GRADER)
    return attack(copy, grader, canary, PLAIN_GRADER)


@pytest.fixture(scope="module")
def graded() -> Iterator[Course]:
    """The course graded by root: alice, bob and carol in one autograde, then mallory (while a plain
    grader grades her in a copy of the course), then the feedback for all four."""
    require_bwrap()
    secret = secrets.token_hex(8)
    with ExitStack() as stack:
        base = stack.enter_context(open_folder("owsbx-nbgrader-"))
        canary = stack.enter_context(host_canary(secret))
        grader = make_grader(stack.enter_context(open_folder("owsbx-g-")), secret)
        course = make_course(base / "course", grader, secret)
        submit(course, "alice", correct_answers(course))
        submit(course, "bob", wrong_answers(course))
        submit(course, "carol", {})  # the released notebook as it is
        honest = autograde(course, grader)
        assert honest.done.returncode == 0, honest.done.stderr
        plain = None
        if os.getuid() == 0:  # the plain grader's run goes alongside root's: both mostly wait for a cell timeout
            shutil.copytree(course, base / "plain-course", symlinks=True)
            plain_stack = stack.enter_context(ExitStack())
            pool = stack.enter_context(ThreadPoolExecutor(1))  # waits for the run before plain_stack is undone
            plain = pool.submit(plain_attack, plain_stack, base / "plain-course", secret)
        hostile = attack(course, grader, canary)
        feedback = generate_feedback(course, grader)
        yield Course(course, grader, secret, honest, hostile, feedback, plain)


# -- reading the results -----------------------------------------------------------------------

def cell(notebook: NotebookNode, grade_id: str) -> NotebookNode:
    return next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def stream(c: NotebookNode, name: str) -> str:
    return "".join(o["text"] for o in c.outputs if o["output_type"] == "stream" and o["name"] == name)


def errors(c: NotebookNode) -> list[tuple[str, str]]:
    return [(o["ename"], o["evalue"]) for o in c.outputs if o["output_type"] == "error"]


def feedback_scores(course: Path, student: str) -> tuple[str, dict[str, str]]:
    """The total and each test cell's score as the feedback page shows them."""
    page = (course / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    total = re.search(rf"<h4>{ASSIGNMENT} \(Score: ([\d.]+ / [\d.]+)\)</h4>", page)
    cells = re.findall(r"Grade cell: <code>(\w+)</code>.*?Score: ([\d.]+ / [\d.]+)", page, re.S)
    assert total, page[:2000]
    return total.group(1), dict(cells)


def left_behind(token: str) -> list[str]:
    """Host processes named by the hostile notebook's leftover (it renames `sleep` with exec -a)."""
    return [pid for pid in os.listdir("/proc") if pid.isdigit() and f"owsbx-left-{token}" in command_line(int(pid))]


# -- the honest students -----------------------------------------------------------------------

def test_a_correct_submission_gets_full_marks(graded: Course):
    assert graded.honest.done.returncode == 0, graded.honest.done.stderr
    assert scores(graded.course, "alice") == POINTS
    notebook = autograded(graded.course, "alice")
    assert BANNER.search(text_of(notebook))  # the lesson's kernel, in the sandbox, with the grader's limits
    for grade_id in POINTS:
        assert stream(cell(notebook, grade_id), "stdout") == "correct\n"
    assert not [c.source for c in notebook.cells if c.cell_type == "code" and errors(c)]
    assert feedback_scores(graded.course, "alice") == ("5.0 / 5.0", {"files_test": "1.0 / 1.0",
                                                                     "pipeline_test": "2.0 / 2.0",
                                                                     "status_test": "2.0 / 2.0"})


def test_a_wrong_submission_scores_zero_where_its_tests_fail(graded: Course):
    assert scores(graded.course, "bob") == {"files_test": 1.0, "pipeline_test": 0.0, "status_test": 0.0}
    notebook = autograded(graded.course, "bob")
    assert stream(cell(notebook, "files_test"), "stdout") == "correct\n"
    pipeline, status = cell(notebook, "pipeline_test"), cell(notebook, "status_test")
    assert stream(pipeline, "stderr") == "top is 'apple': count again\n"
    assert stream(status, "stderr") == "has_fruit an should fail: 'an' is only part of a line\n"
    assert errors(pipeline) == errors(status) == [("ExitStatus", "the command exited with status 1")]
    assert feedback_scores(graded.course, "bob") == ("1.0 / 5.0", {"files_test": "1.0 / 1.0",
                                                                   "pipeline_test": "0.0 / 2.0",
                                                                   "status_test": "0.0 / 2.0"})


def test_an_unanswered_submission_scores_nothing(graded: Course):
    """The released notebook handed in as it is: the bash code stub of nbgrader_config.py fails each answer
    cell without ending the shell, and each test cell then fails on its own."""
    assert scores(graded.course, "carol") == {"files_test": 0.0, "pipeline_test": 0.0, "status_test": 0.0}
    notebook = autograded(graded.course, "carol")
    for grade_id in ("files_answer", "pipeline_answer", "status_answer"):
        answer_cell = cell(notebook, grade_id)
        assert answer_cell.source.startswith("# YOUR CODE HERE\necho 'no answer yet' >&2; false")
        assert stream(answer_cell, "stderr") == "no answer yet\n"
    assert stream(cell(notebook, "files_test"), "stderr") == "answers/count.txt is missing\n"
    assert stream(cell(notebook, "status_test"), "stderr") == "there is no function has_fruit\n"
    assert feedback_scores(graded.course, "carol")[0] == "0.0 / 5.0"


# -- the hostile student -----------------------------------------------------------------------

def assert_earns_its_points_and_is_stopped(run: Attack) -> None:
    """Graded to the end, in the sandbox, with the loop and the fork bomb stopped by the kernel's Stop."""
    assert run.run.done.returncode == 0, run.run.done.stderr
    log = run.run.done.stderr
    timed_out = f"Timeout waiting for execute reply ({cell_seconds_of(run.course)}s)"
    assert log.count(timed_out) == 2 and log.count("Interrupting kernel") == 2, log
    assert "Kernel died" not in log and "error processing assignment" not in log, log
    assert scores(run.course, "mallory") == MALLORY_EXPECTED
    notebook = autograded(run.course, "mallory")
    assert notebook.metadata.kernelspec.name == "owsandbox"  # nbgrader put the lesson's kernel back
    workspace = BANNER.search(text_of(notebook))
    assert workspace and Path(workspace.group(1)).parent == Path(run.grader.env["TMPDIR"])  # a scratch copy
    loop = cell(notebook, "pipeline_answer")
    assert [name for name, _ in errors(loop)] == ["Interrupted", "CellTimeoutError"]  # the kernel's Stop, nbgrader's
    bomb = next(c for c in notebook.cells if c.source == Hostile.extra_cells()["status_answer"])
    assert "fork: retry: Resource temporarily unavailable" in stream(bomb, "stderr")
    assert [name for name, _ in errors(bomb)] == ["TooManyProcesses", "CellTimeoutError"]
    assert "at most 256 processes" in errors(bomb)[0][1]
    assert stream(cell(notebook, "status_test"), "stdout") == "correct\n"  # the shell works after both


def assert_reads_nothing_of_the_host(run: Attack, secret: str) -> None:
    notebook = autograded(run.course, "mallory")
    tried = stream(cell(notebook, "files_answer"), "stderr")
    for path in run.hostile.reads:
        assert f"cat: {path}: No such file or directory" in tried  # not in the box at all
    assert f"ls: cannot access '{run.course}': No such file or directory" in tried
    notebook_file = run.course / "autograded" / "mallory" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    assert secret not in notebook_file.read_text()


def assert_writes_nothing_outside(run: Attack) -> None:
    before, after = run.before, run.after
    changed = {path for path in before.files.keys() | after.files.keys()
               if before.files.get(path) != after.files.get(path)}
    mallory = f"autograded/mallory/{ASSIGNMENT}"
    assert changed == {"gradebook.db", "autograded/mallory", mallory, f"{mallory}/{ASSIGNMENT}.ipynb"}, changed
    assert after.files[f"{mallory}/{ASSIGNMENT}.ipynb"][0] == "file"  # no link, no FIFO, nothing else of the box's
    assert after.rows == before.rows  # alice's and bob's grades, the assignment, the source cells: as they were
    assert after.canary == before.canary and not any(after.host_files), (after.canary, after.host_files)
    notebook = autograded(run.course, "mallory")
    tried = stream(cell(notebook, "files_answer"), "stderr")
    assert f"{run.course}/pwned.txt: No such file or directory" in tried
    assert not list(Path(run.grader.env["TMPDIR"]).glob("nbgrader-run-*"))  # the scratch copy is gone
    try:
        wait_until(lambda: not left_behind(run.hostile.token), 10, "the sandbox's processes to end")
    except WaitTimeout:
        pytest.fail(f"a process of the sandbox outlived nbgrader: {left_behind(run.hostile.token)}")


def test_a_hostile_submission_earns_its_points_and_its_loops_are_stopped(graded: Course):
    assert_earns_its_points_and_is_stopped(graded.attack)
    assert feedback_scores(graded.course, "mallory") == ("3.0 / 5.0", {"files_test": "1.0 / 1.0",
                                                                       "pipeline_test": "0.0 / 2.0",
                                                                       "status_test": "2.0 / 2.0"})


def test_a_hostile_submission_reads_no_secret(graded: Course):
    assert_reads_nothing_of_the_host(graded.attack, graded.secret)
    assert graded.feedback.done.returncode == 0, graded.feedback.done.stderr
    feedback = graded.course / "feedback" / "mallory" / ASSIGNMENT
    assert sorted(p.name for p in feedback.iterdir()) == [f"{ASSIGNMENT}.html"]  # no loot copied in
    assert graded.secret not in (feedback / f"{ASSIGNMENT}.html").read_text()


def test_a_hostile_submission_changes_nothing_outside_its_sandbox(graded: Course):
    assert_writes_nothing_outside(graded.attack)


def test_a_hostile_submission_graded_by_a_plain_user(graded: Course):
    """The same attack with nbgrader run by a user made with useradd, from the system Python: the
    sandbox hides the grader's files from the box although they all belong to the same user."""
    if graded.plain is None:
        pytest.skip("making the plain grader needs root (CI runs as root)")
    run = graded.plain.result()
    assert_earns_its_points_and_is_stopped(run)
    assert_reads_nothing_of_the_host(run, graded.secret)
    assert_writes_nothing_outside(run)
