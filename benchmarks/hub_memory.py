"""What a class costs on one machine: JupyterHub with N students, each with one idle sandbox kernel.

Starts the hub of tests/hub.py (configurable-http-proxy, a password per student, each student's server
as their own system user, cells in bubblewrap), logs the students in one after another through the
hub's URL, opens the owsandbox kernel for each and runs a first cell; the time from each login to that
cell's result is the first figure. After `--settle` seconds of idleness, the memory of every process is
read from /proc (RSS, and PSS, which shares a shared page among the processes that map it, so that
sums are not inflated) and summed by part: the hub and the proxy once for the class; per student, the
single-user server, the kernel, the kernel's relays to its sandbox, and the sandbox (bubblewrap, the
box's daemon and its bash). The last line extrapolates to a class of `--class-size` (30).

Run as root from the repository root (it makes the users owsbx-hub-a, -b, … with useradd):
`.venv/bin/python benchmarks/hub_memory.py [--students N] [--settle S] [--class-size M]`.
Needs bubblewrap, configurable-http-proxy and the test extra (jupyterhub). The students are the tests'
own (tests/test_jupyterhub.py), so it takes the tests' classroom lock and waits while a test run holds it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hub import (  # noqa: E402
    Hub,
    HubKernel,
    class_of,
    classroom_users,
    memory_kib,
    processes_of,
    sandbox_of,
)
from tests.processes import command_line, descendants  # noqa: E402

PARTS = ("server", "kernel", "relay", "sandbox")


def student_parts(hub: Hub, name: str, kernel: HubKernel) -> dict[str, list[int]]:
    """The student's processes by part (every process of theirs is in one)."""
    server = hub.server_pid(name)
    box = sandbox_of(kernel.id)
    under_kernel = set(descendants(box.kernel_pid))
    parts: dict[str, list[int]] = {part: [] for part in (*PARTS, "other")}
    for pid in processes_of(hub.students[name].account.pw_uid):
        if pid == server:
            parts["server"].append(pid)
        elif pid == box.kernel_pid:
            parts["kernel"].append(pid)
        elif pid in box.pids or pid in descendants(box.bwrap_pid):
            parts["sandbox"].append(pid)
        elif pid in under_kernel and " attach " in command_line(pid):
            parts["relay"].append(pid)
        else:
            parts["other"].append(pid)
    return parts


def cell(rss: float, pss: float) -> str:
    return f"{rss:8.1f} /{pss:6.1f}".rjust(17)


def summed(pids: list[int]) -> tuple[float, float]:
    """(RSS, PSS) of `pids` together, in MiB."""
    rss = pss = 0
    for pid in pids:
        r, p = memory_kib(pid)
        rss, pss = rss + r, pss + p
    return rss / 1024, pss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=2)
    parser.add_argument("--settle", type=float, default=3.0, help="idle seconds before memory is read")
    parser.add_argument("--class-size", type=int, default=30)
    args = parser.parse_args()
    if os.getuid() != 0:
        print("run as root: the benchmark makes system users and spawns their servers", file=sys.stderr)
        return 2
    print("taking the classroom (a test run on this machine that has it is waited for)", flush=True)
    with classroom_users():  # the students are the tests' system users, and a hub's stop ends all of theirs
        return measure(args)


def measure(args: argparse.Namespace) -> int:
    """Start the hub, log the class in, read the memory, stop the hub (the caller holds the classroom)."""
    students = class_of(args.students)
    hub = Hub(students)
    kernels: list[HubKernel] = []
    try:
        hub.start()
        firsts = []
        for student in students:
            _, kernel, seconds = hub.log_in_and_run_a_cell(student)
            kernels.append(kernel)
            firsts.append(seconds)
            print(f"{student.name}: login to the first cell's result through the hub {seconds:.2f} s")
        time.sleep(args.settle)  # a measurement of idle kernels: let them be idle for a moment
        assert hub.process is not None
        shared = {"hub": [hub.process.pid],
                  "proxy": [p for p in descendants(hub.process.pid) if "configurable-http-proxy" in command_line(p)]}
        print(f"\n  {'shared by the class (MiB)':<30}{'RSS /   PSS':>17}")
        shared_rss = shared_pss = 0.0
        for part, pids in shared.items():
            rss, pss = summed(pids)
            shared_rss, shared_pss = shared_rss + rss, shared_pss + pss
            print(f"  {part:<30}{cell(rss, pss)}")
        per_student: list[tuple[float, float]] = []
        by_part: dict[str, list[tuple[float, float]]] = {part: [] for part in (*PARTS, "other")}
        print(f"\n  {'per student (MiB), RSS / PSS':<30}" + "".join(f"{part:>17}" for part in (*PARTS, "total")))
        for student, kernel in zip(students, kernels, strict=True):
            parts = student_parts(hub, student.name, kernel)
            for part in (*PARTS, "other"):
                by_part[part].append(summed(parts[part]))
            total = (sum(by_part[part][-1][0] for part in by_part), sum(by_part[part][-1][1] for part in by_part))
            per_student.append(total)
            counts = ", ".join(f"{part} {len(parts[part])}" for part in (*PARTS, "other") if parts[part])
            print(f"  {student.name:<30}" + "".join(cell(*by_part[part][-1]) for part in PARTS) + cell(*total)
                  + f"   ({counts} processes)")
        mean_rss = statistics.mean(r for r, _ in per_student)
        mean_pss = statistics.mean(p for _, p in per_student)
        print(f"  {'mean':<30}" + "".join(cell(statistics.mean(r for r, _ in by_part[part]),
                                               statistics.mean(p for _, p in by_part[part])) for part in PARTS)
              + cell(mean_rss, mean_pss))
        size = args.class_size
        print(f"\nlogin to first result: median {statistics.median(firsts):.2f} s, max {max(firsts):.2f} s "
              f"({len(firsts)} students, one after another)")
        print(f"a class of {size}: hub + proxy + {size} x one student = {shared_rss + size * mean_rss:.0f} MiB RSS "
              f"({(shared_rss + size * mean_rss) / 1024:.1f} GiB), {shared_pss + size * mean_pss:.0f} MiB PSS "
              f"(PSS per student falls as more processes share the same libraries: RSS is the upper bound)")
    finally:
        for kernel in kernels:
            try:
                kernel.close(shutdown=False)
            except Exception as exc:  # noqa: BLE001 - the hub's stop ends the kernel anyway
                print(f"kernel {kernel.id}: {exc}", file=sys.stderr)
        left = hub.stop()
        if left:
            print(f"still running after the hub stopped (killed): {left}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
