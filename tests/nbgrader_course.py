"""An nbgrader course graded on the owsandbox kernel, for tests/test_nbgrader.py and benchmarks/nbgrader_autograde.py.

The assignment is `tests/nbgrader/source/lesson1/lesson1.ipynb`, a bash lesson with three answer cells
and a locked test cell after each; the configuration is `tests/nbgrader/nbgrader_config.py`. Both are
copied into a course folder, and the real `nbgrader` commands run there as subprocesses, as a grader
runs them: by root with this environment's Python, or by a plain user with the system Python (see
plain_python.py), each with a kernelspec of its own found through JUPYTER_PATH.

The grader's secrets carry one random token, so a test can look for any of them in what a student
gets back: it is in the course's copy of the solutions (so also in the gradebook, which keeps the
source cells), in `nbgrader_config.py`, in a student's name in the gradebook, in the grader's home, in a
file in the host's temporary folder, and in the grader's environment.
"""

from __future__ import annotations

import hashlib
import math
import os
import pwd
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from .plain_python import as_user
from .waiting import patience

HERE = Path(__file__).resolve().parent / "nbgrader"
ASSIGNMENT = "lesson1"
KERNEL = "owsandbox"  # the name in the lesson's metadata; each grader's JUPYTER_PATH finds its own spec by it
# 256 processes: where no cgroup can be made (a plain grader) the limit counts every process and thread of
# the grader's account, nbgrader's and the kernel's (about 30) included, and a box at 128 had no room left to
# start on a loaded machine
LIMITS = ("pids=256", "memory=1G")
STUDENTS = ("alice", "bob", "carol", "mallory")
POINTS = {"files_test": 1.0, "pipeline_test": 2.0, "status_test": 2.0}
ALEMBIC = "#!{python}\nimport sys\nfrom alembic.config import main\nsys.exit(main())\n"


