"""The suite's spread over workers (tests/scheduling.py): which tests share a unit, and which starts first."""

from __future__ import annotations

import pytest

from .scheduling import longest_first, read_units, unit_of, write_units

pytestmark = pytest.mark.unit


def test_a_test_is_in_the_unit_its_worker_wrote_else_in_its_groups_suffix_else_in_its_module():
    units = {"tests/test_provider_container.py::test_y[docker]": "docker"}
    assert unit_of("tests/test_provider_container.py::test_y[docker]", units) == "docker"
    assert unit_of("tests/test_provider_container.py::test_y[docker]@docker", units) == "docker"
    assert unit_of("tests/test_kernel.py::test_x@tests/test_kernel.py") == "tests/test_kernel.py"  # older pytest
    assert unit_of("tests/test_a.py::test_z[user@host]") == "tests/test_a.py"  # an @ in a parameter
    assert unit_of("tests/test_a.py::TestB::test_z", units) == "tests/test_a.py"


def test_the_units_file_is_read_whole_or_as_none(tmp_path):
    path = tmp_path / "units.json"
    assert read_units(path) == {}  # no worker has collected yet
    write_units(path, {"tests/test_a.py::test_z": "tests/test_a.py"})
    assert read_units(path) == {"tests/test_a.py::test_z": "tests/test_a.py"}
    path.write_text('{"tests/test_a.py::te')  # cut short
    assert read_units(path) == {}
    assert read_units(None) == {}


def test_the_longest_recorded_unit_starts_first_then_the_largest_unrecorded():
    units = {"a": {"1": False}, "docker": {"2": False, "3": False}, "c": {"4": False, "5": False, "6": False},
             "d": {"7": False}}
    assert longest_first(units, {"a": 90.0, "docker": 120.0}) == ["docker", "a", "c", "d"]
    assert longest_first(units, {}) == ["c", "docker", "a", "d"]
