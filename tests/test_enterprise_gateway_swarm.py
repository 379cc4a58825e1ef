"""owsandbox kernels as Docker Swarm services through Jupyter Enterprise Gateway's DockerSwarmProcessProxy.

Everything is real but the place: the tests' own dockerd (tests/containers.py), in a network namespace
of its own, is made a one-node swarm for the module and leaves it at the end; its overlay network,
the kernels' tasks and the gateway (in a container on that network, as a Swarm deployment runs it:
tests/enterprise_gateway.py's `swarm_gateway`) all live in the dockerd's namespaces, and the host's
firewall rules are checked unchanged afterwards. The kernelspec is the docs' `owsandbox install
--enterprise-gateway swarm --image IMG`; the image is the tests' one with owsandbox installed, and
each kernel's container is its sandbox (a service's container cannot nest bubblewrap).

The module shares its unit with tests/test_enterprise_gateway_docker.py (tests/scheduling.py), so that
the two gateways' dockerds never run at once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from . import container_gateway_steps as steps
from .container_gateway_steps import Place, container_of, containers, place_of, refused, restart, run_cell
from .containers import IMAGE, MARKER, PROJECT, Docker
from .enterprise_gateway import SWARM_KERNEL_NAME as KERNEL
from .enterprise_gateway import SWARM_SUBNET, USER, stop_keeps_state, swarm_gateway
from .waiting import wait_until

# The swarm and the gateway start inside the first test's timeout (50 s on a quiet pair of slow cores):
# the timeout is a hang guard only.
pytestmark = [pytest.mark.system, pytest.mark.needs("enterprise-gateway"), pytest.mark.needs_owsandbox_image,
              pytest.mark.xdist_group("tests/test_enterprise_gateway_docker.py"), pytest.mark.timeout(900)]

ENGINE = PROJECT / "notebooks" / "engines" / "echo_engine.py"


DOCKERS_WORDS = ("DOCKER", "docker", "203.0.113.", "192.0.2.", "4789", "7946", "2377")  # its chains, bridges, ports


def firewall_rules() -> list[str]:
    """This machine's own iptables rules that Docker or a swarm would add (its chains, its bridges, our
    addresses, the swarm's ports), without counters; empty where there is no iptables-save. Only those:
    other engines running beside the tests (podman's netavark) change other rules meanwhile."""
    program = shutil.which("iptables-save") or shutil.which("iptables-save", path="/usr/sbin:/sbin")
    if program is None:
        return []
    done = subprocess.run([program], capture_output=True, text=True, timeout=30)
    return [line.split(" [")[0] for line in done.stdout.splitlines()
            if not line.startswith("#") and any(word in line for word in DOCKERS_WORDS)]


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    rules = firewall_rules()
    with place_of(swarm_gateway, tmp_path_factory.mktemp("egswarm")) as found:
        yield found
    assert firewall_rules() == rules, "the host's firewall rules for Docker changed"


def services(docker: Docker, kernel_id: str | None = None) -> list[str]:
    """The ids of the kernels' services (one kernel's where given)."""
    label = f"kernel_id={kernel_id}" if kernel_id else "app=enterprise-gateway"
    return docker.run("service", "ls", "--quiet", "--filter", f"label={label}").stdout.split()


def delete(place: Place, kernel_id: str) -> None:
    """DELETE the kernel: its service goes, and with it its task's container."""
    steps.delete(place, kernel_id)
    wait_until(lambda: not services(place.docker, kernel_id), 30, f"kernel {kernel_id}'s service removed")


def test_a_kernel_is_a_service_whose_cells_run_stop_and_attach(place: Place) -> None:
    kernel_id = place.gateway.start_kernel(USER)
    [service] = services(place.docker, kernel_id)
    spec = json.loads(place.docker.run("service", "inspect", service).stdout)[0]["Spec"]
    assert spec["Name"] == f"owsandbox-{kernel_id}" and spec["TaskTemplate"]["RestartPolicy"]["Condition"] == "none"
    container = container_of(place, kernel_id, every=False)
    ws = place.gateway.websocket(kernel_id)
    try:
        cell = ws.run(f"cat {MARKER}; id -u; pwd; hostname -I", 60)
        assert cell.status == "ok", cell.outputs
        words = cell.text().split()
        assert words[:3] == [IMAGE, "1000", "/home/student"], cell.outputs  # the marker's text: the image's
        assert words[3:] == [words[3]] and words[3].startswith(SWARM_SUBNET.rsplit(".", 1)[0] + "."), cell.outputs
        assert "sandbox: local" in cell.plain(), cell.outputs  # the banner names the provider
        log = place.gateway.log()  # the service's output, which gateway-swarm passes on to the gateway's log
        assert "provider local: the service's container is the kernel's sandbox" in log
        assert "no watch for an unreached kernel" in log  # the proxy polls Docker, never the signal port
        top = place.docker.run("top", container, "-eo", "pid,args").stdout
        assert "gateway-kernel" in top, top
        stop_keeps_state(place.gateway, ws, kernel_id)

        # %attach: a JSON-lines program in the kernel's container, spoken to through the gateway
        written = ws.run(f"cat > echo_engine.py <<'OWSBX_END'\n{ENGINE.read_text()}\nOWSBX_END", 30)
        assert written.status == "ok", written.outputs
        attached = ws.run("%attach --name echo -- python3 echo_engine.py", 60)
        assert attached.status == "ok" and "attached to #1 echo" in attached.text(), attached.outputs
        answer = ws.run('%send {"id": "sw-1", "type": "echo", "text": "through the swarm"}', 60)
        assert answer.of_type("display_data")[0]["data"]["application/json"] == {
            "id": "sw-1", "type": "response", "ok": True, "text": "through the swarm"}, answer.outputs
        assert ws.run("%detach", 30).status == "ok"
    finally:
        ws.close()
    delete(place, kernel_id)


def test_a_restart_is_a_new_service_task_and_delete_leaves_nothing(place: Place) -> None:
    """The gateway removes the service on a restart and starts another: a new container, an empty box."""
    kernel_id = place.gateway.start_kernel(USER)
    first = container_of(place, kernel_id, every=False)
    assert run_cell(place, kernel_id, "echo before-restart > /tmp/mark").status == "ok"
    restart(place, kernel_id)
    second = container_of(place, kernel_id, every=False)
    assert second != first
    assert len(services(place.docker, kernel_id)) == 1
    cell = run_cell(place, kernel_id, "cat /tmp/mark 2>&1; id -u")
    assert "No such file" in cell.text() and "1000" in cell.text(), cell.outputs
    delete(place, kernel_id)


def test_a_refused_launch_fails_at_once_and_leaves_no_service(place: Place) -> None:
    refused(place, KERNEL, {"KERNEL_IMAGE": "localhost/other:1"}, "this kernelspec runs only its own image")
    assert not services(place.docker) and not containers(place.docker)


def test_a_kernel_whose_task_fails_is_reported_and_its_service_removed(place: Place) -> None:
    """gateway-kernel refuses `/` as the workspace: the task fails, gateway-swarm says so and removes the service."""
    status, body = place.gateway.request("POST", "/api/kernels",
                                         {"name": KERNEL, "env": {**USER, "KERNEL_WORKING_DIR": "/"}}, timeout=120)
    assert status == 500, (status, body)
    log = place.gateway.log()
    assert "the workspace would be /" in log, log[-3000:]
    wait_until(lambda: not services(place.docker), 30, "no kernel service left")
    wait_until(lambda: not containers(place.docker), 30, "no kernel container left")
