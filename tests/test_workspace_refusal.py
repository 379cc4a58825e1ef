"""The one workspace refusal every isolating provider makes, and the one `inside()` test of paths."""

from __future__ import annotations

import pytest

from owsandbox.host.isolation.policy import SYSTEM_FOLDERS, WorkspaceRefused, refuse_workspace
from owsandbox.protocol.paths import inside

pytestmark = pytest.mark.unit

WHAT = "the private folder of the boxes: a box that wrote there could run code here"


@pytest.mark.parametrize("folder", SYSTEM_FOLDERS)
def test_a_system_folder_is_never_a_workspace(folder: str) -> None:
    with pytest.raises(WorkspaceRefused, match=f"the workspace cannot be {folder}: .* isolates nothing"):
        refuse_workspace(folder, "/elsewhere/private", WHAT)


def test_a_workspace_holding_the_private_folder_is_refused_with_what_it_holds() -> None:
    with pytest.raises(WorkspaceRefused) as refused:
        refuse_workspace("/home/me", "/home/me/.cache/owsandbox/run", WHAT)
    assert str(refused.value) == ("the workspace /home/me holds /home/me/.cache/owsandbox/run, " + WHAT
                                  + ". Open the notebook from a project folder, or set OWSANDBOX_WORKSPACE to one")


def test_a_project_folder_beside_the_private_folder_is_taken() -> None:
    refuse_workspace("/home/me/project", "/home/me/.cache/owsandbox/run", WHAT)
    refuse_workspace("/tmp/own", "/tmp/owsandbox-1000", WHAT)  # a sibling whose name starts alike


def test_the_private_folder_is_not_looked_for_when_the_workspace_is_the_whole_machine() -> None:
    """Finding a private folder outside `/` fails: that error must not hide the one that says why."""
    def no_private_folder() -> str:
        raise AssertionError("looked for a private folder outside /")

    with pytest.raises(WorkspaceRefused, match="the workspace cannot be /"):
        refuse_workspace("/", no_private_folder, "the sockets")
    with pytest.raises(WorkspaceRefused, match="holds /run/user/1/owsandbox-1"):
        refuse_workspace("/run/user/1", lambda: "/run/user/1/owsandbox-1", "the sockets")


def test_the_providers_refuse_through_the_one_refusal() -> None:
    """bubblewrap and the container provider name their private folder; the checks are the policy's."""
    from owsandbox.host.providers import bwrap, container

    for module in (bwrap, container):
        assert module.refuse_workspace is refuse_workspace
        assert "isolates nothing" not in open(module.__file__, encoding="utf-8").read()


@pytest.mark.parametrize(("path", "folder", "expected"), [
    ("/a/b", "/a/b", True), ("/a/b/c", "/a/b", True), ("/a/b/c", "/a/b/", True), ("/a/bc", "/a/b", False),
    ("/a", "/a/b", False), ("/anything", "/", True), ("/a/b", "/a/b/c", False),
])
def test_inside_is_by_whole_names(path: str, folder: str, expected: bool) -> None:
    assert inside(path, folder) is expected


def test_inside_is_written_once() -> None:
    """No module of the package has its own copy (a function of that name, or the test spelled out)."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "owsandbox"
    copies = []
    for source in package.rglob("*.py"):
        if source == package / "protocol" / "paths.py":
            continue
        text = source.read_text(encoding="utf-8")
        defined = [node.lineno for node in ast.walk(ast.parse(text))
                   if isinstance(node, ast.FunctionDef) and node.name.strip("_") == "inside"]
        spelled = 'rstrip("/") + "/"' in text
        if defined or spelled:
            copies.append(f"{source.relative_to(package)} {defined or 'spelled out'}")
    assert not copies, copies
