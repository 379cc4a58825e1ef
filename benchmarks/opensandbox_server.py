"""The `opensandbox` provider on OpenSandbox's real server (`opensandbox-server`, Docker runtime, host
or bridge network mode), measured: create → first result, a cell's round trip, delete, directly and through the
server's own proxy; and a kernel's start to its first cell's result.

It sets up what tests/test_opensandbox_server.py uses (tests/opensandbox_server.py):
a dockerd of its own (no bridge, no firewall rules), the Debian test image loaded from podman's store
(built by the container tests), the execd image made from the box's execd-compatible endpoint (the
real Go execd cannot be installed here), and the server from `.venv-opensandbox-server` or
$OWSANDBOX_TEST_OPENSANDBOX_SERVER. Everything it starts is stopped at the end. As root.

* provider: `create()` + connect + `true` (first result; `create_seconds` is the server's part, from
  asking to a Running sandbox with its endpoint), the median and p90 round trip of `true` through the
  executor, and the DELETE in `destroy()`;
* kernel: `KernelManager.start_kernel()` until the first cell (`true`) has finished, and the median
  `true` cell request → reply.

`--network bridge`: the server's default mode, on a dockerd with a bridge in a network namespace of
its own that publishes ports through docker-proxy (tests/containers.py; no iptables rule), the server
in that namespace; this program moves into it too (setns) once that dockerd runs, so that the provider
and the kernel reach the endpoints the server gives (`127.0.0.1:PUBLISHED/proxy/44772`, execd
proxying to itself), and moves back before it stops that dockerd.

Run: `python benchmarks/opensandbox_server.py [--rounds 5] [--runs 200] [--network host|bridge]`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import Kernel, Session  # noqa: E402

from owsandbox.host.providers.opensandbox_lifecycle import OpenSandboxLifecycleProvider  # noqa: E402
from owsandbox.host.workspace import RunnerWorkspace  # noqa: E402
from tests.containers import Docker, Podman  # noqa: E402
from tests.gateway_hosts import in_namespace  # noqa: E402
from tests.opensandbox_server import OpenSandboxServer, build_execd_image, server_program  # noqa: E402

SPEC = "owsandbox-opensandbox-bench"
BRIDGE = "203.0.113.1/24"  # TEST-NET-3, on the bridge in the dockerd's namespace only


@contextlib.contextmanager
def inside(netns: str | None) -> Iterator[None]:
    """This thread (the main one, so every thread and child started from it) in `netns`, then back."""
    if netns is None:
        yield
        return
    with in_namespace(netns):
        yield


def _spread(values: list[float], unit: float = 1.0, digits: int = 3) -> str:
    ordered = sorted(values)
    median, p90 = statistics.median(ordered) * unit, ordered[int(len(ordered) * 0.9)] * unit
    return f"median {median:.{digits}f}, p90 {p90:.{digits}f} (of {len(ordered)})"


def provider_rounds(server: OpenSandboxServer, image: str, args: argparse.Namespace, proxy: bool) -> None:
    firsts, creates, deletes, trips = [], [], [], []
    for _ in range(args.rounds):
        provider = OpenSandboxLifecycleProvider(cwd="/", server=server.url, api_key=server.api_key, image=image,
                                                server_proxy=proxy)
        started = time.perf_counter()
        workspace = RunnerWorkspace(provider, "/")
        try:
            assert workspace.executor.run("true")["exit_code"] == 0
            firsts.append(time.perf_counter() - started)
            creates.append(provider.create_seconds or 0.0)
            for _ in range(args.runs):
                sent = time.perf_counter()
                workspace.executor.run("true")
                trips.append(time.perf_counter() - sent)
        finally:
            workspace.close()
        deletes.append(provider.delete_seconds or 0.0)
        assert server.containers() == [], "a sandbox was left"
    how = "through the server's proxy" if proxy else "direct to execd"
    print(f"provider ({how}): create → first result {_spread(firsts)} s; the server's part (to Running, endpoint) "
          f"{_spread(creates)} s")
    print(f"provider ({how}): `true` round trip {_spread(trips, 1000, 2)} ms; DELETE at destroy {_spread(deletes)} s")


def kernel_rounds(server: OpenSandboxServer, image: str, args: argparse.Namespace, root: Path) -> None:
    prefix = root / "prefix"
    from owsandbox.cli import main as owsandbox_main

    owsandbox_main(["install", "--prefix", str(prefix), "--name", SPEC, "--provider", "opensandbox",
                    "--env", f"OWSANDBOX_OPENSANDBOX_SERVER={server.url}",
                    "--env", f"OWSANDBOX_OPENSANDBOX_API_KEY={server.api_key}", "--env", f"OWSANDBOX_IMAGE={image}"])
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    kernel = Kernel("owsandbox", "owsandbox (opensandbox)", SPEC)
    folder = Path(tempfile.mkdtemp(prefix="ws-", dir=root))
    env = {k: v for k, v in os.environ.items() if k not in ("OWSANDBOX_PROVIDER", "PYTHONUNBUFFERED")}
    firsts, trips = [], []
    for _ in range(args.rounds):
        session = Session(kernel, folder, env)
        try:
            session.wait_for_kernel_info(120)
            session.run("true", timeout=120)
            firsts.append(time.perf_counter() - session.started)
            for _ in range(20):
                cell = session.run("true")
                assert cell.reply_at is not None
                trips.append(cell.reply_at - cell.sent)
        finally:
            session.close()
        deadline = time.monotonic() + 30
        while server.containers() and time.monotonic() < deadline:
            time.sleep(0.05)
    print(f"kernel: start_kernel() → first cell done {_spread(firsts)} s; `true` request → reply "
          f"{_spread(trips, 1000, 2)} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--network", choices=("host", "bridge"), default="host",
                        help="the server's [docker] network_mode (bridge: see above)")
    args = parser.parse_args()
    program = server_program()
    if program is None:
        sys.exit("opensandbox-server is not installed: python3 tests/prepare.py opensandbox-server")
    with tempfile.TemporaryDirectory(prefix="owsbx-osb-bench-") as tmp:
        root = Path(tmp)
        (root / "podman").mkdir()
        bridged = args.network == "bridge"
        with Docker.started(Podman(root / "podman"), bridge=BRIDGE if bridged else None, publish=bridged) as docker, \
                inside(docker.netns):
            image = docker.image()
            built = time.perf_counter()
            execd_image = build_execd_image(docker)
            built = time.perf_counter() - built
            print(f"dockerd started in {docker.start_seconds:.2f} s; test image loaded in "
                  f"{sum(docker.load_seconds.values()):.2f} s; execd image built in {built:.2f} s")
            with OpenSandboxServer.started(program, docker, execd_image, args.network) as server:
                print(f"opensandbox-server ({program}, {args.network} network mode) answering in "
                      f"{server.start_seconds:.2f} s")
                provider_rounds(server, image, args, proxy=False)
                provider_rounds(server, image, args, proxy=True)
                kernel_rounds(server, image, args, root)


if __name__ == "__main__":
    main()
