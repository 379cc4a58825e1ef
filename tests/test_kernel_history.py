"""The kernel's one record of the cells it ran: history requests and completion read the same one."""

from __future__ import annotations

import pytest

from owsandbox.kernel.history import CellHistory

pytestmark = pytest.mark.unit


def test_it_keeps_the_newest_cells_only() -> None:
    history = CellHistory(keep=3)
    for line in range(1, 6):
        history.add(line, f"echo {line}")
    assert [entry[1] for entry in history.query("tail", None, None, None, None, None, False)] == [3, 4, 5]
    assert history.codes(2) == ["echo 4", "echo 5"]
    assert history.codes(10) == ["echo 3", "echo 4", "echo 5"]


def test_it_keeps_no_more_code_than_its_budget_but_always_the_newest_cell() -> None:
    history = CellHistory(keep=100, keep_chars=25)
    for line in range(1, 5):
        history.add(line, "x" * 10)
    assert [entry[1] for entry in history.entries] == [3, 4]  # 20 characters; a third would make 30
    history.add(5, "y" * 40)  # over the budget alone: kept, and everything older goes
    assert [entry[1] for entry in history.entries] == [5]
    history.add(6, "z")
    assert [entry[1] for entry in history.entries] == [6]  # 41 would be over: the 40 goes
    assert history.codes(5) == ["z"]


def test_range_and_search_answer_from_the_same_entries() -> None:
    history = CellHistory()
    for line, code in enumerate(["x=1", "echo $x", "x=1"], start=1):
        history.add(line, code)
    assert history.query("range", 0, 2, 4, None, None, False) == [(1, 2, "echo $x"), (1, 3, "x=1")]
    assert history.query("search", None, None, None, None, "x=*", True) == [(1, 3, "x=1")]
    assert history.query("tail", None, None, None, 1, None, False) == [(1, 3, "x=1")]
