"""Small helpers of the faults suite: process bookkeeping (on top of `tests.processes`) and seeds."""

from __future__ import annotations

import os
import signal

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
