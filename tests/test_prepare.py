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
    assert "tests/prepare.py npm" in ci


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
