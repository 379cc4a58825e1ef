"""The workspace guard's answer holds no path inside another it hides: the empty folder in its place
covers it, and a mount inside it could not be made. And it pins every folder above a protected path,
binds nothing through a link, and keeps the top of a workspace on the kernel's Python path read-only."""

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


# -- a protected path is protected whole ----------------------------------------------------------------

def _environment(path) -> None:
    path.mkdir(parents=True)
    (path / "pyvenv.cfg").write_text("home = /usr/bin\n")


def test_every_folder_above_a_protected_path_is_pinned_parents_first(tmp_path) -> None:
    workspace = tmp_path / "ws"
    _environment(workspace / "src" / "proj" / ".venv")
    (workspace / "repo" / ".git" / "hooks").mkdir(parents=True)  # no config: git is not asked (no process)
    (workspace / "data" / "deep").mkdir(parents=True)
    guard = guard_workspace(str(workspace), str(tmp_path / "elsewhere"), env={})
    paths = {name: str(workspace / name) for name in ("src", "src/proj", "repo", "repo/.git", "data")}
    assert guard.pinned == [paths["repo"], paths["src"], paths["repo/.git"], paths["src/proj"]]
    assert str(workspace / "src/proj/.venv") in guard.read_only and str(workspace) not in guard.pinned
    order = [path for path, _ in guard.mounts_in_order()]
    assert order.index(paths["src/proj"]) < order.index(str(workspace / "src/proj/.venv"))
    assert order.index(paths["repo/.git"]) < order.index(str(workspace / "repo/.git/hooks"))
    assert "src/proj" in guard.summary()["pinned"]


def test_a_submodules_git_link_is_read_only_and_pinned_from_above(tmp_path) -> None:
    """A submodule's `.git` file names its repository (`gitdir: ...`): rewritten, it would lead the host's
    git to a repository the box made."""
    workspace = tmp_path / "ws"
    (workspace / "vendor" / "lib").mkdir(parents=True)
    (workspace / "vendor" / "lib" / ".git").write_text("gitdir: ../../.git/modules/lib\n")
    guard = guard_workspace(str(workspace), str(tmp_path / "elsewhere"), env={})
    assert guard.read_only == [str(workspace / "vendor/lib/.git")]
    assert guard.pinned == [str(workspace / "vendor"), str(workspace / "vendor/lib")]


def test_a_path_left_writable_pins_nothing(tmp_path) -> None:
    workspace = tmp_path / "ws"
    _environment(workspace / "src" / ".venv")
    (workspace / "src" / ".git").mkdir()
    guard = guard_workspace(str(workspace), str(tmp_path / "elsewhere"), env={"OWSANDBOX_WRITABLE": "src"})
    assert guard.pinned == [] and guard.read_only == []


def test_a_home_top_link_is_never_bound_and_a_missing_target_is_said(tmp_path) -> None:
    home = tmp_path / "home"
    (home / "dotfiles").mkdir(parents=True)
    (home / "dotfiles" / "bashrc").write_text("# mine\n")
    (home / ".bashrc").symlink_to("dotfiles/bashrc")
    (home / "scratch").symlink_to("../..")
    (home / "gone").symlink_to("nowhere")
    (home / "notes").mkdir()
    guard = guard_workspace(str(home), str(home), env={})
    assert guard.tops == [str(home)]
    assert guard.top_writable == [str(home / "dotfiles"), str(home / "notes")]
    assert str(home / "dotfiles" / "bashrc") in guard.hidden and str(home / ".bashrc") not in guard.hidden
    assert "which is missing" in guard.links[str(home / "gone")]
    assert "out of the workspace" in guard.links[str(home / "scratch")]
    # above a hidden path, and an entry of the top: bound once, writable, which pins it too
    assert str(home / "dotfiles") not in guard.pinned
    assert [path for path, kind in guard.mounts_in_order()].count(str(home / "dotfiles")) == 1


def test_a_workspace_on_the_kernels_python_path_has_a_read_only_top(tmp_path, monkeypatch) -> None:
    workspace = tmp_path / "ws"
    (workspace / "pkg").mkdir(parents=True)
    (workspace / "sitecustomize.py").write_text("")
    (workspace / "notes.txt").write_text("")
    monkeypatch.syspath_prepend(str(workspace))  # an editable install's path
    guard = guard_workspace(str(workspace), str(tmp_path / "elsewhere"), env={})
    assert guard.on_python_path and guard.tops == [str(workspace)]
    assert guard.top_writable == [str(workspace / "notes.txt"), str(workspace / "pkg")]
    assert str(workspace / "sitecustomize.py") in guard.read_only
    assert "on the kernel's Python path" in guard.summary()["top of the workspace"]
