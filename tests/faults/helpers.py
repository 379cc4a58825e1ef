"""Small helpers of the faults suite: process bookkeeping (on top of `tests.processes`), seeds, and a
busy machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tests.processes import pid_alive, wait_gone

alive = pid_alive


def rss_kb(pid: int) -> int:
    """The resident set size of `pid` in kB (VmRSS), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def reap(pids: list[int], wait: float = 5.0) -> list[int]:
    """Wait up to `wait` s for `pids` to end, then SIGKILL the ones still there and return them."""
    left = wait_gone(pids, wait)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    wait_gone(left, 5)
    return left


def seed_from_env(default: int) -> int:
    """The seed: OWSANDBOX_FAULTS_SEED if set (to replay a failure), else the test's fixed one. It is
    printed, so a failing run shows it in its captured output."""
    seed = int(os.environ.get("OWSANDBOX_FAULTS_SEED", default))
    print(f"[faults] seed={seed} (replay with OWSANDBOX_FAULTS_SEED={seed})")
    return seed


def seeds_from_env(defaults: tuple[int, ...]) -> tuple[int, ...]:
    """The seeds a drill runs with: OWSANDBOX_FAULTS_SEED alone if set (to replay a failure), else `defaults`."""
    given = os.environ.get("OWSANDBOX_FAULTS_SEED")
    return (int(given),) if given else defaults


# A busy loop that says when it runs and ends by itself after argv[1] seconds.
_HOG = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nprint('busy', flush=True)\n" \
       "while time.monotonic() < end:\n    pass\n"


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def idle_cores() -> int:
    """The cores the last minute's load average leaves idle (0 on a machine already busy)."""
    return max(0, cores() - int(os.getloadavg()[0]))


@contextmanager
def busy_machine(seconds: float, hogs: int | None = None) -> Iterator[list[int]]:
    """A busy loop on every core that is not busy already (or on `hogs` cores), all running when the
    block starts: a drill under load, as on a developer's machine running several things at once. The
    suite's other workers may load the machine already, and a hog beside them would only slow them:
    the load average says how many cores are taken. Each hog ends by itself after `seconds` at the
    latest (the bound, should this process die without its cleanup); all are killed and reaped when the
    block ends, however it ends. Yields their pids."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(hogs if hogs is not None else idle_cores()):
            procs.append(subprocess.Popen([sys.executable, "-S", "-c", _HOG, str(seconds)], stdout=subprocess.PIPE,
                                          stdin=subprocess.DEVNULL))
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"busy\n", f"a CPU hog did not start (status {proc.poll()})"
        yield [proc.pid for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
