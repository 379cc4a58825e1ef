"""Whoever logs in the hub's class of system users holds the machine's classroom (tests/hub.py,
`classroom_users`): a test's or a benchmark's hub, since a hub's stop ends every process of the students."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)]


def test_every_module_that_makes_the_hubs_students_holds_the_classroom() -> None:
    makers = []
    for path in sorted([*ROOT.joinpath("tests").glob("*.py"), *ROOT.joinpath("benchmarks").glob("*.py")]):
        if path.name in ("hub.py", Path(__file__).name):
            continue
        tree = ast.parse(path.read_text(), str(path))
        # The hub's students: class_of with its default prefix (another prefix names other users).
        if any(not call.keywords and len(call.args) < 2 for call in _calls(tree, "class_of")):
            makers.append(path.relative_to(ROOT))
            assert _calls(tree, "classroom_users"), f"{path.relative_to(ROOT)} logs in the hub's students " \
                "without holding the classroom (tests/hub.py, classroom_users)"
    assert {str(path) for path in makers} >= {"tests/test_jupyterhub.py", "benchmarks/hub_memory.py"}, makers
