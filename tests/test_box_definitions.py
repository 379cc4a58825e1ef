"""A shell's definitions file as a Tab reads it (`Definitions`): each line the shell is given writes
a file of its own, and only its marker makes that the file a Tab reads. Fed lines and markers by
hand, with the files written as bash would write them."""

from __future__ import annotations

import re
import threading

import pytest

from owsandbox.box.shell.definitions import Definitions

pytestmark = pytest.mark.unit


class StandInShell:
    """Takes the lines the way bash would, and says which file each one writes."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.idle = True
        self.given = threading.Event()

    def write(self, line: str) -> None:
        self.lines.append(line)
        self.given.set()

    def last_target(self) -> tuple[str, str]:
        """The file the last line writes, and the token of its marker."""
        token = re.findall(r"OWS:%s\\n' ([0-9a-f]+) ", self.lines[-1])[0]
        target = re.findall(r">\|\$'([^']+)'", self.lines[-1])[0]
        assert target.endswith("." + token)
        return target, token


def definitions(tmp_path) -> tuple[Definitions, StandInShell]:
    shell = StandInShell()
    return Definitions(str(tmp_path / "shell-1.sh"), threading.Lock(), lambda: shell.idle, shell.write), shell


def test_a_file_being_written_is_not_the_one_a_tab_reads_until_its_marker_comes(tmp_path):
    defs, shell = definitions(tmp_path)
    (tmp_path / "shell-1.sh").write_text("old_fn() { :; }\n")
    defs.refresh()
    target, token = shell.last_target()
    with open(target, "w") as half:
        half.write("new_fn() {")  # bash is still writing it
        assert (tmp_path / "shell-1.sh").read_text() == "old_fn() { :; }\n"
        half.write(" :; }\n")
    assert defs.on_marker(token)
    assert (tmp_path / "shell-1.sh").read_text() == "new_fn() { :; }\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shell-1.sh"]
    assert not defs.on_marker(token), "a marker is taken once"


def test_whoever_asked_is_told_after_the_file_is_in_place(tmp_path):
    defs, shell = definitions(tmp_path)
    seen: list[str] = []

    def ask() -> None:
        seen.append(str(defs.write_now(30)) + (tmp_path / "shell-1.sh").read_text())

    asker = threading.Thread(target=ask)
    asker.start()
    assert shell.given.wait(30)
    target, token = shell.last_target()
    with open(target, "w") as whole:
        whole.write("asked_fn() { :; }\n")
    assert defs.on_marker(token)
    asker.join()
    assert seen == ["Trueasked_fn() { :; }\n"]


def test_a_line_bash_could_not_write_leaves_the_last_file(tmp_path):
    defs, shell = definitions(tmp_path)
    (tmp_path / "shell-1.sh").write_text("kept_fn() { :; }\n")
    defs.refresh()
    _, token = shell.last_target()
    assert defs.on_marker(token)
    assert (tmp_path / "shell-1.sh").read_text() == "kept_fn() { :; }\n"


def test_a_busy_shell_is_given_no_line(tmp_path):
    defs, shell = definitions(tmp_path)
    shell.idle = False
    assert defs.write_now(1) is False
    defs.refresh()
    assert shell.lines == []


def test_a_shell_that_ends_leaves_no_file_and_keeps_nobody_waiting(tmp_path):
    defs, shell = definitions(tmp_path)
    (tmp_path / "shell-1.sh").write_text("x() { :; }\n")
    answers: list[bool] = []
    asker = threading.Thread(target=lambda: answers.append(defs.write_now(30)))
    asker.start()
    assert shell.given.wait(30)
    target, _ = shell.last_target()
    with open(target, "w") as half:
        half.write("y() {")  # the shell ended while it wrote them
    defs.shell_exited()
    asker.join()
    assert answers == [True] and list(tmp_path.iterdir()) == []
