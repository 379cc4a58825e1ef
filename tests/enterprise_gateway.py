"""Jupyter Enterprise Gateway for the tests and the benchmark: its own virtual environment and a server.

The gateway pins jupyter-client < 7 and jupyter-server < 2, which owsandbox's own environment cannot
hold, so it lives in a virtual environment of its own (`.venv-eg` beside the project, pinned in
tests/requirements/enterprise-gateway.txt and made before the tests by tests/prepare.py: .ci/run, or
the test session when it is missing; never inside a test's timeout). It runs in the network
namespace `gw` of tests/gateway_hosts.py, on that namespace's loopback, with HOME a folder holding
the ssh key and the hosts' keys (paramiko reads `~/.ssh`), and finds the kernelspec that `owsandbox
install --enterprise-gateway ssh` wrote through JUPYTER_PATH. For the Docker kernels
(tests/test_enterprise_gateway_docker.py) it runs in the network namespace of the tests' dockerd
instead, with its response address on that dockerd's bridge. For the Swarm kernels
(tests/test_enterprise_gateway_swarm.py) it runs in a container on that dockerd, on the swarm's
overlay network, as a Swarm deployment runs it (`swarm_gateway`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .containers import PROJECT, Docker, Podman, docker_tools
from .gateway_hosts import GATEWAY_ADDRESSES, GatewayNetwork
from .kernel_ws import KernelWebSocket
from .namespace_server import NamespaceServer
from .prepare import ENVIRONMENTS, what
from .waiting import WaitTimeout, wait_until

EG = ENVIRONMENTS["enterprise-gateway"]
PORT = 8888  # on the gateway namespace's own loopback
USER = {"KERNEL_USERNAME": "student"}  # a kernel's user: the gateway refuses root (its unauthorized_users)
KERNEL_NAME = "owsandbox-eg"
DOCKER_KERNEL_NAME = "owsandbox-eg-docker"
DOCKER_LOCAL_KERNEL_NAME = "owsandbox-eg-docker-local"  # --provider local: the container is the sandbox
BRIDGE = "203.0.113.1/24"  # TEST-NET-3: the bridge's address in the namespace of the Docker kernels' dockerd
SWARM_KERNEL_NAME = "owsandbox-eg-swarm"
SWARM_NETWORK = "owsandbox-kernels"  # the swarm's overlay network, made and removed with it
SWARM_SUBNET = "192.0.2.0/24"  # TEST-NET-1: the overlay's addresses (in the dockerd's own namespaces)
SWARM_GATEWAY_IP = "192.0.2.250"  # the gateway container's address on the overlay: its response address
SWARM_GATEWAY_CONTAINER = "owsandbox-eg"


def gateway_venv() -> Path:
    """The gateway's program in its virtual environment, which tests/prepare.py made before the tests."""
    if not EG.made():
        pytest.fail(f"Enterprise Gateway is not installed ({what(EG.name)}): run `{EG.command}`", pytrace=False)
    return EG.program


def install_spec(prefix: Path, hosts: list[str], extra: list[str] | None = None) -> Path:
    """The kernelspec, as docs/how-to/gateways.md says: `owsandbox install --enterprise-gateway ssh --hosts ...`
    (and `extra` options)."""
    owsandbox = Path(sys.executable).parent / "owsandbox"
    done = subprocess.run([str(owsandbox), "install", "--enterprise-gateway", "ssh", "--hosts", ",".join(hosts),
                           "--prefix", str(prefix), "--name", KERNEL_NAME, "--provider", "bwrap", *(extra or [])],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return prefix / "share" / "jupyter" / "kernels" / KERNEL_NAME


class EnterpriseGateway(NamespaceServer):
    """One `jupyter enterprisegateway` in the gateway namespace, spoken to over REST and WebSockets."""

    what = "the gateway"
    ready_words = b"is available at"
    request_seconds = 120

    def __init__(self, network: GatewayNetwork, spec_prefix: Path, log_path: Path,
                 response_ip: str = GATEWAY_ADDRESSES[0], extra_env: dict[str, str] | None = None,
                 kernel_name: str = KERNEL_NAME,
                 command: Callable[[dict[str, str]], list[str]] | None = None) -> None:
        """`command`, when given, makes the gateway's command line from its environment (the gateway in a
        container: tests/enterprise_gateway.py's `swarm_gateway`); by default the gateway runs in the
        network namespace of `network`, on its loopback."""
        super().__init__(network, log_path, PORT, kernel_name, USER["KERNEL_USERNAME"])
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "EG_", "KERNEL_"))}
        env.update(HOME=str(network.home), JUPYTER_PATH=str(spec_prefix / "share" / "jupyter"),
                   JUPYTER_RUNTIME_DIR=str(network.folder / "gateway-runtime"),
                   EG_RESPONSE_IP=response_ip, EG_KERNEL_LOG_DIR=str(network.folder),
                   EG_AUTH_TOKEN=self.token)  # as docs/how-to/gateways.md starts it
        env.update(extra_env or {})
        argv = (command(env) if command is not None else
                network.in_gateway([str(gateway_venv()), "--ip=127.0.0.1", f"--port={PORT}", "--debug"]))
        self._start(argv, env)

    def start_kernel(self, env: dict[str, str] | None = None) -> str:
        status, body = self.request("POST", "/api/kernels", {"name": self.kernel_name, "env": env or {}})
        assert status == 201, (status, body)
        return body["id"]


