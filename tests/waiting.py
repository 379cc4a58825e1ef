"""Waiting for something to happen, the one way tests poll.

Some states nothing announces: a process ending, a file appearing, a shell turning busy. A test that
needs one polls for it, and `wait_until` is that loop, so one place decides how tests poll and a
timeout always says what was awaited, for how long and what was seen last. Where something does
announce itself (a message, an event, a pidfd), wait on that instead.

The other way round, a command a test runs may have to wait for the test: to print its next line only
once the test has seen the last, or to end only once the test has looked. `shell_waits_for` is that
loop, written in bash, so every such command waits the same way and none waits for ever.
"""

from __future__ import annotations

import math
import os
import shlex
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["WaitTimeout", "patience", "shell_waits_for", "wait_until"]

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """What `wait_until` raises when it gives up (`contextlib.suppress` it where not coming is fine)."""


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    """The first truthy value of `condition()`, called every `interval` s for up to `timeout` s (and
    once more when the time is up); WaitTimeout naming `what` if none came."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = "" if value is None or value is False else f" (last seen: {value!r})"
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}{seen}")
        time.sleep(interval)


def patience(seconds: float) -> float:
    """A bound of `seconds` on a quiet machine, stretched by how busy this one is now (its load average
    per core, at least 1): for the few waits that need a bound on how long something takes, not only
    whether it comes, so that they hold on a loaded machine and still fail on a stuck one."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return seconds * max(1.0, load)


def shell_waits_for(path: str | os.PathLike[str], seconds: float = 60, interval: float = 0.05) -> str:
    """Bash that waits until `path` exists (the test makes it), looking every `interval` s for up to
    `seconds`, then goes on either way: a command that should not go on without it checks `path`
    again (`[ -e PATH ] && … || echo never seen`), and the test fails on what it printed, not on a hang."""
    quoted = shlex.quote(str(path))
    return f"for i in $(seq {math.ceil(seconds / interval)}); do [ -e {quoted} ] && break; sleep {interval:g}; done"
