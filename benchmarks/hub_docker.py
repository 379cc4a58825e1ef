"""A class on JupyterHub with DockerSpawner: login to the first cell's result, each server a container.

Starts what tests/test_jupyterhub_docker.py starts: a dockerd of its own (tests/containers.py: no bridge,
no firewall rule), the single-user image (share/containers/singleuser.Containerfile, built or found,
then loaded into that dockerd), and the hub of tests/hub.py (DockerHub: configurable-http-proxy, a
password per student, DockerSpawner, cells in bubblewrap nested in each container). N students log in
through the hub's URL (all at once, or one after another with `--one-by-one`), open the owsandbox kernel
and run a first cell; the time from each login to that cell's result is the figure, with the hub's own
count of each server's start (its log's "took N seconds to start"). Then each container's memory, as
its cgroup counts it (`docker stats`), with its one idle kernel and box.

Run as root from the repository root: `.venv-test/bin/python benchmarks/hub_docker.py [--students N]
[--one-by-one]`. Needs Docker, podman, debootstrap, bubblewrap, configurable-http-proxy and the test
extra (jupyterhub, dockerspawner).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.containers import Docker, Podman  # noqa: E402
from tests.hub import DockerHub, HubKernel, class_of  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=2)
    parser.add_argument("--one-by-one", action="store_true", help="log the students in one after another")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="owsbx-bench-") as folder, Docker.started(Podman(Path(folder))) as docker:
        started = time.monotonic()
        image = docker.singleuser_image()
        print(f"image {image}: ready in dockerd {time.monotonic() - started:.1f} s (built or found, and loaded)")
        students = class_of(args.students, prefix="owsbx-dk-")
        hub = DockerHub(students, docker, image)
        kernels: list[HubKernel] = []
        try:
            hub.start()
            with ThreadPoolExecutor(1 if args.one_by_one else len(students)) as pool:
                done = list(pool.map(hub.log_in_and_run_a_cell, students))
            kernels = [kernel for _, kernel, _ in done]
            seconds = [took for _, _, took in done]
            starts = [float(x) for x in re.findall(r"took (\d+\.\d+) seconds to start", hub.log(tail=1 << 20))]
            mode = "one after another" if args.one_by_one else "all at once"
            print(f"{len(students)} students, {mode}: login to first result "
                  + ", ".join(f"{s:.1f}" for s in sorted(seconds))
                  + f" s (median {statistics.median(seconds):.1f}); the hub's server starts "
                  + ", ".join(f"{s:.1f}" for s in sorted(starts)) + " s")
            stats = docker.run("stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}} {{.PIDs}}").stdout
            for line in sorted(stats.splitlines()):
                if line.startswith(hub.prefix):
                    name, usage, *_, pids = line.split()
                    print(f"  {name[len(hub.prefix) + 1:]}: memory {usage} (the container's cgroup), {pids} processes")
        finally:
            for kernel in kernels:
                kernel.close(shutdown=False)
            left = hub.stop()
        if left:
            print(f"left after the hub stopped (now ended): {left}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