@contextmanager
def docker_gateway(folder: Path) -> Iterator[tuple[EnterpriseGateway, Docker, str]]:
    """The gateway for Docker kernels: the tests' dockerd with a bridge in a namespace of its own, the
    image with owsandbox (built or found), the docs' `owsandbox install --enterprise-gateway docker`
    (and the same with `--provider local`),
    and the gateway in the dockerd's namespace, its response address on the bridge. Everything ends
    with the context; a kernel container still there then fails it."""
    podman = Podman(folder)
    with Docker.started(podman, bridge=BRIDGE) as docker:
        image = docker.owsandbox_image()
        prefix = folder / "spec"
        client = docker_tools()
        assert client is not None and docker.netns is not None
        for name, provider in ((DOCKER_KERNEL_NAME, []), (DOCKER_LOCAL_KERNEL_NAME, ["--provider", "local"])):
            done = subprocess.run([str(Path(sys.executable).parent / "owsandbox"), "install", "--enterprise-gateway",
                                   "docker", "--image", image, "--docker", client[1], "--prefix", str(prefix),
                                   "--name", name, *provider], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
        (folder / "home").mkdir(exist_ok=True)
        network = GatewayNetwork(gateway=docker.netns, hosts=[], folder=folder, home=folder / "home")
        gateway = EnterpriseGateway(network, prefix, folder / "gateway.log", response_ip=BRIDGE.split("/")[0],
                                    extra_env={**docker.settings, "EG_DOCKER_NETWORK": "bridge",
                                               "EG_MIRROR_WORKING_DIRS": "true", "EG_INHERITED_ENVS": "DOCKER_HOST"},
                                    kernel_name=DOCKER_KERNEL_NAME)
        try:
            yield gateway, docker, image
        finally:
            gateway.stop()
            left = docker.run("ps", "--all", "--quiet", "--filter", "label=app=enterprise-gateway").stdout.split()
            assert not left, f"kernel containers left after the gateway ended: {left}"


def _same_paths(paths: list[Path]) -> list[str]:
    """`--volume` options that mount `paths` read-only at the same place (the outermost of nested ones)."""
    kept: list[Path] = []
    for path in sorted({p.resolve() for p in paths}, key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(outer) for outer in kept):
            kept.append(path)
    return [word for path in kept for word in ("--volume", f"{path}:{path}:ro")]


def _python_home(venv: Path) -> Path:
    """The installation a virtual environment's Python comes from (its pyvenv.cfg's `home`, less `bin`)."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "home":
            return Path(value.strip()).parent
    raise RuntimeError(f"{venv}/pyvenv.cfg names no home")


@contextmanager
def swarm_gateway(folder: Path) -> Iterator[tuple[EnterpriseGateway, Docker, str]]:
    """The gateway for Swarm kernels, as a Swarm deployment has it: the tests' dockerd in a namespace of its
    own, made a one-node swarm (`docker swarm init` on its bridge's address; left again at the end), an
    attachable, internal overlay network for the kernels (`SWARM_NETWORK`), the docs' `owsandbox install
    --enterprise-gateway swarm`, and the gateway in a container on that network (its response address
    `SWARM_GATEWAY_IP`) with the docker socket, its port published on the namespace's loopback by
    docker-proxy. The container is the owsandbox image with this machine's Python installations, the
    gateway's virtual environment, this checkout and the docker client mounted read-only at their own
    paths, so that the spec's argv (`owsandbox gateway-swarm`, written here) runs in it as written.
    The host's firewall and network stay as they are (no rule is added: every address is in the
    dockerd's namespaces). Everything ends with the context; a kernel service or container still
    there then fails it."""
    podman = Podman(folder)
    with Docker.started(podman, bridge=BRIDGE, publish=True) as docker:
        image = docker.owsandbox_image()
        tools = docker_tools()
        assert tools is not None and docker.netns is not None
        client = tools[1]
        prefix = folder / "spec"
        done = subprocess.run([str(Path(sys.executable).parent / "owsandbox"), "install", "--enterprise-gateway",
                               "swarm", "--image", image, "--docker", client, "--prefix", str(prefix),
                               "--name", SWARM_KERNEL_NAME], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        address = BRIDGE.split("/")[0]
        docker.run("swarm", "init", "--advertise-addr", address, "--listen-addr", f"{address}:2377")
        try:
            docker.run("network", "create", "--driver", "overlay", "--attachable", "--internal", "--subnet",
                       SWARM_SUBNET, SWARM_NETWORK)
            (folder / "home").mkdir(exist_ok=True)
            network = GatewayNetwork(gateway=docker.netns, hosts=[], folder=folder, home=folder / "home")
            homes = {_python_home(Path(sys.prefix)), _python_home(EG.folder)} - {Path("/usr")}  # the image's own
            mounts = _same_paths([PROJECT, Path(sys.prefix), EG.folder, *homes, Path(client)])

            def in_container(env: dict[str, str]) -> list[str]:
                passed = {name: value for name, value in env.items()
                          if name.startswith(("EG_", "JUPYTER_")) or name in ("HOME", "DOCKER_HOST")}
                saved, docker.env = docker.env, {**docker.env, **passed}  # `--env NAME` reads them from here
                try:
                    docker.run("create", "--name", SWARM_GATEWAY_CONTAINER, "--user", "0:0", "--network", "bridge",
                               "--publish", f"127.0.0.1:{PORT}:{PORT}", *mounts, "--volume", f"{folder}:{folder}",
                               "--volume", f"{docker.socket}:{docker.socket}", "--workdir", str(folder),
                               *[word for name in passed for word in ("--env", name)],
                               image, str(gateway_venv()), "--ip=0.0.0.0", f"--port={PORT}", "--debug")
                finally:
                    docker.env = saved
                docker.run("network", "connect", "--ip", SWARM_GATEWAY_IP, SWARM_NETWORK, SWARM_GATEWAY_CONTAINER)
                return [docker.path, "start", "--attach", SWARM_GATEWAY_CONTAINER]

            gateway = EnterpriseGateway(network, prefix, folder / "gateway.log", response_ip=SWARM_GATEWAY_IP,
                                        extra_env={**docker.settings, "EG_DOCKER_NETWORK": SWARM_NETWORK,
                                                   "EG_INHERITED_ENVS": "DOCKER_HOST",
                                                   "EG_MIRROR_WORKING_DIRS": "true"},
                                        kernel_name=SWARM_KERNEL_NAME, command=in_container)
            try:
                yield gateway, docker, image
            finally:
                gateway.stop()
                docker.run("rm", "--force", SWARM_GATEWAY_CONTAINER, check=False)
                services = docker.run("service", "ls", "--quiet", "--filter", "label=app=enterprise-gateway").stdout
                for service in services.split():
                    docker.run("service", "rm", service, check=False)
                assert not services.split(), f"kernel services left after the gateway: {services.split()}"

                def kernel_containers() -> list[str]:  # a removed service's task container goes a moment later
                    found = docker.run("ps", "--all", "--quiet", "--filter", "label=app=enterprise-gateway")
                    return found.stdout.split()

                try:
                    wait_until(lambda: not kernel_containers(), 30, "the kernels' containers to be removed")
                except WaitTimeout:
                    raise AssertionError(f"kernel containers left after the gateway: {kernel_containers()}") from None
        finally:
            docker.run("swarm", "leave", "--force", check=False)


def stop_keeps_state(gateway: EnterpriseGateway, ws: KernelWebSocket, kernel_id: str) -> None:
    """The gateway's interrupt (Stop) ends the running command; the shell and its variables stay."""
    assert ws.run("TAUGHT=fractions", 30).status == "ok"
    running = ws.send("echo started; sleep 120; echo never")
    ws.wait_for_stdout(running, "started")
    status, _ = gateway.request("POST", f"/api/kernels/{kernel_id}/interrupt")
    assert status == 204
    stopped = ws.collect(running, 30)
    assert stopped.status in ("error", "aborted") and "never" not in stopped.text(), stopped.outputs
    kept = ws.run("echo $TAUGHT", 30)
    assert kept.text().strip() == "fractions", kept.outputs

