"""owsandbox kernels in Docker containers through Enterprise Gateway's DockerProcessProxy: how long they take.

The setup of tests/test_enterprise_gateway_docker.py (`docker_gateway` in tests/enterprise_gateway.py):
the tests' dockerd in a network namespace of its own with a bridge, the gateway in that namespace,
the image with owsandbox and bubblewrap. `--rounds` times: `POST /api/kernels` to the first cell's
result (a new container, bubblewrap started in it by that cell), a restart to the first result after
it (the gateway removes the container and starts a new one), and `DELETE` to its answer and to the
container gone. Medians, and the range.

Run as root: `python benchmarks/eg_docker.py [--rounds 3]` from the repository root.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.containers import Docker  # noqa: E402
from tests.enterprise_gateway import USER, EnterpriseGateway, docker_gateway  # noqa: E402
from tests.waiting import wait_until  # noqa: E402


def first_result(gateway: EnterpriseGateway, kernel_id: str) -> None:
    ws = gateway.websocket(kernel_id)
    try:
        cell = ws.run("echo $((6 * 7))", 60)
        assert cell.status == "ok" and cell.text() == "42\n", cell.outputs
    finally:
        ws.close()


def one_round(gateway: EnterpriseGateway, containers: Callable[[str], list[str]]) -> tuple[float, float, float, float]:
    started = time.monotonic()
    kernel_id = gateway.start_kernel(USER)
    first_result(gateway, kernel_id)
    start = time.monotonic() - started
    started = time.monotonic()
    status, _ = gateway.request("POST", f"/api/kernels/{kernel_id}/restart")
    assert status == 200
    first_result(gateway, kernel_id)
    restart = time.monotonic() - started
    started = time.monotonic()
    status, _ = gateway.request("DELETE", f"/api/kernels/{kernel_id}")
    assert status == 204
    answered = time.monotonic() - started
    wait_until(lambda: not containers(kernel_id), 30, "the kernel's container removed")
    return start, restart, answered, time.monotonic() - started


def measure(setup: Callable[[Path], AbstractContextManager[tuple[EnterpriseGateway, Docker, str]]], prefix: str,
            description: str) -> None:
    """`--rounds` rounds of `one_round` on the gateway that `setup` makes in a temporary folder, and their
    medians printed: the measuring of this script and of benchmarks/eg_swarm.py, whose gateways differ."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix=prefix) as temp, setup(Path(temp)) as (gateway, docker, _):
        def containers(kernel_id: str) -> list[str]:
            return docker.run("ps", "--all", "--quiet", "--filter", f"label=kernel_id={kernel_id}").stdout.split()

        rounds = [one_round(gateway, containers) for _ in range(args.rounds)]
    for i, what in enumerate(("POST /api/kernels → first result", "restart → first result", "DELETE → answer",
                              "DELETE → container gone")):
        values = [r[i] for r in rounds]
        print(f"{what}: median {statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f} s, "
              f"{len(values)} rounds)")


def main() -> None:
    measure(docker_gateway, "owsbx-egdocker-bench-", __doc__.split("\n")[0])


if __name__ == "__main__":
    main()
