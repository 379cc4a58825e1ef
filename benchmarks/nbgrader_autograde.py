"""How long `nbgrader autograde` takes on the owsandbox kernel, per submission of tests/test_nbgrader.py.

The course of tests/nbgrader_course.py (the bash lesson in tests/nbgrader/, its nbgrader_config.py with
a 5 s cell timeout, a kernelspec with the bubblewrap provider) is built once; then each round submits
the correct, the wrong and the hostile notebook as three new students and autogrades each with its own
`nbgrader autograde` (one nbgrader start each, as a grader who grades one submission at a time), then
all three in one run, then `generate_feedback` for them. The hostile one loops until the timeout and
forks until the process limit, so it costs two timeouts more than the others. Also measured: an
`nbgrader autograde` with no submission to grade (nbgrader's own start and end), and the start of the
kernel and its sandbox to the first cell's result.

Run: `python benchmarks/nbgrader_autograde.py [--rounds N]` from the repository root, as root or as a
user who can run bubblewrap.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.nbgrader_course import (  # noqa: E402
    Hostile,
    autograde,
    correct_answers,
    generate_feedback,
    make_course,
    make_grader,
    scores,
    submit,
    wrong_answers,
)


def kernel_start(grader, folder: Path) -> float:
    """From starting the grader's kernel (as nbclient does for nbgrader) to the first cell's reply."""
    from jupyter_client.manager import start_new_kernel

    os.environ["JUPYTER_PATH"] = grader.env["JUPYTER_PATH"]  # where start_new_kernel looks for the spec
    started = time.perf_counter()
    manager, client = start_new_kernel(kernel_name="owsandbox", cwd=str(folder), env=grader.env)
    try:
        reply = client.execute_interactive("true", timeout=60, output_hook=lambda message: None)
        assert reply["content"]["status"] == "ok", reply
        return time.perf_counter() - started
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    secret = secrets.token_hex(8)
    base = Path(tempfile.mkdtemp(prefix="owsbx-nbg-bench-"))
    canary = base / "canary.txt"
    canary.write_text(f"{secret}\n")
    try:
        grader = make_grader(base / "g", secret)
        started = time.perf_counter()
        course = make_course(base / "course", grader, secret)
        print(f"generate_assignment and the gradebook: {time.perf_counter() - started:.2f} s")
        figures: dict[str, list[float]] = {}
        for number in range(args.rounds):
            figures.setdefault("kernel start to first cell result", []).append(kernel_start(grader, base))
            nothing = autograde(course, grader, f"nobody{number}")
            figures.setdefault("autograde with nothing to grade", []).append(nothing.seconds)
            hostile = Hostile(course, grader.home, canary, secrets.token_hex(6))
            kinds = {"correct": (correct_answers(course), None), "wrong": (wrong_answers(course), None),
                     "hostile": (hostile.answers(course), hostile.extra_cells())}
            expected = {"correct": 5.0, "wrong": 1.0, "hostile": 3.0}
            for kind, (answers, extra) in kinds.items():
                student = f"{kind}{number}"
                submit(course, student, answers, before=extra)
                run = autograde(course, grader, student)
                assert run.done.returncode == 0, run.done.stderr
                assert sum(scores(course, student).values()) == expected[kind], (kind, scores(course, student))
                figures.setdefault(f"autograde, {kind} submission alone", []).append(run.seconds)
                again = f"together{number}-{kind}"
                submit(course, again, answers, before=extra)
            run = autograde(course, grader, f"together{number}-*")
            assert run.done.returncode == 0, run.done.stderr
            figures.setdefault("autograde, the three in one run", []).append(run.seconds)
            feedback = generate_feedback(course, grader)
            assert feedback.done.returncode == 0, feedback.done.stderr
            figures.setdefault("generate_feedback, for every submission so far", []).append(feedback.seconds)
        width = max(len(name) for name in figures)
        for name, values in figures.items():
            values_text = ", ".join(f"{v:.2f}" for v in values)
            print(f"{name:<{width}}  median {statistics.median(values):6.2f} s   ({values_text})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
