"""The README's quick start is two commands, and both stay true: the first sets up the user's
environment (no test tooling in it) and runs the tour, the second is exactly what CI runs."""

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


def quick_start() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start\s+```sh\n(.*?)```", readme, re.S)
    assert block, "the README has no quick start block"
    return [line for line in block.group(1).splitlines() if line.strip()]


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
