"""A cell tries to take the machine's memory, processes and disk: each attempt ends at the sandbox's
limit with a named error, and the next command works. Run as root (a cgroup enforces and counts)
and as a plain user (rlimits enforce; the error is named from what the command said)."""

from __future__ import annotations

from pathlib import Path

from owsandbox.host.isolation.resources import LimitReport
from owsandbox.kernel.cell.limit_names import named_limit

from .conftest import Attacker


def _limited(attacker_factory, home: Path, **limits: str) -> Attacker:
    attacker = attacker_factory()
    attacker.start(home / "project", limits=[f"{k}={v}" for k, v in limits.items()])
    return attacker


def _named(done: dict) -> tuple[str, str] | None:
    return named_limit(done, done["counters_before"], done["counters_after"], LimitReport.from_json(done["limits"]))


def test_a_huge_allocation_ends_as_out_of_memory(attacker_factory, home: Path, who: str):
    attacker = _limited(attacker_factory, home, memory="1G")
    done = attacker.run("python3 -c 'b = bytearray(8 << 30); print(len(b))'")
    assert done["exit_code"] != 0 and "8589934592" not in done["output"]
    assert _named(done)[0] == "OutOfMemory", done
    assert "1 GiB" in _named(done)[1]
    if who == "root":
        assert done["counters_after"]["oom_kills"] > done["counters_before"]["oom_kills"]  # counted, not guessed
    again = attacker.run("pwd; echo fine")
    assert again["exit_code"] == 0 and again["output"].endswith("project\nfine\n")


def test_a_fork_bomb_ends_at_the_process_limit(attacker_factory, home: Path, who: str):
    attacker = _limited(attacker_factory, home, pids=64)
    done = attacker.run("for i in $(seq 100); do sleep 3 & done; wait", timeout=90)
    assert _named(done)[0] == "TooManyProcesses", done
    assert "64 processes" in _named(done)[1]
    running = attacker.run("ps -e --no-headers | wc -l")
    assert running["exit_code"] == 0 and int(running["output"].split()[-1]) <= 64
    assert attacker.run("echo fine")["output"] == "fine\n"


def test_filling_tmp_ends_at_its_size(attacker_factory, home: Path):
    attacker = _limited(attacker_factory, home, tmp="16M", shm="8M")
    done = attacker.run("dd if=/dev/zero of=/tmp/big bs=1M count=64")
    assert done["exit_code"] != 0 and _named(done)[0] == "NoSpaceLeft", done
    shm = attacker.run("dd if=/dev/zero of=/dev/shm/big bs=1M count=64")
    assert shm["exit_code"] != 0 and _named(shm)[0] == "NoSpaceLeft"
    sizes = attacker.run("df --output=size -B1M /tmp /dev/shm | tail -n 2")["output"].split()
    assert sizes == ["16", "8"], sizes
    assert attacker.run("rm /tmp/big /dev/shm/big; echo fine")["output"] == "fine\n"


def test_limits_are_shown(attacker_factory, home: Path, who: str):
    attacker = _limited(attacker_factory, home, memory="1G", pids="300")
    info = attacker.step(describe=True)
    assert info["limits"]["memory"] == "1 GiB" and info["limits"]["processes"] == "300"
    enforced = info["limits enforced by"]
    assert enforced.startswith("cgroup" if who == "root" else ("cgroup", "rlimits")), enforced
