"""A class on two hosts through Jupyter Enterprise Gateway: 30 kernels, a short lesson's cells at once.

The setup of tests/test_enterprise_gateway.py (tests/gateway_hosts.py, tests/enterprise_gateway.py):
the gateway in a network namespace of its own on its loopback, two hosts in namespaces with their own
sshd (TEST-NET-2 addresses inside the namespaces only), kernels on bubblewrap started by the gateway's
DistributedProcessProxy (round-robin) through `owsandbox gateway-kernel`.

1. Per host (the kernel pinned there with KERNEL_REMOTE_HOST), `--rounds` times: `POST /api/kernels`
   to the first cell's result (the WebSocket opened meanwhile), a restart to the first result after it,
   and `DELETE` to its answer and to the last process of the kernel and its sandbox gone.
2. The class: `--kernels` kernels started at once (the gateway spreads them), then every kernel runs
   the lesson's cells, all kernels at the same time, each cell's output checked (nothing lost); cell
   latency p50/p95 (request to reply), memory (PSS) per host with every kernel alive, then every kernel
   deleted and every process of every kernel and sandbox awaited gone. Bounded: `--deadline` seconds
   for the class, or it fails saying where it was.

The kernelspec is written as the README says (`owsandbox install --enterprise-gateway ssh`), so it asks
the gateway for its own launch timeout (KERNEL_LAUNCH_TIMEOUT, 180 s unless `--launch-timeout` says);
`--launch-timeout 30` is the gateway's default, as before the spec asked. `--hog N` runs N processes
that only spin on the CPU for the whole run (a machine as busy as a shared one gets); the load average
is printed at the start and the end.

Run as root: `python benchmarks/class_load.py [--kernels 30] [--rounds 3] [--hog 4] [--launch-timeout S]`
from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.enterprise_gateway import EnterpriseGateway, install_spec  # noqa: E402
from tests.gateway_hosts import GatewayNetwork, gateway_network  # noqa: E402
from tests.hub import memory_kib  # noqa: E402
from tests.namespace_server import kernel_process  # noqa: E402
from tests.processes import PinnedProcesses, descendants, wait_gone  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

USER = {"KERNEL_USERNAME": "student"}
LESSON = [  # (cell, what it must print)
    ("x=7; echo $((x * x))", "49\n"),
    ("seq 1 100 | awk '{s += $1} END {print s}'", "5050\n"),
    ("printf 'fraction %d/%d\\n' 3 4 > notes.txt; cat notes.txt", "fraction 3/4\n"),
    ("for i in 1 2 3; do echo step $i; done | wc -l", "3\n"),
    ("grep -c fraction notes.txt; echo $x", "1\n7\n"),
]


def workspace(network: GatewayNetwork, name: str) -> dict[str, str]:
    folder = network.folder / "work" / name
    folder.mkdir(parents=True)
    return {**USER, "KERNEL_WORKING_DIR": str(folder)}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def per_host(gateway: EnterpriseGateway, network: GatewayNetwork, rounds: int) -> None:
    for host in network.hosts:
        first, restart, delete, gone = [], [], [], []
        for n in range(rounds):
            pinned = PinnedProcesses()
            started = time.perf_counter()
            kernel_id = gateway.start_kernel({**workspace(network, f"{host.name}-{n}"),
                                              "KERNEL_REMOTE_HOST": host.address})
            ws = gateway.websocket(kernel_id)
            assert ws.run("echo ready", 60).text() == "ready\n"
            first.append(time.perf_counter() - started)
            ws.run("echo kept > /tmp/mark", 60)
            _, pid = wait_until(lambda kid=kernel_id: kernel_process(network, kid), 30, "the kernel's process")
            pinned.add_tree(pid)
            ws.close()
            started = time.perf_counter()
            status, _ = gateway.request("POST", f"/api/kernels/{kernel_id}/restart")
            assert status == 200
            ws = gateway.websocket(kernel_id)
            assert ws.run("cat /tmp/mark", 60).text() == "kept\n", "the restart lost the box"
            restart.append(time.perf_counter() - started)
            ws.close()
            _, new_pid = wait_until(lambda kid=kernel_id: kernel_process(network, kid), 30, "the kernel's process")
            pinned.add_tree(new_pid)
            started = time.perf_counter()
            status, _ = gateway.request("DELETE", f"/api/kernels/{kernel_id}")
            assert status == 204
            delete.append(time.perf_counter() - started)
            left = wait_gone(list(pinned.seen), 30)
            assert not left, f"left after DELETE: {[pinned.seen[p] for p in left]}"
            gone.append(time.perf_counter() - started)
            pinned.close()
        print(f"{host.address}: POST -> first result median {statistics.median(first):.2f} s "
              f"(max {max(first):.2f}); restart -> first result {statistics.median(restart):.2f} s; "
              f"DELETE answered {statistics.median(delete):.2f} s, every process gone {statistics.median(gone):.2f} s "
              f"({rounds} rounds)")


def run_lesson(gateway: EnterpriseGateway, kernel_id: str, barrier: threading.Barrier) -> list[float]:
    ws = gateway.websocket(kernel_id)
    try:
        barrier.wait(120)  # every kernel's cells start together
        latencies = []
        for code, expected in LESSON:
            cell = ws.run(code, 120)
            assert cell.status == "ok" and cell.text() == expected, (kernel_id, code, cell.outputs)
            latencies.append(cell.seconds)
        return latencies
    finally:
        ws.close()


def the_class(gateway: EnterpriseGateway, network: GatewayNetwork, kernels: int, deadline: float) -> None:
    began = time.perf_counter()
    with ThreadPoolExecutor(kernels) as pool:
        ids = list(pool.map(lambda n: gateway.start_kernel(workspace(network, f"student-{n}")), range(kernels)))
    started = time.perf_counter() - began
    print(f"class: all {kernels} kernels up (POST answered 201) in {started:.1f} s", flush=True)
    pinned = PinnedProcesses()
    placed: dict[str, list[int]] = {host.address: [] for host in network.hosts}
    for kernel_id in ids:
        host, pid = wait_until(lambda kid=kernel_id: kernel_process(network, kid), 30, "a kernel's process")
        placed[host.address].append(pid)
    barrier = threading.Barrier(kernels)
    with ThreadPoolExecutor(kernels) as pool:
        results = list(pool.map(lambda kid: run_lesson(gateway, kid, barrier), ids))
    latencies = [s for per_kernel in results for s in per_kernel]
    assert time.perf_counter() - began < deadline, f"the class took over {deadline} s"
    memory = {}
    for address, pids in placed.items():
        tree = {p for pid in pids for p in [pid, *descendants(pid)]}
        for pid in pids:
            pinned.add_tree(pid)
        memory[address] = (len(pids), sum(memory_kib(p)[1] for p in tree) / 1024)
    began_delete = time.perf_counter()
    with ThreadPoolExecutor(10) as pool:
        statuses = list(pool.map(lambda kid: gateway.request("DELETE", f"/api/kernels/{kid}")[0], ids))
    assert statuses == [204] * kernels, statuses
    left = wait_gone(list(pinned.seen), 60)
    ended = time.perf_counter() - began_delete
    print(f"class: {kernels} kernels started in {started:.1f} s; {len(latencies)} cells of {len(LESSON)} per "
          f"kernel, every output as expected; cell latency p50 {pct(latencies, 0.5) * 1000:.0f} ms, "
          f"p95 {pct(latencies, 0.95) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms")
    for address, (count, mib) in memory.items():
        print(f"  {address}: {count} kernels, {mib:.0f} MiB PSS (kernel + sandbox), {mib / max(count, 1):.1f} MiB each")
    print(f"  DELETE of all {kernels}: every kernel and sandbox process gone in {ended:.1f} s; left: {len(left)}")
    assert not left, f"left after DELETE: {[pinned.seen[p] for p in left]}"


@contextmanager
def cpu_hog(processes: int) -> Iterator[None]:
    """`processes` busy loops for the duration, ended (and awaited) however the run ends."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def load() -> str:
    return "load average " + " ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=300.0)
    parser.add_argument("--hog", type=int, default=0, metavar="N", help="N busy loops during the run")
    parser.add_argument("--launch-timeout", type=int, default=None, metavar="S",
                        help="the spec's --launch-timeout (default: the spec's own, 180)")
    args = parser.parse_args()
    if not 1 <= args.kernels <= 60:
        parser.error("--kernels: 1 to 60 (two hosts of a 2-core machine)")
    extra = [] if args.launch_timeout is None else ["--launch-timeout", str(args.launch_timeout)]
    with cpu_hog(args.hog), gateway_network() as network:
        prefix = network.folder / "spec"
        spec = install_spec(prefix, [host.address for host in network.hosts], extra)
        timeout = json.loads((spec / "kernel.json").read_text())["env"]["KERNEL_LAUNCH_TIMEOUT"]
        print(f"{os.cpu_count()} cores, {args.hog} busy loops, {load()}; the spec asks for a {timeout} s launch "
              "timeout", flush=True)
        gateway = EnterpriseGateway(network, prefix, network.folder / "gateway.log")
        try:
            per_host(gateway, network, args.rounds)
            the_class(gateway, network, args.kernels, args.deadline)
        except BaseException:
            print(gateway.log()[-4000:], file=sys.stderr)
            raise
        finally:
            gateway.stop()
            print(f"at the end: {load()}")


if __name__ == "__main__":
    main()
