"""How the suite is spread over pytest-xdist's workers: units of work, the longest first.

A unit is one test, unless its tests share something costly that each worker would otherwise start
again: the tests of a module that uses a module-scoped fixture (a kernel, a JupyterHub, a gateway) are
one unit, so that fixture starts once; every test that uses the tests' own dockerd is in the unit
`docker`, so that one worker starts one dockerd and loads the test images into it once. Tests marked
`xdist_group(NAME)` by hand form the unit NAME.

Units start longest first, so that a long one never starts last while the other workers sit idle: by
the seconds the last run on this checkout recorded (pytest's cache), else by those in
tests/durations.json (a run's record, kept with the tests: a stale figure only changes the order),
else by size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

DURATIONS_KEY = "owsandbox/unit-seconds"
RECORDED = Path(__file__).with_name("durations.json")
SHARED_SCOPES = ("module", "class", "package")


def group_of(item: pytest.Item) -> str | None:
    """The unit `item` must share with others (None: a unit of its own)."""
    if any(mark.args or mark.kwargs for mark in item.iter_markers("xdist_group")):
        return None  # named by hand: xdist's own suffix names it
    callspec = getattr(item, "callspec", None)
    if "docker" in getattr(item, "fixturenames", ()) or "docker" in (callspec.params.values() if callspec else ()):
        return "docker"  # the fixture itself, or an engine fixture that takes it (tests/containers.py: engine_of)
    info = getattr(item, "_fixtureinfo", None)
    for definitions in (info.name2fixturedefs.values() if info is not None else ()):
        if any(definition.scope in SHARED_SCOPES for definition in definitions):
            return item.nodeid.split("::", 1)[0]
    return None


def mark_groups(items: list[pytest.Item]) -> None:
    """Give each test that shares a unit the `xdist_group` mark that names it (before xdist reads them)."""
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def unit_of(nodeid: str) -> str:
    """The unit of a collected test: its `xdist_group` (the `@NAME` suffix xdist adds) or the test itself."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[1]
    return nodeid


def longest_first(units: dict[str, dict[str, bool]], seconds: dict[str, float]) -> list[str]:
    """The units in the order they start: recorded seconds (longest first), then size."""
    return sorted(units, key=lambda unit: (-seconds.get(unit, 0.0), -len(units[unit])))


def recorded_seconds(config: Any) -> dict[str, float]:
    """Each unit's seconds: the last run's on this checkout over the kept record's."""
    seconds: dict[str, float] = {}
    for source in (_read_json(RECORDED), getattr(config, "cache", None) and config.cache.get(DURATIONS_KEY, {})):
        if isinstance(source, dict):
            seconds.update({str(unit): float(value) for unit, value in source.items()
                            if isinstance(value, (int, float))})
    return seconds


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class ModuleScheduling(LoadScopeScheduling):
    """xdist's LoadScopeScheduling with the units above, handed out longest first."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self.seconds = recorded_seconds(config)
        self.ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        if not self.ordered:  # the queue is full now, before its first unit goes out
            self.ordered = True
            for unit in longest_first(dict(self.workqueue), self.seconds):
                self.workqueue.move_to_end(unit)
        super()._assign_work_unit(node)


class DurationRecorder:
    """A pytest plugin in the controlling process: sums each unit's test durations (setup, call and
    teardown) as the workers report them, and keeps them in pytest's cache for the next run's order."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        unit = unit_of(report.nodeid)
        self.seconds[unit] = self.seconds.get(unit, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)

    def pytest_sessionfinish(self) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is None or not self.seconds:
            return
        recorded = cache.get(DURATIONS_KEY, {})
        merged = {**(recorded if isinstance(recorded, dict) else {}),
                  **{unit: round(seconds, 2) for unit, seconds in self.seconds.items()}}
        cache.set(DURATIONS_KEY, merged)
