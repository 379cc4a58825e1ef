"""The workspace guard's answer holds no path inside another it hides: the empty folder in its place
covers it, and a mount inside it could not be made."""

from __future__ import annotations

import pytest

from owsandbox.host.isolation.guard import Guard, guard_workspace

pytestmark = pytest.mark.unit


def test_a_hidden_path_inside_a_hidden_one_is_dropped_with_its_reason() -> None:
    guard = Guard("/home/u")
    guard.hide("/home/u/.cache/owsandbox/run", "this machine's private state folder")
    guard.hide("/home/u/.cache", "a dot entry of the home")
    guard.hide("/home/u/.cacheless", "a dot entry of the home")  # a sibling, not inside
    guard.read_only.append("/home/u/.cache/pip")
    guard.read_only.append("/home/u/project/.venv")
    guard.settle()
    assert guard.hidden == ["/home/u/.cache", "/home/u/.cacheless"]
    assert guard.read_only == ["/home/u/project/.venv"]
    assert "/home/u/.cache/owsandbox/run" not in guard.why


def test_a_home_workspace_hides_its_cache_once(tmp_path) -> None:
    home = tmp_path / "home"
    state = home / ".cache" / "owsandbox" / "run"
    state.mkdir(parents=True)
    guard = guard_workspace(str(home), str(home), [str(state)], env={})
    assert str(home / ".cache") in guard.hidden and str(state) not in guard.hidden
