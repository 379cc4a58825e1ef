"""This machine's programs are never looked up in a folder a box may write (owsandbox/host/programs.py)."""

from __future__ import annotations

import os

import pytest

from owsandbox.host import programs

pytestmark = pytest.mark.unit


def test_relative_entries_and_the_workspaces_folders_leave_the_path(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OWSANDBOX_WORKSPACE", raising=False)
    path = os.pathsep.join(["", ".", "bin", str(tmp_path / ".venv" / "bin"), "/usr/bin", "/somewhere/else/bin",
                            str(tmp_path)])
    assert programs.trusted_path(path) == os.pathsep.join(["/usr/bin", "/somewhere/else/bin"])
    assert programs.trusted_path("/opt/ws/bin:/usr/bin", avoid=["/opt/ws"]) == "/usr/bin"


def test_a_marked_workspace_and_the_workspace_setting_are_avoided_wherever_the_kernel_runs(monkeypatch, tmp_path):
    monkeypatch.chdir("/")  # a root folder is never taken for a workspace (nothing would be left)
    monkeypatch.setenv("OWSANDBOX_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.setattr(programs, "_MARKED", set())
    programs.mark_box_writable(str(tmp_path / "other"))
    programs.mark_box_writable("/")
    path = os.pathsep.join([str(tmp_path / "ws" / "bin"), str(tmp_path / "other" / "bin"), "/usr/bin"])
    assert programs.trusted_path(path) == "/usr/bin"
    assert programs.host_program(str(tmp_path / "other" / "bin" / "bwrap")) is None  # named in full, still not
