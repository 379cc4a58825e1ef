"""The suite's spread over workers (tests/scheduling.py): which tests share a unit, and which starts first."""

from __future__ import annotations

import pytest

from .scheduling import longest_first, unit_of

pytestmark = pytest.mark.unit


def test_a_test_with_a_group_suffix_is_in_that_groups_unit_and_any_other_is_a_unit_of_its_own():
    assert unit_of("tests/test_kernel.py::test_x@tests/test_kernel.py") == "tests/test_kernel.py"
    assert unit_of("tests/test_provider_container.py::test_y[docker]@docker") == "docker"
    assert unit_of("tests/test_a.py::test_z[user@host]") == "tests/test_a.py::test_z[user@host]"  # an @ in a param
    assert unit_of("tests/test_a.py::test_z") == "tests/test_a.py::test_z"


def test_the_longest_recorded_unit_starts_first_then_the_largest_unrecorded():
    units = {"a": {"1": False}, "docker": {"2": False, "3": False}, "c": {"4": False, "5": False, "6": False},
             "d": {"7": False}}
    assert longest_first(units, {"a": 90.0, "docker": 120.0}) == ["docker", "a", "c", "d"]
    assert longest_first(units, {}) == ["c", "docker", "a", "d"]
