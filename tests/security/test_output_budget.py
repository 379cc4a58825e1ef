"""The output limit counts everything a cell sends: each test is a box that tries to flood the client.

Under `%output limit 100000` a cell used to send eight 1 MB `owdisplay`s whole (the limit counted
command streams only), and `%read`, `%page` and `owdisplay --id` updates were not counted either.
Here every IOPub message of each cell is measured as it reaches the client (its content as JSON)
and the sum must stay within the limit and a small overhead (the kernel's notes, a cut output's last
lines), with a note that says what was withheld and how to see it. The unit tests pin the budget
itself (`owsandbox.kernel.budget`).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from owsandbox.kernel.cell.budget import ALLOWANCE, OutputBudget, Withheld, size_of
from owsandbox.kernel.cell.output import TAIL_CHARS

from ..kernel_session import CellRun, KernelSession

LIMIT = 100_000
OVERHEAD = ALLOWANCE + TAIL_CHARS + 4096  # notes, the end of a cut output, the messages' own fields
MB = 1 << 20


def sent(run: CellRun) -> int:
    """Characters of every message of the cell as the client gets it, the execute reply included: a
    stream's text as characters (JSON would count each line break twice), the rest as JSON."""
    return sum(len(message["content"]["text"]) if message["msg_type"] == "stream"
               else len(json.dumps(message["content"])) for message in [*run.outputs, run.reply])


# -- the budget -----------------------------------------------------------------------------------

@pytest.mark.unit
def test_text_is_cut_where_the_limit_falls_and_the_first_cut_says_what_and_how() -> None:
    budget = OutputBudget(10)
    assert budget.cut("12345", Withheld("lines 1-2 of a.txt", "use --lines")) == ("12345", None)
    shown, note = budget.cut("6789abcdef", Withheld("lines 3-9 of a.txt", "use --lines"))
    assert shown == "6789a"
    assert note == ("[output limit of 10 characters reached (%output limit): 5 more characters of lines 3-9 of "
                    "a.txt are not shown; use --lines]")
    assert budget.cut("more", Withheld()) == ("", None)  # one note; the rest is counted for the summary
    display = {"data": {"text/plain": "x"}}
    assert budget.admit(display, Withheld()) == (False, None)
    said = budget.summary()
    assert said == f"[past the output limit, 2 more outputs ({4 + size_of(display)} characters) were not shown]"
    assert budget.summary() is None


@pytest.mark.unit
def test_a_display_goes_out_whole_or_not_at_all() -> None:
    budget = OutputBudget(1000)
    small = {"data": {"text/plain": "x" * 300}, "metadata": {}}
    assert budget.admit(small, Withheld()) == (True, None)
    admitted, note = budget.admit({"data": {"image/png": "A" * 5000}}, Withheld("the display of p.png", "how"))
    assert not admitted and note is not None and "the display of p.png (" in note and note.endswith("; how]")
    assert budget.admit(small, Withheld())[0]  # a later one that fits still goes
    assert not budget.admit(small, Withheld())[0] and not budget.admit(small, Withheld())[0]


@pytest.mark.unit
def test_a_frame_replaces_its_display_and_an_update_by_id_counts_every_time() -> None:
    budget = OutputBudget(1000)
    frame = {"data": {"text/plain": "y" * 400}}
    for _ in range(50):  # a live view redrawn many times is the one display the client keeps
        assert budget.admit(frame, Withheld(), frame_of="view")[0]
    assert budget.admit(frame, Withheld())[0]  # an owdisplay --id update: counted each time
    assert not budget.admit(frame, Withheld())[0]


@pytest.mark.unit
def test_the_kernels_own_words_have_an_allowance_past_the_limit_and_no_more() -> None:
    budget = OutputBudget(10, allowance=150)  # a note of 30 characters takes 58 as JSON
    note = {"data": {"text/plain": "n" * 30}}
    assert [budget.own_words(note) for _ in range(4)] == [True, True, False, False]
    assert budget.summary() == "[past the output limit, 2 outputs (116 characters) were not shown]"


