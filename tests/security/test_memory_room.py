"""Memory limits that hold: memory a cell never maps (a memfd, SysV shared memory) stays under the
limit, a limit too small to start the sandbox is named at start instead of leaving every cell to
wait, and a small one that leaves room runs cells. As root (a cgroup) and as a plain user (rlimits)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from owsandbox.host.isolation import resources as L
from owsandbox.host.providers import bwrap
from owsandbox.host.workspace import RunnerWorkspace

from ..conftest import require_bwrap
from ..plain_python import as_user
from ..waiting import wait_until
from .conftest import plain_user
from .test_syscalls import python_in_box

HOLD = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
try:
    fd = os.memfd_create("hold")
except OSError as exc:
    print(json.dumps({"memfd": exc.errno}), flush=True)
else:
    chunk, held = b"x" * (32 << 20), 0
    for _ in range(48):
        os.write(fd, chunk)
        held += len(chunk)
        print(json.dumps({"held": held}), flush=True)
ctypes.set_errno(0)
print(json.dumps({"shmget": [libc.shmget(0, 3 << 29, 0o1600), ctypes.get_errno()]}), flush=True)
"""


def test_memory_never_mapped_stays_under_the_limit(attacker_factory, home: Path, who: str):
    """48 writes of 32 MiB into a memfd held 1.5 GiB under memory=1G where rlimits bound the address
    space only: there memfd_create and shmget are refused; a cgroup counts the pages and stops them."""
    attacker = attacker_factory()
    attacker.start(home / "project", limits=["memory=1G"])
    enforced = attacker.step(describe=True)["limits enforced by"]
    done = attacker.run(python_in_box(HOLD), timeout=120)
    said = [json.loads(line) for line in done["output"].splitlines() if line.startswith("{")]
    held = max([s.get("held", 0) for s in said] or [0])
    assert held < 1 << 30, (held, done)
    if enforced.startswith("rlimits"):
        assert {"memfd": 1} in said and {"shmget": [-1, 1]} in said, said
        assert "memfd_create and SysV shared memory" in attacker.step(describe=True)["seccomp"]
    else:
        assert done["exit_code"] != 0 and done["counters_after"]["oom_kills"] > done["counters_before"]["oom_kills"]
    assert attacker.run("echo fine")["output"] == "fine\n"


def test_a_limit_too_small_to_start_is_named_at_start(attacker_factory, home: Path, who: str):
    attacker = attacker_factory()
    answer = attacker.step(start={"cwd": str(home / "project"), "runner_path": attacker.runner,
                                  "limits": ["memory=16M"]})
    kind = "cgroup" if who == "root" else "rlimits"
    floor = L.human_size(L.MIN_MEMORY[kind])
    assert answer.get("error", "").startswith(
        f"LimitTooSmall: memory=16 MiB leaves no room for the sandbox's daemon and shell under {kind} "
        f"(at least {floor})"), answer


def test_a_process_limit_the_user_is_already_at_is_named_at_start(attacker_factory, home: Path, who: str):
    """Without a cgroup the processes limit is RLIMIT_NPROC, which counts every process and thread of the
    user on the machine (a student's Jupyter server and kernels among them): a user already running more
    than the limit gets a sandbox refused at bubblewrap's first clone. The error names the limit, what it
    counts and how many the user runs, instead of bubblewrap's bare "Resource temporarily unavailable"."""
    if who == "root":
        pytest.skip("root is never refused by RLIMIT_NPROC, and a cgroup counts only the box's own processes")
    user = plain_user()
    sleep = ["sleep", "600"]
    argv = as_user(user.pw_name, sleep, {"PATH": "/usr/bin:/bin"}) if os.getuid() == 0 else sleep
    sleepers = [subprocess.Popen(argv, start_new_session=True) for _ in range(24)]
    try:
        wait_until(lambda: L.tasks_of(user.pw_uid) >= 24, 30, "the user's 24 sleepers to run")
        attacker = attacker_factory()
        answer = attacker.step(start={"cwd": str(home / "project"), "runner_path": attacker.runner,
                                      "limits": ["pids=16"]})
    finally:
        for sleeper in sleepers:
            os.killpg(sleeper.pid, signal.SIGKILL)
            sleeper.wait()
    if answer.get("started"):
        assert attacker.step(describe=True)["limits enforced by"].startswith("cgroup"), answer
        pytest.skip("this plain user has a cgroup of its own, which counts only the box's processes")
    error = answer.get("error", "")
    assert error.startswith("LimitTooSmall: pids=16, the processes limit, was reached as the sandbox started"), answer
    assert f"every process and thread of user {user.pw_uid} on this machine" in error, error
    runs = int(error.split("that user runs ")[1].split()[0])
    assert runs >= 24, error