@dataclass(frozen=True)
class Grader:
    """Who runs nbgrader, with which Python and environment; `user` None is the current user."""

    python: str
    env: dict[str, str]
    home: Path
    user: str | None = None

    def run(self, course: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`nbgrader ARGS` in the course folder (nbgrader takes the folder it runs in as the course's root)."""
        argv = [self.python, "-m", "nbgrader", *args]
        if self.user is not None:
            argv = as_user(self.user, argv, self.env, clear_env=True)
        return subprocess.run(argv, cwd=course, env=self.env, capture_output=True, text=True, timeout=timeout)


def make_grader(folder: Path, secret: str, python: str = sys.executable, base_env: dict[str, str] | None = None,
                user: str | None = None) -> Grader:
    """A grader whose home (with a secret key in it), temporary folder, kernelspec and `alembic` launcher
    (nbgrader runs `alembic` from PATH) live under `folder`, which must be readable by `user`. The
    kernel keeps its sockets in the temporary folder: `folder` must be a short path (AF_UNIX allows 107
    bytes), as a new folder in the system's temporary folder is.

    The kernelspec is this project's, named like the lesson's, with the bubblewrap provider named
    outright (a machine where bubblewrap does not work fails instead of grading without a sandbox)
    and tighter limits than the default, so a fork bomb meets the limit fast.
    """
    base = dict(base_env or {"PATH": f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin"})
    home, tmp, tools, specs = folder / "home", folder / "tmp", folder / "bin", folder / "kernels"
    for made in (home, home / ".ssh", tmp, tools, specs):
        made.mkdir(parents=True, exist_ok=True)
    (home / ".ssh" / "id_ed25519").write_text(f"-----BEGIN OPENSSH PRIVATE KEY----- {secret}-home\n")
    (home / "grades-notes.txt").write_text(f"notes about the course {secret}-home-notes\n")
    (tools / "alembic").write_text(ALEMBIC.format(python=python))
    env = {**base, "HOME": str(home), "TMPDIR": str(tmp), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PATH": f"{tools}:{base['PATH']}", "GRADER_API_TOKEN": f"{secret}-environment",
           "JUPYTER_PATH": str(specs / "share" / "jupyter")}
    subprocess.run([python, "-m", "owsandbox.cli", "install", "--prefix", str(specs), "--name", KERNEL,
                    "--provider", "bwrap", *[f"--limit={limit}" for limit in LIMITS]],
                   env=env, check=True, capture_output=True)
    for root, folders, files in os.walk(folder):
        for name in folders:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o755 if Path(root) == tools else 0o644)
    if user is not None:
        owner = pwd.getpwnam(user)
        for path in (home, tmp):
            chown_tree(path, owner)
    os.chmod(home, 0o700)
    os.chmod(tmp, 0o700)
    return Grader(python, env, home, user)


def chown_tree(path: Path, owner: pwd.struct_passwd) -> None:
    """Give a folder and everything in it to `owner` (links themselves, never what they point to)."""
    for root, folders, files in os.walk(path):
        for name in [".", *folders, *files]:
            os.lchown(os.path.join(root, name), owner.pw_uid, owner.pw_gid)


def cell_seconds() -> int:
    """nbgrader's limit on a cell, in whole seconds: 5 on a quiet machine, more on a busy one."""
    return max(5, math.ceil(patience(5)))


def cell_seconds_of(course: Path) -> int:
    """The limit on a cell that `make_course` wrote into the course's config."""
    found = re.search(r"^c\.Execute\.timeout = (\d+) ", (course / "nbgrader_config.py").read_text(), re.M)
    assert found, "the course's config names no cell limit"
    return int(found.group(1))


def make_course(folder: Path, grader: Grader, secret: str, assignment: str = ASSIGNMENT) -> Path:
    """A course folder with the lesson released (`nbgrader generate_assignment`) and the students in
    its gradebook; the grader's copy of the solutions and config carry the secret."""
    course = folder
    (course / "source").mkdir(parents=True)
    config = (HERE / "nbgrader_config.py").read_text()
    # 5 s a cell, stretched on a busy machine so that only the loop and the fork bomb run out of time
    config = config.replace("c.Execute.timeout = 5 ", f"c.Execute.timeout = {cell_seconds()} ", 1)
    (course / "nbgrader_config.py").write_text(f"{config}\n# grader's own note: {secret}-config\n")
    shutil.copytree(HERE / "source" / assignment, course / "source" / assignment)
    source = course / "source" / assignment / f"{assignment}.ipynb"
    notebook = nbformat.read(source, as_version=4)
    for cell in notebook.cells:
        cell.source = cell.source.replace("### BEGIN SOLUTION\n", f"### BEGIN SOLUTION\n# grader: {secret}-solution\n")
    nbformat.write(notebook, source)
    if grader.user is not None:
        chown_tree(course, pwd.getpwnam(grader.user))
    done = grader.run(course, "generate_assignment", assignment)
    if done.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment failed:\n{done.stderr}")
    add_students(course, grader, secret)
    return course


def add_students(course: Path, grader: Grader, secret: str) -> None:
    """The students, one of them with a name only the grader should know (`nbgrader db student add`
    would do the same, one nbgrader start per student)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "shell101") as gradebook:
        for student in STUDENTS:
            gradebook.update_or_create_student(student, last_name=f"{secret}-gradebook" if student == "alice" else "")
    if grader.user is not None:
        chown_tree(course, pwd.getpwnam(grader.user))


# -- submissions -------------------------------------------------------------------------------

def answer(course: Path, grade_id: str, assignment: str = ASSIGNMENT) -> str:
    """The source's answer for one cell, without the solution markers (and without the grader's note)."""
    notebook = nbformat.read(course / "source" / assignment / f"{assignment}.ipynb", as_version=4)
    cell = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    return "\n".join(line for line in cell.source.splitlines()
                     if "SOLUTION" not in line and not line.startswith("# grader: "))


def correct_answers(course: Path, assignment: str = ASSIGNMENT) -> dict[str, str]:
    return {grade_id: answer(course, grade_id, assignment)
            for grade_id in ("files_answer", "pipeline_answer", "status_answer")}


def wrong_answers(course: Path, assignment: str = ASSIGNMENT) -> dict[str, str]:
    """Question 1 right; the pipeline forgets to sort by count; the function matches parts of lines."""
    return {"files_answer": answer(course, "files_answer", assignment),
            "pipeline_answer": "top=$(sort data/fruit.txt | uniq -c | head -n 1 | awk '{print $2}')\n"
                               'echo "the most common fruit: $top"',
            "status_answer": 'has_fruit() {\n    grep -q -- "$1" data/fruit.txt\n}'}


@dataclass(frozen=True)
class Hostile:
    """What the hostile submission reaches for: the paths it tries to read, write or plant links to,
    and the names of what it tries to leave on the host."""

    course: Path
    grader_home: Path
    host_canary: Path
    token: str

    @property
    def reads(self) -> tuple[str, ...]:
        """The grader's files it tries to read, by their paths on the host."""
        c = self.course
        return (f"{c}/gradebook.db", f"{c}/nbgrader_config.py", f"{c}/source/{ASSIGNMENT}/{ASSIGNMENT}.ipynb",
                f"{self.grader_home}/.ssh/id_ed25519", f"{self.grader_home}/grades-notes.txt", str(self.host_canary))

    @property
    def host_files(self) -> list[Path]:
        """Files it tries to create in the host's shared temporary folders."""
        return [Path(folder) / f"owsbx-nbgrader-pwned-{self.token}" for folder in ("/tmp", "/var/tmp", "/dev/shm")]

    def answers(self, course: Path) -> dict[str, str]:
        c = self.course
        reads = " ".join(self.reads)
        files = f"""# read the grader's files, the gradebook, the solutions, the grader's home, the host's /tmp
cat {reads}
ls -la {c} {c}/source {self.grader_home} /home /root
env; cat /proc/*/environ | tr '\\0' '\\n' | grep -i token
# write outside: the course, another student's grades, the host's /tmp
echo pwned > {c}/pwned.txt; echo pwned >> {c}/gradebook.db; rm -rf {c}/source
echo pwned > {c}/autograded/alice/{ASSIGNMENT}/{ASSIGNMENT}.ipynb
for f in {" ".join(str(p) for p in self.host_files)}; do echo pwned > "$f"; done
echo pwned > {self.host_canary}
# plant links and a FIFO for the grader to follow after the run, and leave a process behind
ln -s {c}/gradebook.db loot-gradebook.db; ln -s {c}/nbgrader_config.py loot-config.py
ln -s {self.grader_home}/.ssh/id_ed25519 loot-key; ln -s {self.host_canary} loot-canary.txt
rm -f {ASSIGNMENT}.ipynb; ln -s {c}/nbgrader_config.py {ASSIGNMENT}.ipynb; mkfifo trap.fifo
setsid bash -c 'exec -a owsbx-left-{self.token} sleep 600' > /dev/null 2>&1 &
# and answer the question
{answer(course, "files_answer")}"""
        return {"files_answer": files, "pipeline_answer": "while :; do :; done",
                "status_answer": answer(course, "status_answer")}

    @staticmethod
    def extra_cells() -> dict[str, str]:
        """Cells it adds of its own, before the answer cell named: a fork bomb in the foreground."""
        return {"status_answer": "bomb() { bomb | bomb; }; bomb"}


def submit(course: Path, student: str, answers: dict[str, str], before: dict[str, str] | None = None,
           kernel: dict[str, str] | None = None, owner: str | None = None, assignment: str = ASSIGNMENT) -> Path:
    """The released notebook with `answers` in its answer cells (by grade_id) and the cells of
    `before` added before the answer cell they name, as `submitted/STUDENT/lesson1/lesson1.ipynb`."""
    notebook = nbformat.read(course / "release" / assignment / f"{assignment}.ipynb", as_version=4)
    cells = []
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if before and grade_id in before:
            cells.append(nbformat.v4.new_code_cell(before[grade_id]))
        if grade_id in answers:
            cell.source = answers[grade_id]
        cells.append(cell)
    notebook.cells = cells
    if kernel is not None:
        notebook.metadata["kernelspec"] = kernel
    folder = course / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{assignment}.ipynb"
    nbformat.write(notebook, path)
    if owner is not None:
        chown_tree(course / "submitted", pwd.getpwnam(owner))
    return path


@dataclass(frozen=True)
class Run:
    """One nbgrader command: its result and how long it took."""

    done: subprocess.CompletedProcess[str]
    seconds: float


def autograde(course: Path, grader: Grader, students: str = "*", assignment: str = ASSIGNMENT) -> Run:
    """`nbgrader autograde lesson1` for the students whose names match the glob `students`."""
    args = ["autograde", assignment, f"--student={students}"]
    started = time.monotonic()
    done = grader.run(course, *args)
    return Run(done, time.monotonic() - started)


def generate_feedback(course: Path, grader: Grader) -> Run:
    started = time.monotonic()
    done = grader.run(course, "generate_feedback", ASSIGNMENT)
    return Run(done, time.monotonic() - started)


# -- reading the results -----------------------------------------------------------------------

def scores(course: Path, student: str, assignment: str = ASSIGNMENT) -> dict[str, float]:
    """The gradebook's automatic score of each test cell for the student."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "shell101") as gradebook:
        submission = gradebook.find_submission_notebook(assignment, assignment, student)
        return {grade.name: grade.auto_score for grade in submission.grades}


def autograded(course: Path, student: str, assignment: str = ASSIGNMENT) -> NotebookNode:
    return nbformat.read(course / "autograded" / student / assignment / f"{assignment}.ipynb", as_version=4)


def gradebook_rows(course: Path, leave_out: str | None = None) -> dict[str, set[tuple[object, ...]]]:
    """Every row of every table of the gradebook, less the rows that belong to the student `leave_out`
    (their student row, submission, submitted notebook, grades and comments)."""
    connection = sqlite3.connect(f"file:{course / 'gradebook.db'}?mode=ro", uri=True)
    try:
        tables = [name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = {table: set(connection.execute(f'SELECT * FROM "{table}"')) for table in tables}
        if leave_out is not None:
            submissions = {i for (i,) in connection.execute("SELECT id FROM submitted_assignment WHERE student_id = ?",
                                                            (leave_out,))}
            notebooks = {i for (i, a) in connection.execute("SELECT id, assignment_id FROM submitted_notebook")
                         if a in submissions}
            theirs = {"student": (0, {leave_out}), "submitted_assignment": (0, submissions),
                      "submitted_notebook": (0, notebooks), "grade": (1, notebooks), "comment": (1, notebooks)}
            for table, (column, ids) in theirs.items():
                rows[table] = {row for row in rows[table] if row[column] not in ids}
        return rows
    finally:
        connection.close()


def tree(folder: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under `folder`: its kind, mode and (for a file) sha256, by path, links not followed."""
    found: dict[str, tuple[str, int, str]] = {}
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    entry = ("file", info.st_mode, hashlib.sha256(handle.read()).hexdigest())
            elif stat.S_ISLNK(info.st_mode):
                entry = ("link", info.st_mode, os.readlink(path))
            else:
                entry = ("folder" if stat.S_ISDIR(info.st_mode) else "special", info.st_mode, "")
            found[os.path.relpath(path, folder)] = entry
    return found


def text_of(notebook: NotebookNode) -> str:
    """All that the cells showed: streams, errors and displayed data."""
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts += [output.get("ename", ""), output.get("evalue", ""), *output.get("traceback", [])]
            parts += [str(value) for value in output.get("data", {}).values()]
    return "\n".join(parts)
