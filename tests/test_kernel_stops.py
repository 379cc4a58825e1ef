"""The kernel's Stop latch (owsandbox/kernel/stops.py): which runs a Stop ends, whenever it comes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from owsandbox.kernel.stops import CellStops

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
LATER = T0 + timedelta(milliseconds=1)


def test_a_stop_while_a_cell_runs_names_its_runs_and_stops_what_it_would_start_next():
    stops = CellStops()
    assert stops.cell_began(T0) is False
    assert stops.started("main", "r1") is False
    assert stops.stop(LATER) == [("main", "r1")]
    assert stops.before_start is True  # the cell starts nothing more
    stops.ended("main", "r1")
    stops.cell_ended()
    assert stops.cell_began(LATER + timedelta(seconds=1)) is False and stops.before_start is False


def test_a_stop_between_the_check_and_the_sending_is_carried_to_the_run():
    stops = CellStops()
    stops.cell_began(T0)
    assert stops.before_start is False
    assert stops.stop(LATER) == []  # the run is not sent yet: nothing to interrupt
    assert stops.started("main", "r1") is True  # so the sender interrupts it


def test_a_stop_before_the_cell_was_taken_up_stops_the_cells_sent_before_it_only():
    stops = CellStops()
    assert stops.stop(LATER) == []  # no cell yet: kept by its time
    assert stops.cell_began(T0) is True and stops.before_start is True  # sent before the Stop
    stops.cell_ended()
    assert stops.cell_began(LATER) is True  # sent in the same moment
    stops.cell_ended()
    assert stops.cell_began(LATER + timedelta(microseconds=1)) is False  # sent after: runs


def test_a_stop_pressed_while_idle_stops_nothing_later_and_a_cell_without_a_date_is_not_guessed():
    stops = CellStops()
    stops.stop(T0)
    assert stops.cell_began(None) is False
    stops.cell_ended()
    assert stops.cell_began(T0 + timedelta(seconds=5)) is False
    stops.cell_ended()
    stops.stop(datetime(2026, 1, 1, 1))  # a naive date: never compared with an aware one
    assert stops.cell_began(T0 - timedelta(seconds=1)) is False


def test_runs_outside_a_cell_are_still_interrupted():
    stops = CellStops()
    stops.started("side", "q1")  # a magic's run on another thread, no cell began
    assert stops.stop(T0) == [("side", "q1")]
    stops.ended("side", "q1")
    assert stops.running() == []
