"""How the suite is spread over pytest-xdist's workers: a module at a time, the longest first.

A module's tests run in one worker, one after another, as they do without workers: they share
module-scoped fixtures (a kernel, a JupyterHub, a gateway), and often names too (a kernel key, a
student's account, a state folder), which two workers would otherwise use at once. Every module with a
test on the tests' own dockerd (its `docker` fixture, or an engine fixture given "docker") is in the one
unit `docker`, so that one worker starts one dockerd and loads the test images into it once. Tests
marked `xdist_group(NAME)` by hand form the unit NAME.

The units go from the workers, which collect, to the scheduler, which does not, in a file of their own
(`Units`): xdist's own way, a `@NAME` suffix its worker writes into each test's node id, silently does
nothing on pytest 9.2, whose node ids are structured (pytest-xdist issue 1386), and then a module's
tests were spread over every worker, each setting the module's fixtures up again.

Units start longest first, so that a long one never starts last while the other workers sit idle: by
the seconds the last run on this checkout recorded (pytest's cache), else by the seconds a run recorded
in tests/unit_seconds.json, else by size.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

DURATIONS_KEY = "owsandbox/unit-seconds"
UNITS_FILE = "owsandbox_units_file"  # the key of the units file in each worker's workerinput
# A fresh clone (CI's) has no recorded seconds: the order then comes from a run's, kept here. Units of
# 5 s or more, from pytest's cache after a whole four-worker run (.pytest_cache/v/owsandbox/unit-seconds).
SEEDED_SECONDS = Path(__file__).with_name("unit_seconds.json")


def uses_docker(item: pytest.Item) -> bool:
    """Whether the test runs on the tests' own dockerd: its fixture, or an engine fixture given "docker"
    (tests/containers.py: engine_of)."""
    callspec = getattr(item, "callspec", None)
    return "docker" in getattr(item, "fixturenames", ()) or "docker" in (callspec.params.values() if callspec else ())


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def mark_groups(items: list[pytest.Item]) -> dict[str, str]:
    """Give each test the `xdist_group` mark of its unit: its module's, or `docker`; a group named by
    hand is kept. Returns each test's unit by its node id."""
    on_docker = {module_of(item.nodeid) for item in items if uses_docker(item)}
    units: dict[str, str] = {}
    for item in items:
        named = [mark.args[0] if mark.args else mark.kwargs.get("name", "default")
                 for mark in item.iter_markers("xdist_group") if mark.args or mark.kwargs]
        if named:
            units[item.nodeid] = "_".join(sorted({str(name) for name in named}))
            continue
        module = module_of(item.nodeid)
        units[item.nodeid] = "docker" if module in on_docker else module
        item.add_marker(pytest.mark.xdist_group(units[item.nodeid]))
    return units


def unit_of(nodeid: str, units: dict[str, str] | None = None) -> str:
    """The unit of a collected test: as its worker said (`units`); else the `@NAME` suffix an older
    pytest's xdist adds; else its module."""
    if units and nodeid in units:
        return units[nodeid]
    if nodeid.rfind("@") > nodeid.rfind("]"):
        named = nodeid.rsplit("@", 1)
        return units.get(named[0], named[1]) if units else named[1]
    return module_of(nodeid)


def longest_first(units: dict[str, dict[str, bool]], seconds: dict[str, float]) -> list[str]:
    """The units in the order they start: recorded seconds (longest first), then size."""
    return sorted(units, key=lambda unit: (-seconds.get(unit, 0.0), -len(units[unit])))


def recorded_seconds(config: Any) -> dict[str, float]:
    """Each unit's seconds, as the last run on this checkout recorded them, else as SEEDED_SECONDS says."""
    recorded = config.cache.get(DURATIONS_KEY, {}) if getattr(config, "cache", None) else {}
    return {**seeded_seconds(), **seconds_of(recorded)}


