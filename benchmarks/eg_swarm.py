"""owsandbox kernels as Docker Swarm services through Enterprise Gateway's DockerSwarmProcessProxy: how long they take.

The setup of tests/test_enterprise_gateway_swarm.py (`swarm_gateway` in tests/enterprise_gateway.py):
the tests' dockerd in a network namespace of its own made a one-node swarm with an internal overlay
network, the gateway in a container on it, the image with owsandbox (the container is the kernel's
sandbox). `--rounds` times: `POST /api/kernels` to the first cell's result (a new service: its task
scheduled, its container started, the kernel answering the gateway), a restart to the first result
after it (the gateway removes the service and creates another), and `DELETE` to its answer and to the
task's container gone. Medians, and the range. benchmarks/eg_docker.py measures the same for
DockerProcessProxy's plain containers.

Run as root: `python benchmarks/eg_swarm.py [--rounds 3]` from the repository root.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.eg_docker import measure  # noqa: E402
from tests.enterprise_gateway import swarm_gateway  # noqa: E402


def main() -> None:
    measure(swarm_gateway, "owsbx-egswarm-bench-", __doc__.split("\n")[0])


if __name__ == "__main__":
    main()
