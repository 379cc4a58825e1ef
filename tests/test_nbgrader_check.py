"""nbgrader grades a lesson whose test cells are `%%check` cells (tests/nbgrader/source/lesson2): the
course machinery of tests/nbgrader_course.py, with the real `nbgrader generate_assignment` and
`autograde`, a kernelspec with the bubblewrap provider. A check that fails is the cell's error, so
nbgrader scores it zero; one that passes scores its points.

* alice answers everything right: full marks, each check saying `✓`;
* bob gets question 1 right and the other two wrong: the checks say what is wrong, in one line each;
* carol hands in the released notebook untouched and scores nothing.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from nbformat import NotebookNode

from .conftest import require_bwrap
from .nbgrader_course import (
    POINTS,
    Run,
    autograde,
    autograded,
    correct_answers,
    make_course,
    make_grader,
    scores,
    submit,
    wrong_answers,
)

# The module's graded course is made inside the first test's timeout (70 s on a quiet pair of slow
# cores): the timeout is a hang guard only.
pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

LESSON = "lesson2"


@dataclass(frozen=True)
class Graded:
    course: Path
    run: Run


@pytest.fixture(scope="module")
def graded() -> Iterator[Graded]:
    require_bwrap()
    secret = secrets.token_hex(8)
    with ExitStack() as stack:
        base = Path(tempfile.mkdtemp(prefix="owsbx-check-"))
        stack.callback(shutil.rmtree, base, ignore_errors=True)
        grader_folder = Path(tempfile.mkdtemp(prefix="owsbx-g-"))
        stack.callback(shutil.rmtree, grader_folder, ignore_errors=True)
        grader = make_grader(grader_folder, secret)
        course = make_course(base / "course", grader, secret, assignment=LESSON)
        submit(course, "alice", correct_answers(course, LESSON), assignment=LESSON)
        submit(course, "bob", wrong_answers(course, LESSON), assignment=LESSON)
        submit(course, "carol", {}, assignment=LESSON)
        run = autograde(course, grader, assignment=LESSON)
        assert run.done.returncode == 0, run.done.stderr
        yield Graded(course, run)


def cell(notebook: NotebookNode, grade_id: str) -> NotebookNode:
    return next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def stdout(c: NotebookNode) -> str:
    return "".join(o["text"] for o in c.outputs if o["output_type"] == "stream" and o["name"] == "stdout")


def errors(c: NotebookNode) -> list[tuple[str, str]]:
    return [(o["ename"], o["evalue"]) for o in c.outputs if o["output_type"] == "error"]


def test_the_lessons_test_cells_are_checks():
    released = (Path(__file__).parent / "nbgrader" / "source" / LESSON / f"{LESSON}.ipynb").read_text()
    assert released.count('"%%check --points ') == 3


def test_a_correct_submission_passes_every_check(graded: Graded):
    assert scores(graded.course, "alice", LESSON) == POINTS
    notebook = autograded(graded.course, "alice", LESSON)
    assert stdout(cell(notebook, "files_test")) == "✓ 2 checks passed (1 point)\n"
    assert stdout(cell(notebook, "pipeline_test")) == "✓ 1 check passed (2 points)\n"
    assert stdout(cell(notebook, "status_test")) == "✓ 4 checks passed (2 points)\n"
    assert not [c.source for c in notebook.cells if c.cell_type == "code" and errors(c)]


def test_a_wrong_submission_is_told_what_is_wrong_and_scores_zero_there(graded: Graded):
    assert scores(graded.course, "bob", LESSON) == {"files_test": 1.0, "pipeline_test": 0.0, "status_test": 0.0}
    notebook = autograded(graded.course, "bob", LESSON)
    pipeline, status = cell(notebook, "pipeline_test"), cell(notebook, "status_test")
    assert stdout(pipeline) == "✗ $top should be the fruit that appears most often: count again\n"
    assert errors(pipeline) == [("CheckFailed", "1 of 1 check failed (0 of 2 points)")]
    assert stdout(status) == ("✗ has_fruit NAME should succeed for a whole line of data/fruit.txt, and only for "
                              "one\n")
    assert errors(status) == [("CheckFailed", "1 of 4 checks failed (0 of 2 points)")]


def test_an_unanswered_submission_scores_nothing(graded: Graded):
    assert scores(graded.course, "carol", LESSON) == {"files_test": 0.0, "pipeline_test": 0.0, "status_test": 0.0}
    notebook = autograded(graded.course, "carol", LESSON)
    assert stdout(cell(notebook, "files_test")) == "✗ make the file answers/count.txt\n✗ answers/count.txt should " \
                                                   "hold the number of lines, and nothing else\n"
    assert stdout(cell(notebook, "status_test")).startswith("✗ there is no function has_fruit yet\n")
    assert all(errors(cell(notebook, g))[0][0] == "CheckFailed" for g in POINTS)
