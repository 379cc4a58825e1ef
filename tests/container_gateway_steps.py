"""The steps that tests/test_enterprise_gateway_docker.py and tests/test_enterprise_gateway_swarm.py share.

Both drive Enterprise Gateway (tests/enterprise_gateway.py's `docker_gateway` or `swarm_gateway`) whose
kernels run in containers of the tests' dockerd, labelled as the gateway labels them: a module's place,
finding a kernel's containers, a cell on a fresh WebSocket, a restart, a DELETE, a refused launch. What
each test asserts of what it finds stays in the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from .containers import Docker, require_docker, require_podman
from .enterprise_gateway import USER, EnterpriseGateway
from .kernel_ws import Cell
from .waiting import wait_until


@dataclass
class Place:
    """A module's gateway, its dockerd, the kernels' image and the module's folder."""

    gateway: EnterpriseGateway
    docker: Docker
    image: str
    folder: Path


Setup = Callable[[Path], AbstractContextManager[tuple[EnterpriseGateway, Docker, str]]]


@contextmanager
def place_of(setup: Setup, folder: Path) -> Iterator[Place]:
    """The gateway `setup` makes in `folder` (podman builds the image, the tests' dockerd runs it), for a
    module; its log's tail printed at the end, whatever happened."""
    require_podman()
    require_docker()
    try:
        with setup(folder) as (gateway, docker, image):
            yield Place(gateway, docker, image, folder)
    finally:
        log = folder / "gateway.log"
        print(f"gateway log:\n{log.read_text(errors='replace')[-6000:] if log.exists() else '(none)'}")


def containers(docker: Docker, kernel_id: str | None = None, every: bool = True) -> list[str]:
    """The ids of the kernels' containers (one kernel's where given); running or not, or (`every=False`)
    only the running ones."""
    label = f"kernel_id={kernel_id}" if kernel_id else "app=enterprise-gateway"
    listed = docker.run("ps", *(["--all"] if every else []), "--quiet", "--no-trunc", "--filter", f"label={label}")
    return listed.stdout.split()


def container_of(place: Place, kernel_id: str, every: bool = True) -> str:
    """The kernel's one container (`every=False`: its one running container)."""
    found = containers(place.docker, kernel_id, every)
    assert len(found) == 1, found
    return found[0]


def run_cell(place: Place, kernel_id: str, code: str, seconds: float = 60) -> Cell:
    """`code` run as a cell on a WebSocket of its own, closed after it; the cell."""
    ws = place.gateway.websocket(kernel_id)
    try:
        return ws.run(code, seconds)
    finally:
        ws.close()


def restart(place: Place, kernel_id: str) -> None:
    status, _ = place.gateway.request("POST", f"/api/kernels/{kernel_id}/restart")
    assert status == 200


def delete(place: Place, kernel_id: str) -> None:
    """DELETE the kernel: answered 204, and its containers gone."""
    status, _ = place.gateway.request("DELETE", f"/api/kernels/{kernel_id}")
    assert status == 204
    wait_until(lambda: not containers(place.docker, kernel_id), 30, f"kernel {kernel_id}'s container removed")


def refused(place: Place, kernel_name: str, env: dict[str, str], said: str) -> None:
    """A launch with `env` (beside USER) fails at once, the gateway answering 500 and its log saying `said`."""
    status, body = place.gateway.request("POST", "/api/kernels", {"name": kernel_name, "env": {**USER, **env}},
                                         timeout=60)
    assert status == 500, (status, body)
    wait_until(lambda: said in place.gateway.log(), 10, f"{said!r} in the gateway's log")
