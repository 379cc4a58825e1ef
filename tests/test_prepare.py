"""tests/prepare.py: the pins of the programs tests need live in one place, and a changed pin makes
the environment again (what .ci/run and the test session install before any test)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from . import prepare

pytestmark = pytest.mark.unit


def test_every_environment_has_pinned_requirements_and_ci_makes_them_all() -> None:
    ci = (prepare.ROOT / ".ci" / "run").read_text()
    for name, env in prepare.ENVIRONMENTS.items():
        assert env.pins and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", pin) for pin in env.pins), env.pins
        assert re.search(rf"tests/prepare\.py [^\n]*\b{name}\b", ci), f".ci/run does not make {name}"
    assert re.search(r"tests/prepare\.py [^\n]*\$npm\n", ci) and "npm=npm" in ci, ".ci/run installs no npm packages"
    assert re.search(r"tests/prepare\.py [^\n]*\bquick-start\b", ci), ".ci/run does not fetch the quick start's wheels"


def test_an_environment_counts_as_made_only_from_todays_requirements(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(prepare, "REQUIREMENTS", tmp_path)
    (tmp_path / "tool.txt").write_text("# a comment\ntool==1.0  # why\n")
    env = prepare.Environment("tool", tmp_path / "venv", "tool")
    assert env.pins == ["tool==1.0"] and env.command == "python3 tests/prepare.py tool"
    assert not env.made()
    env.program.parent.mkdir(parents=True)
    env.program.write_text("")
    assert not env.made()  # a program alone (an environment made otherwise) is made again
    (env.folder / prepare.MADE_FROM).write_text((tmp_path / "tool.txt").read_text())
    assert env.made()
    (tmp_path / "tool.txt").write_text("tool==1.1\n")  # the pin moved
    assert not env.made()


def test_the_marked_tests_name_known_needs() -> None:
    names = set()
    for path in (prepare.ROOT / "tests").glob("test_*.py"):
        for found in re.findall(r"pytest\.mark\.needs\(([^)]*)\)", path.read_text()):
            names |= {name.strip().strip("\"'") for name in found.split(",")}
    assert names and names <= set(prepare.NEEDS), names - set(prepare.NEEDS)


def test_the_quick_start_wheels_are_for_the_readmes_first_command_and_its_build() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    pyproject = tomllib.loads(prepare.PYPROJECT.read_text())
    first = prepare.quick_start()[0]
    assert f"pip install {' '.join(prepare.quick_start_install())}".replace("'", "") in first.replace("'", "")
    assert prepare.build_requires() == pyproject["build-system"]["requires"]
    wanted = prepare.wheels_for()
    for requirement in [*pyproject["project"]["dependencies"], *pyproject["project"]["optional-dependencies"]["lab"]]:
        assert f"\n{requirement}\n" in wanted, requirement
    assert "pytest" not in wanted  # the test extra is not what the command installs


def test_an_extra_that_names_the_projects_own_extras_brings_theirs() -> None:
    tomllib = pytest.importorskip("tomllib")
    optional = tomllib.loads(prepare.PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert "owsandbox[docs]" in optional["test"]
    brought = prepare._dependencies(["-e", ".[test]"])
    assert set(optional["docs"]) <= set(brought) and "owsandbox[docs]" not in brought


def test_the_quick_start_wheels_are_fetched_again_when_the_command_or_a_requirement_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme, pyproject = tmp_path / "README.md", tmp_path / "pyproject.toml"
    readme.write_text(prepare.README.read_text())
    pyproject.write_text(prepare.PYPROJECT.read_text())
    monkeypatch.setattr(prepare, "README", readme)
    monkeypatch.setattr(prepare, "PYPROJECT", pyproject)
    monkeypatch.setattr(prepare, "QUICK_START_WHEELS", tmp_path / "wheels")
    assert not prepare.quick_start_made()  # none fetched
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / prepare.WHEELS_FOR).write_text(prepare.wheels_for())
    assert prepare.quick_start_made()
    pyproject.write_text(pyproject.read_text().replace('"jupyterlab>=4.0", "jupyter-console>=6.6"]',
                                                       '"jupyterlab>=4.1", "jupyter-console>=6.6"]', 1))
    assert not prepare.quick_start_made()  # a requirement of the lab extra moved
    (tmp_path / "wheels" / prepare.WHEELS_FOR).write_text(prepare.wheels_for())
    readme.write_text(readme.read_text().replace("install -e '.[lab]'", "install -e '.[lab,gateway]'", 1))
    assert "pycryptodomex>=3.9" in prepare.wheels_for()
    assert not prepare.quick_start_made()  # the command installs another extra
