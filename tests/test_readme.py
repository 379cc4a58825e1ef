"""The README stays short (at most 1,500 words: the rest is in docs/), and its quick start is two commands
in two labelled blocks, both true: the first sets up the user's environment (no test tooling in it) and
runs the tour, the second is exactly what CI runs."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_ONLY = ("pytest", "playwright", "nbgrader", "jupyterhub", "papermill", "jupyter-kernel-gateway",
             "jupyter_kernel_test", "opensandbox", "hypothesis", "asciinema")  # (pexpect comes with IPython)


README_WORDS = 1_500


def quick_start() -> list[str]:
    """The quick start's commands: its `sh` blocks, one command each (the user's, then the contributors')."""
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", readme, re.S | re.M)
    assert section, "the README has no quick start"
    blocks = re.findall(r"^```sh\n(.*?)^```", section.group(1), re.S | re.M)
    commands = [[line for line in block.splitlines() if line.strip()] for block in blocks]
    assert [len(block) for block in commands] == [1, 1], f"two blocks of one command each: {commands}"
    return [block[0] for block in commands]


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


@pytest.mark.timeout(900)  # it installs the user's environment, as the README's first command does: minutes when busy
def test_the_first_command_sets_up_the_user_environment_and_runs_the_tour(tmp_path: Path) -> None:
    """Run for real, in a copy of the project as a clone has it (the command makes `.venv` where it runs)."""
    copy = tmp_path / "owsandbox"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.egg-info",
                                                               ".pytest_cache", ".ruff_cache", "dist", "build"))
    first, _ = quick_start()
    done = subprocess.run(["bash", "-c", first], cwd=copy, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "│ %sandbox" in done.stdout and "[sandbox:" in done.stdout
    listed = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, timeout=120).stdout.lower()
    installed = {line.split("==")[0].replace("_", "-") for line in listed.splitlines()}
    leaked = installed & {name.replace("_", "-") for name in TEST_ONLY}
    assert not leaked, f"test tooling in the user's environment: {sorted(leaked)}"
    assert "jupyterlab" in installed and "owsandbox" in installed
    assert shlex.split(first)[0] == "python3" and sys.version_info >= (3, 10)
