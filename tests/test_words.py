"""Counts in words (`1 entry`, never `1 entries`) and the short forms the kernel shows instead of its own set-up."""

from __future__ import annotations

import pytest

from owsandbox.kernel.attach.view import listing_row
from owsandbox.kernel.cell.pacing import FloodTail
from owsandbox.kernel.magics.shells import TerminalSettings
from owsandbox.protocol.words import counted, noun
from owsandbox.terminal.boxshell import TERMINAL_LABEL, shell_command

pytestmark = pytest.mark.unit


def test_one_takes_the_singular_and_every_other_count_the_plural():
    assert counted(1, "entry", "entries") == "1 entry" and counted(0, "entry", "entries") == "0 entries"
    assert counted(2, "notification") == "2 notifications" and counted(1, "notification") == "1 notification"
    assert counted(12_345, "line") == "12,345 lines" and counted("7", "record") == "7 records"  # read from a file
    assert noun(1, "was", "were") == "was" and noun(3, "was", "were") == "were"


def test_the_terminal_setting_names_the_terminal_once():
    assert TerminalSettings().describe("main") == "shell 'main': on a 120x50 terminal; stderr apart"
    off = TerminalSettings(terminal=False)
    assert off.describe("x") == "shell 'x': on pipes, exact bytes (terminal off); stderr apart"


def test_a_terminals_session_is_listed_by_a_short_label_not_its_kilobyte_of_set_up():
    command = shell_command("xterm-256color", 120, 40, "truecolor")
    assert len(command) > 500
    row = listing_row("0123456789abcdef", {}, {"command": command, "running": True}, None, True)
    assert row["command"] == TERMINAL_LABEL and row["program"] == "running"
    other = listing_row("0123456789abcdef", {"command": "python3 server.py"}, {}, None, True)
    assert other["command"] == "python3 server.py"
    assert listing_row("0123456789abcdef", {}, {"command": ["not", "text"]}, None, True)["command"] == ""


def test_the_live_tail_of_a_flood_counts_one_line_as_one():
    tail = FloodTail("d")
    tail.add("only line\n")
    assert tail.text().startswith("[10 characters (1 line) ") and "the last 1 line:]" in tail.text()
    assert "10 characters (1 line) were not streamed" in tail.note()
    one = FloodTail("e")
    one.add("\n")
    assert "1 character (1 line) was not streamed" in one.note()
