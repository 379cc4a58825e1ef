"""nbgrader's configuration for a course whose notebooks run on the owsandbox kernel (bash in a sandbox).

tests/test_nbgrader.py grades with exactly this file, copied into the course folder (nbgrader reads
`nbgrader_config.py` from the folder it runs in, which is then the course's root). Four things matter:

* nbgrader has no code stub for bash, and without one `generate_assignment` refuses a bash notebook.
* The cell timeout: a cell still running after it is stopped with the kernel's Stop (an interrupt
  request, `interrupt_mode: message`), counts as an error, and the cells after it still run.
* How long nbclient waits, after a reply or a Stop, for the kernel to say it is idle; past it,
  nbgrader gives up on the whole submission. Stop takes milliseconds, at most 4 s when it has to
  kill what ignores SIGINT; 4 s is nbclient's default, too tight for a busy machine.
* The kernel runs in a throw-away copy of the notebook's folder. By default nbgrader runs it in the
  autograded folder, and afterwards, as the grader, chmods every file there (following symbolic
  links), writes the notebook over whatever is at its name (following a link, or blocking on a FIFO),
  and `generate_feedback` copies every other file there into the feedback it returns to the student
  (following links again). The sandbox can write its folder, so a submission that plants
  `ln -s ../../../gradebook.db loot` there would get the gradebook in its feedback. Nothing the box
  writes reaches the course's folders with this class.
"""

import shutil
import tempfile

from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute

c = get_config()  # noqa: F821 - provided by the config loader

c.CourseDirectory.course_id = "shell101"
c.ClearSolutions.code_stub = {"bash": "# YOUR CODE HERE\necho 'no answer yet' >&2; false"}
c.Execute.timeout = 5  # seconds a cell may run; a real course would allow more (nbgrader's default is 30)
c.Execute.interrupt_on_timeout = True  # nbgrader's default: Stop the cell, go on with the next
c.Execute.iopub_timeout = 15


class ExecuteInScratch(Execute):
    """nbgrader's Execute, with the kernel started in a private copy of the notebook's folder that is
    removed afterwards (the kernel, and with it the sandbox, has ended by then)."""

    def preprocess(self, nb, resources=None, km=None):
        folder = resources["metadata"]["path"]
        with tempfile.TemporaryDirectory(prefix="nbgrader-run-", ignore_cleanup_errors=True) as scratch:
            shutil.copytree(folder, scratch, symlinks=True, dirs_exist_ok=True)
            resources["metadata"]["path"] = scratch
            try:
                return super().preprocess(nb, resources, km)
            finally:
                resources["metadata"]["path"] = folder


c.Autograde.autograde_preprocessors = [ExecuteInScratch if step is Execute else step
                                       for step in Autograde.class_traits()["autograde_preprocessors"].default()]
