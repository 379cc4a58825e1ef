"""One test process at a time for what is the machine's, not the test's: a system user, an install.

The suite runs in several worker processes (pytest-xdist), and two test runs may share a machine. What
they make per process (folders, ports, namespaces named by pid, kernelspecs) never collides; what exists
once per machine (a user in /etc/passwd, a prepared virtual environment, a container image) is made
under an exclusive lock on a file in the system's temporary folder, and the second comer finds it made.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

PROCESS_TAG = secrets.token_hex(3)


def own_key(name: str) -> str:
    """A sandbox key of this test process's own: a key names the user's runtime folder (and a container's
    record), where a daemon with that key is found again, so two runs (or workers) giving the same
    literal key would reach each other's box. Every call in one process gives the same key for `name`."""
    return f"{name}-{PROCESS_TAG}"


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold the machine-wide lock `name` (every test process on this machine waits for it)."""
    with open(os.path.join(tempfile.gettempdir(), f"owsandbox-tests-{name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_user(name: str) -> pwd.struct_passwd:
    """A system user with a home, made with useradd when missing (the tests that call this run as root)."""
    with machine_lock("users"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
            return pwd.getpwnam(name)


def ids_of_user(user: pwd.struct_passwd) -> list[range]:
    """The user ids whose processes are `user`'s: their own, and the subordinate ids /etc/subuid gives
    them (what their rootless containers run as, root in them being the user), however it was given
    (by useradd, which gives a range to a new user, or by usermod)."""
    ids = [range(user.pw_uid, user.pw_uid + 1)]
    try:
        with open("/etc/subuid") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return ids
    for line in lines:
        owner, _, rest = line.partition(":")
        start, _, count = rest.partition(":")
        if owner in (user.pw_name, str(user.pw_uid)) and start.isdigit() and count.isdigit():
            ids.append(range(int(start), int(start) + int(count)))
    return ids
