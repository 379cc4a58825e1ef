"""How the suite is spread over pytest-xdist's workers: a module at a time, the longest first.

A module's tests run in one worker, one after another, as they do without workers: they share
module-scoped fixtures (a kernel, a JupyterHub, a gateway), and often names too (a kernel key, a
student's account, a state folder), which two workers would otherwise use at once. Every module with a
test on the tests' own dockerd (its `docker` fixture, or an engine fixture given "docker") is in the one
unit `docker`, so that one worker starts one dockerd and loads the test images into it once. Tests
marked `xdist_group(NAME)` by hand form the unit NAME.

Units start longest first, so that a long one never starts last while the other workers sit idle: by
the seconds the last run on this checkout recorded (pytest's cache), else by size.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

DURATIONS_KEY = "owsandbox/unit-seconds"


def uses_docker(item: pytest.Item) -> bool:
    """Whether the test runs on the tests' own dockerd: its fixture, or an engine fixture given "docker"
    (tests/containers.py: engine_of)."""
    callspec = getattr(item, "callspec", None)
    return "docker" in getattr(item, "fixturenames", ()) or "docker" in (callspec.params.values() if callspec else ())


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def mark_groups(items: list[pytest.Item]) -> None:
    """Give each test the `xdist_group` mark of its unit (before xdist reads them): its module's, or
    `docker`; a group named by hand is kept."""
    on_docker = {module_of(item) for item in items if uses_docker(item)}
    for item in items:
        if any(mark.args or mark.kwargs for mark in item.iter_markers("xdist_group")):
            continue
        module = module_of(item)
        item.add_marker(pytest.mark.xdist_group("docker" if module in on_docker else module))


def unit_of(nodeid: str) -> str:
    """The unit of a collected test: its `xdist_group` (the `@NAME` suffix xdist adds; every test has
    one when the run has workers) or the test itself."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[1]
    return nodeid


def longest_first(units: dict[str, dict[str, bool]], seconds: dict[str, float]) -> list[str]:
    """The units in the order they start: recorded seconds (longest first), then size."""
    return sorted(units, key=lambda unit: (-seconds.get(unit, 0.0), -len(units[unit])))


def recorded_seconds(config: Any) -> dict[str, float]:
    """Each unit's seconds, as the last run on this checkout recorded them."""
    recorded = config.cache.get(DURATIONS_KEY, {}) if getattr(config, "cache", None) else {}
    return {str(unit): float(value) for unit, value in recorded.items()
            if isinstance(value, (int, float))} if isinstance(recorded, dict) else {}


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