def test_a_small_limit_with_room_runs_cells_on_several_shells(attacker_factory, home: Path):
    """As a plain user, memory=256M once ran no cell at all: the daemon's threads reserved more
    address space (malloc arenas, 8 MiB stacks) than the limit, and the first cell waited forever."""
    attacker = attacker_factory()
    attacker.start(home / "project", limits=["memory=256M"])
    assert attacker.run("echo hi")["output"] == "hi\n"
    assert attacker.run("python3 -c 'print(sum(range(10**6)))'")["output"] == "499999500000\n"
    many = attacker.run("for i in $(seq 8); do (sleep 0.2; echo $i) & done; wait; echo all")
    assert many["output"].endswith("all\n"), many


@pytest.mark.parametrize("enforcement", ["cgroup", "rlimits"])
def test_a_sandbox_starved_as_it_starts_is_named_by_what_it_left(monkeypatch, enforcement: str):
    """Above the floor (lowered here to see it), the daemon runs out of memory as it starts: the error is
    LimitTooSmall, from the OOM kill counted by the cgroup or the words of a process refused memory."""
    require_bwrap()
    if enforcement == "cgroup" and L.CgroupEnforcement.make(L.Limits()) is None:
        pytest.skip("no cgroup can be made here")
    monkeypatch.setattr(bwrap, "check_room", lambda limits, kind: None)
    if enforcement == "rlimits":
        monkeypatch.setattr(bwrap, "enforce", L.Enforcement)
    with tempfile.TemporaryDirectory() as folder:
        provider = bwrap.BwrapProvider(cwd=folder, limits=["memory=8M"])
        with pytest.raises(L.LimitTooSmall, match=f"memory=8 MiB was too small for the sandbox's daemon under "
                                                  f"{enforcement}: it ran out of memory as it started"):
            RunnerWorkspace(provider, folder)
        assert provider.state_dir is None  # its one-off folder went with it


@pytest.mark.unit
def test_a_refused_process_is_told_by_what_the_clone_or_fork_said():
    assert L.refused_a_process("box| bwrap: Creating new namespace failed: Resource temporarily unavailable")
    assert L.refused_a_process("bash: fork: retry: Resource temporarily unavailable")
    assert not L.refused_a_process("bwrap: Can't mount proc on /newroot/proc: Operation not permitted")
    shown = str(L.out_of_processes(L.Limits.parse(["pids=64"]), "cgroup", "bwrap: clone: Resource temporarily "
                                                                          "unavailable"))
    assert shown.startswith("pids=64, the processes limit, left the sandbox no room to start (bwrap: clone: "
                            "Resource") and "OWSANDBOX_LIMITS=pids=" in shown


@pytest.mark.unit
def test_what_counts_as_starved():
    assert L.starved("", {"oom_kills": 1})
    assert L.starved("python3.11: error while loading shared libraries: libm.so.6: failed to map segment", {})
    assert L.starved("RuntimeError: can't start new thread", {})
    assert not L.starved("bwrap: Can't mount proc on /newroot/proc: Operation not permitted", {"oom_kills": 0})
