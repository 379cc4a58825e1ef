"""`%record`: the asciicast transcript without I/O, the file the host writes (never an existing one,
never through a link), a real kernel's session recorded with its prompts (a password never written),
and `owsandbox replay` playing it in a terminal under pexpect."""

from __future__ import annotations

import errno
import json
import os
import sys

import pytest

from owsandbox.kernel.cell.notes import note_content
from owsandbox.kernel.teaching.recording import (
    CastError,
    Recorder,
    RecordingError,
    Transcript,
    open_new,
    play,
    read_cast,
    text_of,
)

from .conftest import KERNEL_NAME, kernel_in


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def parent(msg_id: str) -> dict:
    return {"header": {"msg_id": msg_id}}


# -- the transcript ------------------------------------------------------------------------------

@pytest.mark.unit
def test_a_transcript_is_asciicast_v2_with_prompts_markers_and_timing():
    clock = Clock()
    cast = Transcript(120, 50, clock, started_at=1_700_000_000.5, title="lesson")
    header = json.loads(cast.header())
    assert {k: header[k] for k in ("version", "width", "height", "timestamp", "title")} == {
        "version": 2, "width": 120, "height": 50, "timestamp": 1_700_000_000, "title": "lesson"}
    clock.now = 101.25
    lines = [json.loads(line) for line in cast.cell(3, "cd lab\nls").splitlines()]
    assert lines == [[1.25, "m", "In [3]"], [1.25, "o", "\x1b[1;32m$\x1b[0m cd lab\r\n\x1b[1;32m>\x1b[0m ls\r\n"]]
    clock.now = 101.5
    assert json.loads(cast.output("a\nb\r\n")) == [1.5, "o", "a\r\nb\r\n"]
    assert json.loads(cast.note("[a note]")) == [1.5, "o", "\x1b[2m[a note]\x1b[0m\r\n"]
    clock.now = 99.0  # a clock that went back: events never do
    assert json.loads(cast.ended({"status": "error", "ename": "ExitStatus", "evalue": "status 1"}, 0.25))[0] == 1.5
    assert "[✗ ExitStatus: status 1 · 0.25 s]" in cast.ended({"status": "error", "ename": "ExitStatus",
                                                              "evalue": "status 1"}, 0.25)


@pytest.mark.unit
def test_a_prompts_answer_is_input_and_a_password_is_never_written():
    cast = Transcript(80, 24, Clock(), 0)
    typed = [json.loads(line) for line in cast.answered("Your name? ", "Ada", password=False).splitlines()]
    assert [event[1:] for event in typed] == [["o", "Your name? "], ["i", "Ada\r"], ["o", "Ada\r\n"]]
    secret = cast.answered("Password: ", "hunter2-secret", password=True)
    assert "hunter2" not in secret and [json.loads(line)[1:] for line in secret.splitlines()] == [
        ["o", "Password: "], ["o", "\r\n"]]


@pytest.mark.unit
def test_what_a_terminal_would_show_of_each_message():
    assert text_of("stream", {"name": "stdout", "text": "hi\n"}) == ("hi\n", False)
    assert text_of("display_data", note_content("[sandbox: local]")) == ("[sandbox: local]", True)
    assert text_of("display_data", {"data": {"image/png": "..."}}) == ("[image/png]\n", False)
    assert text_of("execute_result", {"data": {"text/plain": "cell time limit: off"}}) == (
        "cell time limit: off\n", False)
    assert text_of("error", {"ename": "x"}) is None and text_of("update_display_data", {}) is None


# -- the file ------------------------------------------------------------------------------------

@pytest.mark.unit
def test_a_recording_never_writes_over_or_through_what_is_there(tmp_path):
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "victim.txt").write_text("the host's\n")
    (workspace / "taken.cast").write_text("someone's\n")
    os.symlink(outside / "victim.txt", workspace / "link.cast")
    os.mkfifo(workspace / "fifo.cast")
    os.symlink(outside, workspace / "out")
    for name in ("taken.cast", "link.cast", "fifo.cast"):
        with pytest.raises(FileExistsError):
            open_new(workspace / name, str(workspace))
    with pytest.raises(OSError) as refused:
        open_new(workspace / "out" / "new.cast", str(workspace))  # a folder of the box's that leads out
    assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR)  # O_NOFOLLOW met the link
    (tmp_path / "recordings").symlink_to(workspace / "out")  # the user's own link, into the box's link
    with pytest.raises(OSError):
        open_new(tmp_path / "recordings" / "new.cast", str(workspace))
    assert sorted(os.listdir(outside)) == ["victim.txt"] and (outside / "victim.txt").read_text() == "the host's\n"
    fd, inside = open_new(workspace / "deeper" / "mine.cast", str(workspace))
    os.close(fd)
    assert inside and (workspace / "deeper" / "mine.cast").exists()


