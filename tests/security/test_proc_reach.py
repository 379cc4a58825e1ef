"""Cell code reaches for the host's files and sockets through /proc: the daemon's descriptors (its
log, the two listening sockets the host made), by path, by ptrace and by pidfd_getfd, and whatever
bubblewrap's init (the box's pid 1) holds. Run as root and as a plain user."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from owsandbox.host.isolation import seccomp

from ..machine_lock import own_key
from ..waiting import wait_until
from .conftest import Attacker
from .test_syscalls import python_in_box

DAEMON = 2  # the box's pid 1 is bubblewrap's init; the daemon is its one child


def _log(state: str) -> Path:
    return Path(state) / "daemon.log"


def _settled_size(path: Path) -> int:
    """The log's size once the host has stopped writing to it for a moment."""
    last, since = -1, time.monotonic()
    while time.monotonic() - since < 0.5:
        size = path.stat().st_size if path.exists() else 0
        if size != last:
            last, since = size, time.monotonic()
        time.sleep(0.05)
    return last


def test_the_daemons_descriptors_are_out_of_reach(attacker: Attacker):
    state = attacker.step(state=True)["state_dir"]
    for attempt in (f"echo FORGED >> /proc/{DAEMON}/fd/2", f"readlink /proc/{DAEMON}/fd/3",
                    f"cat /proc/{DAEMON}/fd/3", f"cat /proc/{DAEMON}/environ", f"head -c1 /proc/{DAEMON}/mem",
                    f"ls /proc/{DAEMON}/map_files/", f"cat /proc/{DAEMON}/fdinfo/3",
                    python_in_box(f"import socket; s = socket.socket(fileno=open('/proc/{DAEMON}/fd/3').fileno())")):
        done = attacker.run(attempt)
        assert done["exit_code"] != 0, (attempt, done)
    numbers = seccomp.native_arch().numbers
    taken = attacker.run(python_in_box(
        "import ctypes, json, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"pidfd = os.pidfd_open({DAEMON})\n"
        "got = {}\n"
        "for fd in range(3, 20):\n"
        "    ctypes.set_errno(0)\n"
        f"    got[fd] = [libc.syscall({numbers['pidfd_getfd']}, pidfd, fd, 0), ctypes.get_errno()]\n"
        "ctypes.set_errno(0)\n"
        f"got['ptrace'] = [libc.ptrace(16, {DAEMON}, 0, 0), ctypes.get_errno()]\n"  # PTRACE_ATTACH
        "print(json.dumps(got))\n"))
    got = json.loads(taken["output"].splitlines()[-1])
    assert all(result == -1 and errno == seccomp.EPERM for result, errno in got.values()), got
    assert "FORGED" not in _log(state).read_text(errors="replace")
    assert attacker.run("echo still")["output"] == "still\n"


def test_bubblewraps_init_holds_no_host_file_nor_socket(attacker: Attacker):
    """The box's pid 1 can be read by the box: what it holds is /dev/null, pipes and its eventfd."""
    held = attacker.run("for fd in /proc/1/fd/*; do readlink $fd; done")
    assert held["exit_code"] == 0, held
    targets = held["output"].split()
    assert targets and all(t == "/dev/null" or t.startswith(("pipe:", "anon_inode:")) for t in targets), targets


def test_the_boxs_mounts_name_nothing_of_the_hosts_private_folders(attacker: Attacker):
    """/proc/self/mountinfo shows each bind's source: the runner file, once bound from this user's private
    runtime folder, told the box where that folder is (and the kernel's state folder is inside it)."""
    facts = attacker.step(state=True)
    mounts = attacker.run("cat /proc/self/mountinfo")
    assert mounts["exit_code"] == 0 and "/run/owsandbox/runner.pyz" in mounts["output"], mounts
    for private in (os.path.dirname(facts["runner_path"]), facts["state_dir"]):
        assert private not in mounts["output"], (private, mounts["output"])
    assert attacker.run("python3 -S /run/owsandbox/runner.pyz --help")["exit_code"] == 0  # the copy runs


def test_the_hosts_log_stays_small_whatever_the_box_writes(attacker: Attacker):
    """pid 1's stderr is the host's log pipe: what the box writes there is its own log, and the host
    keeps only the last MiB or two of it, in a file the box never holds."""
    state = attacker.step(state=True)["state_dir"]
    flood = attacker.run("yes 'FLOOD from the box, a long line of it' | head -c 8000000 > /proc/1/fd/2; echo sent",
                         timeout=120)
    assert flood["output"].endswith("sent\n"), flood
    wait_until(lambda: _log(state).exists(), 10, "the host's log")
    size = _settled_size(_log(state))
    assert 0 < size <= 2 * (1 << 20) + 65536, size
    text = _log(state).read_text(errors="replace")
    assert text.startswith("[owsandbox: earlier lines of this log were dropped") and "FLOOD" in text
    assert not _log(state).is_symlink()
    assert attacker.run("echo fine")["output"] == "fine\n"


def test_a_lingering_daemon_outlives_the_reader_of_its_log(attacker_factory, home: Path):
    """The kernel that copied the log is killed; the daemon lingers and logs into a pipe nobody reads
    (every request, at debug level), and the next kernel finds it alive and answering."""
    first = attacker_factory(OWSANDBOX_LOG="debug")
    first.start(home / "project", key=own_key("kernel-log-reader"), linger_seconds=30)
    assert first.run("echo one")["output"] == "one\n"
    init = first.step(state=True)["init_pid"]
    first.kill()
    second = attacker_factory(OWSANDBOX_LOG="debug")
    second.start(home / "project", key=own_key("kernel-log-reader"), linger_seconds=5)
    for round_ in range(20):
        assert second.run(f"echo {round_}")["output"] == f"{round_}\n"
    assert second.step(state=True)["init_pid"] == init  # the same sandbox, not a new one