# -- through a real kernel ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kernel(module_kernel: KernelSession, module_workspace: Path) -> KernelSession:
    (module_workspace / "big.txt").write_text(("y" * 99 + "\n") * (MB // 100))  # 1 MB in 100-character lines
    (module_workspace / "wide.txt").write_text(("w" * 4999 + "\n") * 200)  # 200 lines of 5000 characters
    (module_workspace / "mid.txt").write_text("m" * 30_000)
    assert module_kernel.run(f"%output limit {LIMIT}").status == "ok"
    return module_kernel


@pytest.mark.parametrize("cell", [
    "for i in 1 2 3 4 5 6 7 8; do owdisplay big.txt; done",
    "for i in 1 2 3 4 5 6 7 8; do owdisplay big.txt --id same; done",
    "%read big.txt --text\n" + "for i in 1 2 3 4 5 6 7 8; do owdisplay big.txt --mime text/plain; done",
])
def test_eight_displays_of_a_megabyte_send_no_more_than_the_limit(kernel: KernelSession, cell: str) -> None:
    run = kernel.run(cell, timeout=120)
    assert run.status == "ok", run.outputs
    assert sent(run) < LIMIT + OVERHEAD, sent(run)
    notes = run.notes()
    assert f"output limit of {LIMIT} characters reached (%output limit)" in notes, notes
    assert "more outputs" in notes or "more characters of" in notes, notes


def test_displays_count_until_the_limit_and_the_first_withheld_one_says_how_to_see_it(kernel: KernelSession) -> None:
    run = kernel.run("for i in 1 2 3 4 5; do owdisplay mid.txt --id m$i; done")
    shown = [d for d in run.of_type("display_data")]
    assert len(shown) == 3  # 3 × 30 000 characters fit in 100 000; the fourth would not
    notes = run.notes()
    assert "the display of" in notes and "mid.txt (30" in notes and "show it in a cell of its own" in notes, notes
    assert "[past the output limit, 1 more output (" in notes, notes
    assert sent(run) < LIMIT + OVERHEAD


def test_the_next_cell_has_its_own_limit(kernel: KernelSession) -> None:
    kernel.run("for i in 1 2 3 4; do owdisplay mid.txt; done")
    again = kernel.run("owdisplay mid.txt")
    assert len(again.of_type("display_data")) == 1 and "output limit" not in again.notes()


def test_read_pages_of_long_lines_are_cut_at_the_limit(kernel: KernelSession) -> None:
    run = kernel.run("%read wide.txt")  # 200 lines of 5000 characters: a page of a million
    assert sent(run) < LIMIT + OVERHEAD
    assert len(run.text()) <= LIMIT
    notes = run.notes()
    assert "more characters of lines 1-200 of wide.txt are not shown; ask for fewer with --lines" in notes, notes


def test_the_pager_gets_no_more_than_the_limit(kernel: KernelSession) -> None:
    run = kernel.run("%page big.txt")
    [page] = run.reply["content"]["payload"]
    assert len(page["data"]["text/plain"]) <= LIMIT
    assert sent(run) < LIMIT + OVERHEAD
    assert "more characters of big.txt are not shown; %read big.txt --lines A:B pages the rest" in run.notes()


def test_a_commands_text_after_displays_gets_only_the_room_left_and_its_end(kernel: KernelSession) -> None:
    # 90 000 characters of displays, then 48 894 of text: the sandbox keeps it all (no log), the cell cannot
    run = kernel.run("owdisplay mid.txt; owdisplay mid.txt; owdisplay mid.txt; sleep 1; seq 1 10000", timeout=60)
    assert run.status == "ok"
    assert len(run.of_type("display_data")) == 3
    assert sent(run) < LIMIT + OVERHEAD, sent(run)
    notes = run.notes()
    assert "characters of this command's output were not shown: the cell's outputs reached its limit" in notes, notes
    assert run.text().startswith("1\n2\n") and run.text().endswith("9999\n10000\n")  # its end, as for any cut
    assert "are in" not in notes  # no log is promised that does not exist


def test_streams_and_displays_share_one_limit(kernel: KernelSession) -> None:
    run = kernel.run("seq 1 30000; owdisplay mid.txt", timeout=60)  # 168 894 characters, then a display
    assert sent(run) < LIMIT + OVERHEAD
    assert not run.of_type("display_data")
    assert f"output limit of {LIMIT} characters reached" in run.notes()


def test_an_attached_programs_view_shows_long_records_shortened(kernel: KernelSession, tmp_path: Path) -> None:
    program = tmp_path / "long_records.py"
    program.write_text("import json, sys, time\n"
                       "for n in range(30):\n"
                       "    print(json.dumps({'n': n, 'text': 'z' * 50_000}), flush=True)\n"
                       "time.sleep(30)\n")
    started = kernel.run(f"%attach --name long -- {sys.executable} {program}")
    assert started.status == "ok", started.outputs
    try:
        def last_record_shown(message: dict) -> bool:
            text = message["content"].get("data", {}).get("text/plain", "")
            return message["msg_type"] == "update_display_data" and '{"n": 29, ' in text

        frame = kernel.wait_for(last_record_shown, 30, "the view to show the last record")
        text = frame["content"]["data"]["text/plain"]
        assert len(text) < 25_000 and re.search(r"characters; %records \d+ prints it whole", text), text[:300]
    finally:
        kernel.run("%attach --kill")


def test_a_limit_set_at_the_top_of_a_cell_holds_for_that_cell(kernel: KernelSession) -> None:
    assert kernel.run("%output limit 4M").status == "ok"
    try:
        run = kernel.run(f"%output limit {LIMIT}\nfor i in 1 2 3 4 5 6 7 8; do owdisplay big.txt; done", timeout=120)
    finally:
        kernel.run(f"%output limit {LIMIT}")
    assert sent(run) < LIMIT + OVERHEAD, sent(run)