@pytest.mark.unit
def test_the_recorder_writes_cells_and_says_where(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    clock = Clock()
    recorder = Recorder(lambda: str(workspace), lambda: (100, 40), "lesson", clock, lambda: 1_700_000_000.0,
                        env={"XDG_DATA_HOME": str(tmp_path / "data")})
    where = recorder.start()
    assert where.endswith("(outside the workspace: the box cannot reach it)")
    assert recorder.path.parent == tmp_path / "data" / "owsandbox" / "recordings"
    with pytest.raises(RecordingError, match="already recording"):
        recorder.start()
    cell = parent("c1")
    recorder.cell_started(cell, 1, "echo hi")
    clock.now += 0.5
    recorder.saw(cell, "stream", {"name": "stdout", "text": "hi\n"})
    recorder.saw(parent("other"), "stream", {"name": "stdout", "text": "not this cell's\n"})
    recorder.cell_ended(cell, {"status": "ok"})
    assert recorder.stop() == f"{recorder.path} (1 cell)"
    header, events = read_cast(recorder.path.read_text().splitlines())
    assert (header["width"], header["height"]) == (100, 40)
    assert [(code, data) for _, code, data in events][2:] == [("o", "hi\r\n"),
                                                              ("o", "\x1b[2m[✓ ok · 0.50 s]\x1b[0m\r\n")]
    with pytest.raises(RecordingError, match="a recording never writes over a file"):
        recorder.start(str(recorder.path))
    with pytest.raises(RecordingError, match="name it NAME.cast"):
        recorder.start("notes.txt")
    assert "in the workspace: the box can change or delete it" in recorder.start(str(workspace / "here.cast"))


@pytest.mark.unit
def test_a_recording_stops_at_its_limit_saying_so(tmp_path):
    recorder = Recorder(env={"XDG_DATA_HOME": str(tmp_path), "OWSANDBOX_RECORD_LIMIT": "2K"})
    recorder.start("big.cast")
    cell = parent("c")
    recorder.cell_started(cell, 1, "yes | head")
    for _ in range(100):
        recorder.saw(cell, "stream", {"name": "stdout", "text": "y\n" * 20})
    assert not recorder.on
    assert recorder.cell_note() == (f"[recording stopped: it reached its limit of 2048 bytes (OWSANDBOX_RECORD_LIMIT)"
                                    f"; {recorder.path} has what came before]")
    assert recorder.cell_note() is None  # said once
    text = (tmp_path / "owsandbox" / "recordings" / "big.cast").read_text()
    assert text.rstrip().endswith('recording stopped: it reached its limit of 2048 bytes (OWSANDBOX_RECORD_LIMIT)'
                                  ']\\u001b[0m\\r\\n"]')


@pytest.mark.unit
def test_play_keeps_the_pace_and_filters_what_it_shows(tmp_path):
    path = tmp_path / "s.cast"
    path.write_text(json.dumps({"version": 2, "width": 80, "height": 24, "timestamp": 0}) + "\n"
                    + json.dumps([0.5, "o", "one\r\n"]) + "\n" + json.dumps([0.6, "i", "typed\r"]) + "\n"
                    + json.dumps([10.6, "o", "two\x1b]52;c;cGFzdGU=\x07\x1b[2J\r\n"]) + "\n")
    slept: list[float] = []

    class Out:
        text = ""

        def write(self, data: str) -> None:
            Out.text += data

        def flush(self) -> None:
            pass

    assert play(str(path), Out(), speed=2.0, sleep=slept.append) == 2
    assert Out.text == "one\r\ntwo\r\n"  # no clipboard, no clearing of the screen; input is not output
    assert slept == [0.25, 1.0]  # half the pace, and a 10 s pause cut to the idle limit (2 s)
    with pytest.raises(CastError, match="version 2"):
        read_cast([json.dumps({"version": 1})])
    with pytest.raises(CastError, match="line 2 is not an asciicast event"):
        read_cast([json.dumps({"version": 2}), "nonsense"])


# -- a real session ------------------------------------------------------------------------------

def answer_prompts(kernel, msg_id: str, answers: list[str]):
    for value in answers:
        kernel.kc.get_stdin_msg(timeout=30)
        kernel.kc.input(value)
    return kernel.collect(msg_id)


def test_a_session_is_recorded_and_replays_in_a_terminal(tmp_path):
    pexpect = pytest.importorskip("pexpect")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    recordings = tmp_path / "recordings"
    with kernel_in(workspace, KERNEL_NAME, {"OWSANDBOX_RECORD": str(recordings)}) as kernel:
        first = kernel.run("echo first")
        assert f"[recording this session to {recordings}/session-" in first.notes()
        assert "(outside the workspace: the box cannot reach it)" in first.notes()
        msg_id = kernel.send("read -p 'Your name? ' name; read -s -p 'Password: ' pw; echo; echo \"hello $name, "
                             "${#pw} characters\"", allow_stdin=True)
        answered = answer_prompts(kernel, msg_id, ["Ada", "hunter2-very-secret"])
        assert answered.text() == "\nhello Ada, 19 characters\n"
        assert kernel.run("ls /nowhere").status == "error"
        status = kernel.run("%record")
        assert status.text().startswith(f"recording to {recordings}/") and not status.of_type("execute_result")
        stopped = kernel.run("%record off")
        assert stopped.text().startswith(f"recorded {recordings}/session-")
        assert "(5 cells)" in stopped.text()  # this one too
        assert kernel.run("echo not recorded").status == "ok"
    [path] = recordings.glob("*.cast")
    raw = path.read_text()
    assert "hunter2" not in raw and "not recorded" not in raw
    header, events = read_cast(raw.splitlines())
    assert header["version"] == 2 and header["width"] == 120 and header["height"] == 50
    assert isinstance(header["timestamp"], int)
    assert [data for _, code, data in events if code == "m"] == [f"In [{n}]" for n in range(1, 6)]
    assert [data for _, code, data in events if code == "i"] == ["Ada\r"]
    assert [at for at, _, _ in events] == sorted(at for at, _, _ in events)
    shown = "".join(data for _, code, data in events if code == "o")
    assert "Your name? Ada\r\nPassword: \r\n" in shown and "hello Ada, 19 characters" in shown
    assert "[✗ ExitStatus: the command exited with status 2" in shown
    assert "No such file or directory" in shown  # stderr is part of what was shown

    child = pexpect.spawn(sys.executable, ["-m", "owsandbox.cli", "replay", str(path), "--speed", "20"],
                          encoding="utf-8", timeout=30, dimensions=(50, 120))
    try:
        child.expect_exact("echo first")
        child.expect_exact("first")
        child.expect_exact("Your name? Ada")
        child.expect_exact("hello Ada, 19 characters")
        child.expect_exact("%record off")
        child.expect(pexpect.EOF)
        assert "hunter2" not in child.before
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    pytest.importorskip("asciinema")  # asciinema's own player reads the file as well
    player = pexpect.spawn(sys.executable, ["-m", "asciinema", "play", "--speed", "20", str(path)],
                           encoding="utf-8", timeout=30, dimensions=(50, 120))
    try:
        player.expect_exact("Your name? Ada")
        player.expect_exact("hello Ada, 19 characters")
        player.expect(pexpect.EOF)
    finally:
        player.close(force=True)
    assert player.exitstatus == 0


@pytest.mark.unit
def test_a_courses_folder_is_each_students_own():
    from owsandbox.kernel.teaching.recording import default_folder
    from owsandbox.kernelspec import kernel_dict

    assert kernel_dict(record="/srv/course/recordings/$USER")["env"]["OWSANDBOX_RECORD"] == \
        "/srv/course/recordings/$USER"  # expanded by each student's kernel, not at install
    env = {"OWSANDBOX_RECORD": "/srv/course/recordings/$USER", "USER": "ada"}
    assert str(default_folder(env)) == "/srv/course/recordings/ada"
    assert str(default_folder({"XDG_DATA_HOME": "/home/ada/.data"})) == "/home/ada/.data/owsandbox/recordings"