def seeded_seconds(path: Path = SEEDED_SECONDS) -> dict[str, float]:
    try:
        return seconds_of(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def seconds_of(recorded: Any) -> dict[str, float]:
    return {str(unit): float(value) for unit, value in recorded.items()
            if isinstance(value, (int, float))} if isinstance(recorded, dict) else {}


def whole_units(seconds: dict[str, float], units: dict[str, str] | None, reported: set[str]) -> dict[str, float]:
    """The seconds of the units every collected test of which reported (`units`: each test's unit, from
    collection, before `-m` or `-k` deselect any): a run of part of a unit (`-m unit`, say) would
    record that unit as short, and the next whole run would start it late, to run on alone at the end.
    Without `units` (no worker wrote them) nothing is known whole, and nothing is recorded."""
    if not units:
        return {}
    missing = {unit for nodeid, unit in units.items() if nodeid not in reported}
    return {unit: value for unit, value in seconds.items() if unit not in missing}


def read_units(path: Path | None) -> dict[str, str]:
    """The units a worker wrote, or none (no workers, or none has collected yet)."""
    try:
        found = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return {str(key): str(value) for key, value in found.items()} if isinstance(found, dict) else {}


def write_units(path: Path, units: dict[str, str]) -> None:
    """Whole or not at all: every worker writes the same units, and the scheduler may read at any time."""
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=".units-")
    with os.fdopen(handle, "w") as out:
        json.dump(units, out)
    os.replace(partial, path)


class ModuleScheduling(LoadScopeScheduling):
    """xdist's LoadScopeScheduling with the units above, handed out longest first."""

    def __init__(self, config: Any, log: Any = None, units: Path | None = None) -> None:
        super().__init__(config, log)
        self.seconds = recorded_seconds(config)
        self.units_file = units
        self.units: dict[str, str] | None = None
        self.ordered = False

    def _split_scope(self, nodeid: str) -> str:
        if self.units is None:  # first asked in schedule(), once every worker has collected and written
            self.units = read_units(self.units_file)
        return unit_of(nodeid, self.units)

    def _assign_work_unit(self, node: Any) -> None:
        if not self.ordered:  # the queue is full now, before its first unit goes out
            self.ordered = True
            for unit in longest_first(dict(self.workqueue), self.seconds):
                self.workqueue.move_to_end(unit)
        super()._assign_work_unit(node)


class Units:
    """The pytest plugin that spreads the suite, registered in every process by tests/conftest.py.

    In the controlling process it names a units file for the workers, hands the scheduler, and sums
    each unit's test durations (setup, call and teardown) as the workers report them, kept in pytest's
    cache for the next run's order (a unit's only when all its tests ran: `whole_units`). In a worker it
    marks the tests' groups and writes the file."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.folder: Path | None = None
        self.seconds: dict[str, float] = {}
        self.reported: set[str] = set()
        self.units: dict[str, str] | None = None

    def units_file(self) -> Path:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="owsbx-units-"))
        return self.folder / "units.json"

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """The controller, as it starts each worker."""
        node.workerinput[UNITS_FILE] = str(self.units_file())

    @pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the xdist_group marks on older pytest
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        units = self.units = mark_groups(items)  # a run without workers records its seconds by these
        path = getattr(self.config, "workerinput", {}).get(UNITS_FILE)
        if path:
            write_units(Path(path), units)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: Any, log: Any) -> Any:
        return ModuleScheduling(config, log, self.units_file())

    def pytest_runtest_logreport(self, report: Any) -> None:
        if hasattr(self.config, "workerinput"):
            return
        if self.units is None and self.folder is not None:
            self.units = read_units(self.units_file()) or None
        unit = unit_of(report.nodeid, self.units)
        self.seconds[unit] = self.seconds.get(unit, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)
        self.reported.add(report.nodeid)

    def pytest_sessionfinish(self) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is None or not self.seconds or hasattr(self.config, "workerinput"):
            return
        recorded = cache.get(DURATIONS_KEY, {})
        whole = whole_units(self.seconds, self.units, self.reported)
        merged = {**(recorded if isinstance(recorded, dict) else {}),
                  **{unit: round(seconds, 2) for unit, seconds in whole.items()}}
        cache.set(DURATIONS_KEY, merged)

    def pytest_unconfigure(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
