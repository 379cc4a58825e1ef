"""The suite's spread over workers (tests/scheduling.py): which tests share a unit, and which starts first."""

from __future__ import annotations

import pytest

from .scheduling import (
    DURATIONS_KEY,
    longest_first,
    read_units,
    recorded_seconds,
    seeded_seconds,
    unit_of,
    whole_units,
    write_units,
)

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


def test_a_fresh_clone_orders_its_units_by_the_seeded_seconds(tmp_path):
    """CI's clone has no pytest cache: the seeded file puts the long units first, and a unit's own
    recorded seconds win over the seed's."""

    class Cache:
        def __init__(self, recorded):
            self.recorded = recorded

        def get(self, key, default):
            return self.recorded.get(key, default)

    class Config:
        def __init__(self, recorded):
            self.cache = Cache(recorded)

    seeded = seeded_seconds()
    assert seeded["docker"] > 60 and seeded["tests/faults/test_floods.py"] > 60, seeded  # the longest units are in it
    assert recorded_seconds(Config({})) == seeded
    assert recorded_seconds(Config({DURATIONS_KEY: {"docker": 1.0}}))["docker"] == 1.0
    broken = tmp_path / "seconds.json"
    broken.write_text("{")
    assert seeded_seconds(broken) == {}


def test_a_unit_is_recorded_only_when_every_test_of_it_ran():
    """`-m unit` runs part of the docker unit: recorded, it would start that unit last in the next whole run."""
    units = {"tests/test_a.py::x": "tests/test_a.py", "tests/test_a.py::y": "tests/test_a.py",
             "tests/test_b.py::z": "docker", "tests/test_c.py::w": "docker"}
    seconds = {"tests/test_a.py": 3.0, "docker": 0.5}
    assert whole_units(seconds, units, {"tests/test_a.py::x", "tests/test_a.py::y", "tests/test_b.py::z"}) == {
        "tests/test_a.py": 3.0}
    assert whole_units(seconds, units, set(units)) == seconds
    assert whole_units(seconds, None, set(units)) == {}
