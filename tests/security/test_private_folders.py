"""Per-user folders in shared places: another local user can make them first, so each is checked
(a real folder, ours, mode 700) before use, and one that fails is passed over with a warning."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from owsandbox.host.privatedir import UnsafeFolder, first_private_folder, private_folder


@pytest.mark.unit
def test_a_new_folder_is_made_private(tmp_path):
    folder = private_folder(tmp_path / "mine")
    assert (folder.stat().st_mode & 0o777) == 0o700 and folder.stat().st_uid == os.getuid()


@pytest.mark.unit
def test_a_folder_open_to_others_is_refused(tmp_path):
    (tmp_path / "open").mkdir(mode=0o777)
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(UnsafeFolder, match="open to other users"):
        private_folder(tmp_path / "open")


@pytest.mark.unit
def test_a_link_in_place_of_the_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeFolder, match="link"):
        private_folder(tmp_path / "link")


@pytest.mark.unit
def test_a_folder_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("making a folder owned by someone else takes root")
    (tmp_path / "theirs").mkdir(mode=0o700)
    os.chown(tmp_path / "theirs", 4242, 4242)
    with pytest.raises(UnsafeFolder, match="belongs to user id 4242"):
        private_folder(tmp_path / "theirs")


@pytest.mark.unit
def test_the_next_place_is_used_with_a_warning(tmp_path, capsys):
    (tmp_path / "squatted").mkdir(mode=0o777)
    os.chmod(tmp_path / "squatted", 0o777)
    chosen = first_private_folder([tmp_path / "squatted", tmp_path / "fallback"])
    assert chosen == tmp_path / "fallback"
    warning = capsys.readouterr().err
    assert "not using" in warning and "squatted" in warning and "open to other users" in warning


def test_the_runner_the_host_runs_is_out_of_the_boxs_reach(tmp_path, monkeypatch):
    """The host runs the runner file for every relay, outside the box. On a JupyterHub the workspace
    is the student's home, so the file must not live there (it once did, in ~/.cache): it is kept in
    the private runtime folder, which no box sees; and a file of the right name and size that is not
    the runner is written over, never run."""
    from owsandbox.host import bundle
    from owsandbox.host.privatedir import runtime_root
    from owsandbox.host.providers.local import LocalProvider
    from owsandbox.host.workspace import RunnerWorkspace

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    workspace = RunnerWorkspace(LocalProvider(cwd=home), str(home))
    try:
        runner = workspace.provider.runner_path
        assert runner is not None and not runner.startswith(str(home)) and not runner.startswith(str(tmp_path))
        assert os.path.dirname(runner) == str(runtime_root() / "runners")
        assert (os.stat(runtime_root()).st_mode & 0o777) == 0o700
    finally:
        workspace.close()
    name, data = bundle.zipapp_bytes()
    planted = tmp_path / "runners"
    planted.mkdir()
    (planted / name).write_bytes(b"#" * len(data))  # same name, same size, not the runner
    assert bundle.build_runner_zipapp(planted).read_bytes() == data


@pytest.mark.unit
def test_a_temporary_folder_too_long_for_sockets_is_passed_over(tmp_path, monkeypatch, capsys):
    """A long TMPDIR (and no XDG_RUNTIME_DIR) once made every cell fail with 'AF_UNIX path too long'."""
    from owsandbox.host import privatedir

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(privatedir.tempfile, "gettempdir", lambda: str(deep))
    root = privatedir.runtime_root()
    assert root == Path("/tmp") / f"owsandbox-{os.getuid()}"
    assert "too long a path for the sandbox's sockets" in capsys.readouterr().err
