"""Remote kernels without a gateway: a plain Jupyter server's start, restart and delete of owsandbox
kernels on two hosts over ssh (`owsandbox install --kernel-provisioner distributed`).

The setup of tests/test_kernel_provisioner.py (tests/gateway_hosts.py, tests/provisioned_server.py): the
`jupyter server` in a network namespace of its own on its loopback, two hosts in namespaces with their
own sshd (TEST-NET-2 addresses inside the namespaces only), kernels on bubblewrap started by
gateway_provisioners' DistributedProvisioner (owsandbox's subclass: round-robin, a restart stays on its
host) through `owsandbox gateway-kernel`. `--rounds` times per host (round-robin alternates them):
`POST /api/kernels` to its answer (the provisioner has the kernel's connection information) and to the
first cell's result (the WebSocket opened meanwhile), a restart to the first
result after it (the box's /tmp kept), and `DELETE` to its answer and to the last process of the kernel
and its sandbox gone. `--encryption` is the server's transport-encryption policy (`required`: every
ZMQ message CurveZMQ, as the test runs it; `disabled`: the server's default).

Run as root: `python benchmarks/provisioner_start.py [--rounds 5] [--encryption required|disabled]` from
the repository root.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.gateway_hosts import GatewayNetwork, gateway_network  # noqa: E402
from tests.namespace_server import kernel_process  # noqa: E402
from tests.processes import PinnedProcesses, wait_gone  # noqa: E402
from tests.provisioned_server import ProvisionedServer, install_spec  # noqa: E402
from tests.waiting import wait_until  # noqa: E402


def one_round(server: ProvisionedServer, network: GatewayNetwork) -> tuple[str, float, float, float, float, float]:
    """(host address, POST -> first result, restart -> first result, DELETE answered, every process gone,
    POST answered)."""
    pinned = PinnedProcesses()
    try:
        started = time.perf_counter()
        kernel_id = server.start_kernel()
        answered_post = time.perf_counter() - started
        ws = server.websocket(kernel_id)
        assert ws.run("echo ready", 60).text() == "ready\n"
        first = time.perf_counter() - started
        ws.run("echo kept > /tmp/mark", 60)
        host, pid = wait_until(lambda: kernel_process(network, kernel_id), 30, "the kernel's process")
        pinned.add_tree(pid)
        ws.close()
        started = time.perf_counter()
        status, _ = server.request("POST", f"/api/kernels/{kernel_id}/restart")
        assert status == 200
        ws = server.websocket(kernel_id)
        assert ws.run("cat /tmp/mark", 60).text() == "kept\n", "the restart lost the box"
        restart = time.perf_counter() - started
        ws.close()
        again, new_pid = wait_until(lambda: (found := kernel_process(network, kernel_id)) and found[1] != pid
                                    and found, 30, "the restarted kernel's process")
        assert again is host, "the restart moved to another host"
        pinned.add_tree(new_pid)
        started = time.perf_counter()
        status, _ = server.request("DELETE", f"/api/kernels/{kernel_id}")
        assert status == 204
        answered = time.perf_counter() - started
        left = wait_gone(list(pinned.seen), 30)
        assert not left, f"left after DELETE: {[pinned.seen[p] for p in left]}"
        return host.address, first, restart, answered, time.perf_counter() - started, answered_post
    finally:
        pinned.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="kernels per host (default 5)")
    parser.add_argument("--encryption", choices=("required", "disabled"), default="required")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: the hosts are network namespaces")
    with gateway_network() as network:
        prefix = network.folder / "spec"
        workspace = network.folder / "work"
        workspace.mkdir()
        install_spec(prefix, [host.address for host in network.hosts], workspace)
        server = ProvisionedServer(network, prefix, network.folder / "server.log",
                                   [f"--KernelManager.transport_encryption={args.encryption}"])
        try:
            rounds = [one_round(server, network) for _ in range(2 * args.rounds)]
        finally:
            server.stop()
    print(f"transport encryption {args.encryption}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    for address in sorted({r[0] for r in rounds}):
        mine = [r for r in rounds if r[0] == address]
        first, restart, answered, gone, post = ([r[i] for r in mine] for i in range(1, 6))
        print(f"{address}: POST -> first result median {statistics.median(first):.2f} s "
              f"(min {min(first):.2f}, max {max(first):.2f}; POST answered {statistics.median(post):.2f} s); "
              f"restart -> first result median "
              f"{statistics.median(restart):.2f} s (max {max(restart):.2f}); DELETE answered "
              f"{statistics.median(answered):.2f} s, every process gone {statistics.median(gone):.2f} s "
              f"({len(mine)} kernels)")


if __name__ == "__main__":
    main()
