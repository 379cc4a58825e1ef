"""The README stays short (at most 1,500 words: the rest is in docs/), and its quick start is two commands
in two labelled blocks, both true: the first sets up the user's environment (no test tooling in it) and
runs the tour, the second is exactly what CI runs.

The first command runs for real, as a clone has the project, and makes the user's environment itself;
only where pip finds the packages is the test's: the wheels tests/prepare.py fetched before any test
(`quick-start`: .ci/run, or the session before its first test), and nothing else, so that no download
counts against the test's timeout and a package the command needs but nobody fetched fails it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from . import prepare
from .waiting import patience

ROOT = Path(__file__).resolve().parents[1]
TEST_ONLY = ("pytest", "playwright", "nbgrader", "jupyterhub", "papermill", "jupyter-kernel-gateway",
             "jupyter_kernel_test", "opensandbox", "hypothesis", "asciinema")  # (pexpect comes with IPython)


README_WORDS = 1_500


quick_start = prepare.quick_start  # the quick start's commands (the user's, then the contributors')


@pytest.mark.unit
def test_the_readme_is_at_most_1500_words_and_links_its_screenshot() -> None:
    readme = (ROOT / "README.md").read_text()
    words = len(readme.split())
    assert words <= README_WORDS, f"the README has {words} words; move the detail into docs/"
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", readme)
    assert pictures == ["docs/_static/jupyterlab.png"] and (ROOT / pictures[0]).is_file()
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    missing = [link for link in links if not (ROOT / link).exists()]
    assert links and not missing, missing


@pytest.mark.unit
def test_the_quick_start_is_two_commands_and_ci_runs_the_second() -> None:
    first, second = quick_start()
    assert "owsandbox tour" in first and "pytest" in second
    assert second in (ROOT / ".ci" / "run").read_text().splitlines()


@pytest.mark.unit
def test_the_users_environment_has_no_test_tooling() -> None:
    first, _ = quick_start()
    extras = re.findall(r"\.\[([a-z,]+)\]", first)
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *(dep for extra in extras for name in extra.split(",")
                                          for dep in project["optional-dependencies"][name])]
    names = [re.split(r"[<>=\[ ]", dep, maxsplit=1)[0].lower() for dep in wanted]
    assert not set(names) & set(TEST_ONLY), names


@pytest.fixture
def quick_start_wheels() -> Path:
    """The wheels of everything the README's first command installs (tests/prepare.py made them before
    the tests); the test fails naming the command that makes them when they are missing or stale."""
    if not prepare.quick_start_made():
        pytest.fail(f"the quick start's wheels are missing or stale ({prepare.what('quick-start')}): run "
                    "`python3 tests/prepare.py quick-start`", pytrace=False)
    return prepare.QUICK_START_WHEELS


@pytest.mark.needs("quick-start")
@pytest.mark.timeout(1800)  # a hang guard: it installs the user's environment (offline, from the wheels), 445 s and
# over 480 s with two test runs at once
def test_the_first_command_sets_up_the_user_environment_and_runs_the_tour(tmp_path: Path,
                                                                          quick_start_wheels: Path) -> None:
    """Run for real, in a copy of the project as a clone has it (the command makes `.venv` where it runs),
    with pip given the prepared wheels and no index: the command itself makes the environment."""
    copy = tmp_path / "owsandbox"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.egg-info", ".cache",
                                                               ".pytest_cache", ".ruff_cache", "dist", "build"))
    first, _ = quick_start()
    pip_offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(quick_start_wheels), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(["bash", "-c", first], cwd=copy, capture_output=True, text=True, timeout=patience(480),
                          env={**os.environ, **pip_offline})
    refetch = f"rm -r {quick_start_wheels} && python3 tests/prepare.py quick-start"
    assert done.returncode == 0, (done.stdout[-3000:] + done.stderr[-3000:]
                                  + f"\n(pip was given only {quick_start_wheels}: `{refetch}` fetches them again)")
    assert "│ %sandbox" in done.stdout and "[sandbox:" in done.stdout
    listed = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, timeout=120).stdout.lower()
    installed = {line.split("==")[0].replace("_", "-") for line in listed.splitlines()}
    leaked = installed & {name.replace("_", "-") for name in TEST_ONLY}
    assert not leaked, f"test tooling in the user's environment: {sorted(leaked)}"
    assert "jupyterlab" in installed and "owsandbox" in installed
    python = str(copy / ".venv" / "bin" / "python")
    found = subprocess.run([python, "-c", "import owsandbox; print(owsandbox.__file__)"], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path)
    assert found.stdout.strip() == str(copy / "owsandbox" / "__init__.py"), found  # the clone's own code, editable
    assert shlex.split(first)[0] == "python3" and sys.version_info >= (3, 10)
