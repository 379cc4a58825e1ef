"""Per-user folders in shared places: another local user can make them first, so each is checked
(a real folder, ours, mode 700) before use, and one that fails is passed over with a warning."""

from __future__ import annotations

import os

import pytest

from owsandbox.runner.privatedir import UnsafeFolder, first_private_folder, private_folder


def test_a_new_folder_is_made_private(tmp_path):
    folder = private_folder(tmp_path / "mine")
    assert (folder.stat().st_mode & 0o777) == 0o700 and folder.stat().st_uid == os.getuid()


def test_a_folder_open_to_others_is_refused(tmp_path):
    (tmp_path / "open").mkdir(mode=0o777)
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(UnsafeFolder, match="open to other users"):
        private_folder(tmp_path / "open")


def test_a_link_in_place_of_the_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeFolder, match="link"):
        private_folder(tmp_path / "link")


def test_a_folder_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("making a folder owned by someone else takes root")
    (tmp_path / "theirs").mkdir(mode=0o700)
    os.chown(tmp_path / "theirs", 4242, 4242)
    with pytest.raises(UnsafeFolder, match="belongs to user id 4242"):
        private_folder(tmp_path / "theirs")


def test_the_next_place_is_used_with_a_warning(tmp_path, capsys):
    (tmp_path / "squatted").mkdir(mode=0o777)
    os.chmod(tmp_path / "squatted", 0o777)
    chosen = first_private_folder([tmp_path / "squatted", tmp_path / "fallback"])
    assert chosen == tmp_path / "fallback"
    warning = capsys.readouterr().err
    assert "not using" in warning and "squatted" in warning and "open to other users" in warning
