"""The suite's spread over pytest-xdist's workers (tests/scheduling.py), on a small suite of its own run
by real pytest with two workers: a module's tests share one worker and set its fixtures up once, and
the modules on the tests' dockerd share one worker. pytest 9.2 with xdist 3.8 spread a module's tests
over every worker (xdist's group suffix no longer reaches the scheduler), each setting the module's
fixtures up again: nbgrader's grading, four times over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

TESTS = Path(__file__).resolve().parent

CONFTEST = f'''
import json, os, sys
import pytest
sys.path.insert(0, {str(TESTS.parent)!r})
from tests.scheduling import Units

def pytest_configure(config):
    config.pluginmanager.register(Units(config), "owsandbox-units")

def record(what):
    with open(os.environ["SPREAD_LOG"], "a") as log:
        log.write(json.dumps([what, os.getpid()]) + "\\n")

@pytest.fixture(scope="module")
def shared(request):
    record("setup " + request.module.__name__)

@pytest.fixture
def docker():
    return None
'''

MODULE = '''
def test_one(shared, request):
    import time
    from conftest import record
    record(request.node.nodeid)
    time.sleep(0.1)  # long enough that both workers are busy when a unit is handed out
'''


def test_a_modules_tests_share_a_worker_and_set_its_fixtures_up_once(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "pytest.ini").write_text("[pytest]\n")
    six = "".join(MODULE.replace("test_one", f"test_{n}") for n in range(6))
    for name in ("alpha", "beta", "gamma"):
        (suite / f"test_{name}.py").write_text(six)
    for name in ("dock_one", "dock_two", "dock_three", "dock_four"):  # on the tests' dockerd: one unit
        (suite / f"test_{name}.py").write_text(six.replace("(shared, request)", "(shared, docker, request)"))
    log = tmp_path / "log"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", str(suite)], cwd=suite, capture_output=True, text=True,
                          timeout=120, env={**_env(), "SPREAD_LOG": str(log)})
    assert done.returncode == 0, done.stdout + done.stderr
    events = [json.loads(line) for line in log.read_text().splitlines()]
    setups = [what for what, _ in events if what.startswith("setup ")]
    assert sorted(setups) == sorted(f"setup test_{name}" for name in ("alpha", "beta", "gamma", "dock_one", "dock_two",
                                                                     "dock_three", "dock_four"))
    workers: dict[str, set[int]] = {}
    for what, pid in events:
        if not what.startswith("setup "):
            workers.setdefault(what.split("::")[0], set()).add(pid)
    assert all(len(pids) == 1 for pids in workers.values()), workers
    docked = {frozenset(pids) for module, pids in workers.items() if module.startswith("test_dock_")}
    assert len(workers) == 7 and len(docked) == 1, workers
    assert len({pid for pids in workers.values() for pid in pids}) == 2, workers  # both workers had work


def _env() -> dict[str, str]:
    """This run's environment less pytest's own (xdist's worker variables would mislead the inner run)."""
    return {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
