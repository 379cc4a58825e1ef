"""The box's sans-I/O cores for what reaches the notebook, fed bytes and times: whole lines across two
streams (`WholeLines`), bash's own lines told from the programs' (`ShellChatter`), and how a reader's
descriptor is matched to the shell's terminal (`terminal_of`, on a real pty of this process)."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from owsandbox.box.shell.capture import ShellChatter, WholeLines
from owsandbox.box.shell.terminal import DEV_TTY, PseudoTerminal, controlling_terminal, terminal_of

from .fuzz_budget import examples

FUZZ = settings(max_examples=examples(300), deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


def shown(items: list[tuple[str, str, bytes]]) -> list[tuple[str, bytes]]:
    """Items as the notebook would show them: runs of one stream joined."""
    runs: list[tuple[str, bytes]] = []
    for stream, _, data in items:
        if runs and runs[-1][0] == stream:
            runs[-1] = (stream, runs[-1][1] + data)
        else:
            runs.append((stream, data))
    return runs


# -- whole lines --------------------------------------------------------------------------------

@pytest.mark.unit
def test_a_line_written_in_pieces_is_not_cut_by_the_other_stream():
    lines = WholeLines()
    out = lines.add("stderr", "data", b"ls: ", 0.0)
    out += lines.add("stdout", "data", b"out7\n", 0.001)
    assert shown(out) == [("stderr", b"ls: ")]  # the half line goes out at once; the other stream waits
    out += lines.add("stderr", "data", b"cannot access '/x'\nls: ", 0.002)
    assert shown(out) == [("stderr", b"ls: cannot access '/x'\n"), ("stdout", b"out7\n"), ("stderr", b"ls: ")]


@pytest.mark.unit
def test_what_waits_goes_out_after_the_wait_or_at_a_flush():
    lines = WholeLines(wait=0.5)
    lines.add("stdout", "data", b"working", 0.0)
    assert lines.add("stderr", "data", b"warning\n", 0.25) == []
    assert lines.deadline() == 0.75
    assert lines.due(0.5) == []
    assert shown(lines.due(0.75)) == [("stderr", b"warning\n")]
    # the line that took its time goes on after; the other stream no longer waits for it
    assert shown(lines.add("stdout", "data", b"...done\n", 1.0)) == [("stdout", b"...done\n")]
    lines.add("stdout", "data", b"Name? ", 1.5)
    lines.add("stderr", "data", b"late\n", 1.5)
    assert shown(lines.flush()) == [("stderr", b"late\n")] and lines.deadline() is None


@pytest.mark.unit
def test_a_carriage_return_ends_a_progress_line_and_cr_lf_stays_together():
    lines = WholeLines()
    out = lines.add("stderr", "data", b"\r 10%", 0.0)
    out += lines.add("stdout", "data", b"step\n", 0.0)
    out += lines.add("stderr", "data", b"\r 20%", 0.0)
    assert shown(out) == [("stderr", b"\r 10%\r"), ("stdout", b"step\n"), ("stderr", b" 20%")]
    lines = WholeLines()
    out = lines.add("stdout", "data", b"a", 0.0) + lines.add("stderr", "data", b"e\n", 0.0)
    out += lines.add("stdout", "data", b"b\r\nc", 0.0)
    assert [data for _, _, data in out] == [b"a", b"b\r\n", b"e\n", b"c"]


@pytest.mark.unit
def test_invisible_terminal_controls_do_not_open_a_line():
    lines = WholeLines()
    out = lines.add("stdout", "data", b"listing\n\x1b[0m\x1b[?2004h", 0.0)
    out += lines.add("stderr", "data", b"Traceback\n", 0.0)
    assert shown(out) == [("stdout", b"listing\n\x1b[0m\x1b[?2004h"), ("stderr", b"Traceback\n")]


@pytest.mark.unit
def test_a_display_or_a_note_is_a_line_of_its_own():
    lines = WholeLines()
    out = lines.add("stdout", "data", b"abc", 0.0)
    out += lines.add("stderr", "note", b"[1] 42\n", 0.0)
    out += lines.add("stdout", "display", b"image/png\t\t/p.png", 0.0)
    kinds = [(stream, kind) for stream, kind, _ in out]
    assert kinds == [("stdout", "data"), ("stdout", "display"), ("stderr", "note")]


steps = st.lists(st.tuples(st.sampled_from(["stdout", "stderr"]),
                           st.binary(min_size=1, max_size=8).map(lambda b: b.replace(b"\x1b", b"e")),
                           st.sampled_from([0.0, 0.001, 0.06])), max_size=60)


@pytest.mark.unit
@FUZZ
@given(steps)
def test_every_byte_once_each_stream_in_order_and_no_line_cut_unless_it_took_too_long(script):
    lines = WholeLines(wait=0.05)
    now, out, waited = 0.0, [], False
    for stream, data, later in script:
        now += later
        due = lines.due(now)
        waited = waited or bool(due)
        out += due + lines.add(stream, "data", data, now)
        waited = waited or later >= 0.05
    if not waited:  # nothing went out for a timeout: a stream changes only at the end of a line
        runs = shown(out)
        assert all(data[-1:] in (b"\n", b"\r") for _, data in runs[:-1]), runs
    out += lines.flush()
    for stream in ("stdout", "stderr"):
        assert b"".join(d for s, _, d in out if s == stream) == b"".join(d for s, d, _ in script if s == stream)


# -- bash's own lines ---------------------------------------------------------------------------

def chatter(jobs: tuple[int, ...] = (4242,), over: tuple[int, ...] = ()) -> ShellChatter:
    return ShellChatter(lambda pid: pid in jobs, lambda pid: pid in over)


@pytest.mark.unit
def test_a_job_start_is_a_note_only_for_a_job_of_the_shell():
    talk = chatter()
    assert talk.feed(b"[1] 4242\n", 0.0) == [("note", b"[1] 4242\n")]
    assert talk.feed(b"[1] 999\n", 0.0) == [("data", b"[1] 999\n")]  # a program's words about another pid
    assert talk.feed(b"x [1] 4242\n", 0.0) == [("data", b"x [1] 4242\n")]  # not at a line's start
    assert talk.feed(b"[1] 4242\n", 0.0, active=False) == [("data", b"[1] 4242\n")]  # not bash's stderr
    talk.feed(b"left unfinished by the last command", 0.0)
    talk.fresh_line()  # the next command's output is a cell of its own
    assert talk.feed(b"[1] 4242\n", 0.0) == [("note", b"[1] 4242\n")]


@pytest.mark.unit
def test_a_job_report_is_a_note_only_for_an_announced_job_that_ended():
    talk = chatter(over=(4242,))
    done = b"[1]+  Done                    sleep 1\n"
    assert talk.feed(done, 0.0) == [("data", done)]  # never announced here
    assert talk.feed(b"err\n[1] 4242\nmore", 0.0) == [("data", b"err\n"), ("note", b"[1] 4242\n"), ("data", b"more")]
    assert talk.feed(b"\n" + done, 0.0) == [("data", b"\n"), ("note", done)]
    still = chatter()
    still.feed(b"[1] 4242\n", 0.0)
    assert still.feed(done, 0.0) == [("data", done)]  # its process still runs: not bash's report


@pytest.mark.unit
def test_the_exit_echo_waits_to_see_the_shell_end():
    talk = chatter()
    assert talk.feed(b"exit\n", 1.0) == [] and talk.holding and talk.deadline() == 2.0
    talk.shell_exited()
    assert talk.release() == [] and not talk.holding
    talk.feed(b"exit\n", 3.0)
    assert talk.feed(b"more\n", 3.1) == [("data", b"exit\n"), ("data", b"more\n")]  # a program's, after all
    talk.feed(b"exit\n", 4.0)
    assert talk.due(4.5) == [] and talk.due(5.0) == [("data", b"exit\n")]
    assert talk.feed(b"exit\nthen\n", 6.0) == [("data", b"exit\n"), ("data", b"then\n")]


# -- the shell's terminal -----------------------------------------------------------------------

@pytest.mark.unit
def test_a_descriptor_is_the_terminal_by_its_device_whatever_its_path():
    tty, other = PseudoTerminal(), PseudoTerminal()
    try:
        again = os.open(tty.path, os.O_RDWR | os.O_NOCTTY)
        try:
            devices = [tty.device, other.device]
            me = os.getpid()
            assert terminal_of(me, tty.slave, devices) == 0
            assert terminal_of(me, again, devices) == 0  # opened a second time
            assert terminal_of(me, other.slave, devices) == 1
            assert terminal_of(me, tty.master, devices) is None  # the daemon's end is no reader's terminal
            with open(os.devnull) as null:
                assert terminal_of(me, null.fileno(), devices) is None
            assert os.makedev(5, 0) == DEV_TTY
        finally:
            os.close(again)
    finally:
        tty.close()
        other.close()


def test_dev_tty_is_the_terminal_of_a_process_it_controls():
    """A process in a session of its own opens the pty first (it becomes its controlling terminal), then
    /dev/tty: that descriptor's device is /dev/tty's, and it is matched through /proc/PID/stat."""
    tty, other = PseudoTerminal(), PseudoTerminal()
    reader = subprocess.Popen(["bash", "-c", f"exec 3<>{tty.path} 4</dev/tty; echo ready; exec sleep 30"],
                              start_new_session=True, stdout=subprocess.PIPE)
    try:
        assert reader.stdout is not None and reader.stdout.readline() == b"ready\n"
        assert os.stat(f"/proc/{reader.pid}/fd/4").st_rdev == DEV_TTY
        assert os.readlink(f"/proc/{reader.pid}/fd/4") == "/dev/tty"
        assert controlling_terminal(reader.pid) == tty.device[1]
        assert terminal_of(reader.pid, 4, [other.device, tty.device]) == 1
        assert terminal_of(reader.pid, 4, [other.device]) is None  # /dev/tty of another terminal
    finally:
        reader.kill()
        reader.wait()
        tty.close()
        other.close()
    assert controlling_terminal(reader.pid) is None  # gone
