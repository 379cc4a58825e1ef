"""owsandbox kernels in Docker containers through Jupyter Enterprise Gateway's DockerProcessProxy.

Everything is real but the place: the tests' own dockerd (tests/containers.py) runs in a network
namespace of its own with a bridge there (TEST-NET-3 addresses, no iptables rules, no forwarding),
standing in for a gateway host's Docker; the gateway (tests/enterprise_gateway.py) runs in the same
namespace, as on that host, and finds the containers' addresses on the bridge. The kernelspec is
the docs' `owsandbox install --enterprise-gateway docker --image IMG`; the image is the tests'
Debian one with bubblewrap and owsandbox installed (`owsandbox_image()`), so the cells run in
bubblewrap nested in the kernel's container.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from owsandbox.host.isolation.container_seccomp import default_profile_path

from . import container_gateway_steps as steps
from .container_gateway_steps import Place, container_of, containers, place_of, refused, restart, run_cell
from .containers import IMAGE, MARKER
from .enterprise_gateway import BRIDGE, USER, docker_gateway, stop_keeps_state
from .enterprise_gateway import DOCKER_KERNEL_NAME as KERNEL
from .enterprise_gateway import DOCKER_LOCAL_KERNEL_NAME as LOCAL_KERNEL
from .waiting import wait_until

# The gateway starts inside the first test's timeout (101 s with two test runs at once on two cores):
# the timeout is a hang guard only.
pytestmark = [pytest.mark.system, pytest.mark.needs("enterprise-gateway"), pytest.mark.needs_owsandbox_image,
              pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    with place_of(docker_gateway, tmp_path_factory.mktemp("egdocker")) as found:
        yield found


@pytest.fixture(autouse=True)
def no_container_passed_on(place: Place) -> Iterator[None]:
    """A kernel's container that a failing test left is removed after it, so that the next test (which
    may count containers) does not fail for it too."""
    yield
    left = containers(place.docker)
    if left:
        place.docker.run("rm", "--force", *left, check=False)


def processes_naming(kernel_id: str) -> list[str]:
    """Command lines on this machine that name the kernel: the launcher, the container's kernel, the box."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if kernel_id in line:
                found.append(f"{entry.name}: {line}")
    return found


def delete(place: Place, kernel_id: str) -> None:
    """DELETE the kernel: its container goes, and with it every process of the kernel's."""
    steps.delete(place, kernel_id)
    wait_until(lambda: not processes_naming(kernel_id), 20, f"no process of kernel {kernel_id} left")


def test_a_kernel_runs_in_its_container_in_bubblewrap_and_stop_keeps_its_state(place: Place) -> None:
    assert not Path(MARKER).exists()  # the image's file: only the container has it
    kernel_id = place.gateway.start_kernel(USER)
    container = container_of(place, kernel_id)
    ws = place.gateway.websocket(kernel_id)
    try:
        cell = ws.run(f"cat {MARKER}; echo $OWSANDBOX_SANDBOX; id -u; pwd", 60)
        assert cell.status == "ok", cell.outputs
        top = place.docker.run("top", container, "-eo", "pid,args").stdout
        assert "gateway-kernel" in top and "bwrap" in top, top  # the box is bubblewrap, in the container
        assert cell.text().split() == [IMAGE, "bwrap", "1000", "/home/student"], cell.outputs  # the marker's text
        stop_keeps_state(place.gateway, ws, kernel_id)
    finally:
        ws.close()
    delete(place, kernel_id)


def test_the_box_sees_neither_the_hosts_files_nor_the_kernels_own(place: Place) -> None:
    """An attack from a cell: the host's files, the container's kernel process and its connection file
    (whose key signs every message to the kernel) are all out of reach."""
    secret = place.folder / "host-secret.txt"
    secret.write_text("the host's\n")
    kernel_id = place.gateway.start_kernel(USER)
    ws = place.gateway.websocket(kernel_id)
    try:
        cell = ws.run(f"cat {secret} 2>&1;"
                      " cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'gateway-[k]ernel';"
                      f" find / -path /proc -prune -o -name 'kernel-{kernel_id}*.json' -print 2>/dev/null | wc -l;"
                      " grep --color=never -E '^(CapEff|NoNewPrivs)' /proc/self/status", 60)
        words = cell.text()
        assert "No such file or directory" in words and "the host's" not in words, cell.outputs
        lines = words.splitlines()
        assert lines[1:3] == ["0", "0"], cell.outputs  # no kernel process, no connection file in view
        assert "CapEff:\t0000000000000000" in words and "NoNewPrivs:\t1" in words, cell.outputs
    finally:
        ws.close()
    delete(place, kernel_id)


def test_a_restart_is_a_new_container_and_delete_leaves_nothing(place: Place) -> None:
    """The box lives in the container, and the gateway removes the container on a restart: the restarted
    kernel has a new container and an empty box (a Docker kernel's state does not outlive a restart)."""
    kernel_id = place.gateway.start_kernel(USER)
    first = container_of(place, kernel_id)
    assert run_cell(place, kernel_id, "echo before-restart > /tmp/mark").status == "ok"
    restart(place, kernel_id)
    second = container_of(place, kernel_id)
    assert second != first
    cell = run_cell(place, kernel_id, "cat /tmp/mark 2>&1; echo $OWSANDBOX_SANDBOX")
    assert "No such file" in cell.text() and "bwrap" in cell.text(), cell.outputs
    delete(place, kernel_id)


def test_the_local_provider_makes_the_container_the_sandbox_and_says_so(place: Place) -> None:
    status, body = place.gateway.request("POST", "/api/kernels", {"name": LOCAL_KERNEL, "env": USER})
    assert status == 201, (status, body)
    kernel_id = body["id"]
    ws = place.gateway.websocket(kernel_id)
    try:
        cell = ws.run(f"cat {MARKER}; id -u", 60)
        assert cell.status == "ok" and cell.text().split() == [IMAGE, "1000"], cell.outputs
        assert "local" in cell.plain(), cell.outputs  # the banner names the provider
    finally:
        ws.close()
    top = place.docker.run("top", container_of(place, kernel_id), "-eo", "pid,args").stdout
    assert "gateway-kernel" in top and "bwrap" not in top, top
    assert "provider local: the container itself is the kernel's sandbox" in place.gateway.log()
    delete(place, kernel_id)


@pytest.mark.parametrize(("env", "said"), [
    ({"KERNEL_WORKING_DIR": "/"}, "the workspace would be /"),
    ({"KERNEL_IMAGE": "localhost/owsandbox-test-bookworm:1"}, "this kernelspec runs only its own image"),
])
def test_a_refused_launch_fails_at_once_and_leaves_no_container(place: Place, env: dict[str, str],
                                                                said: str) -> None:
    refused(place, KERNEL, env, said)
    wait_until(lambda: not containers(place.docker), 30, "no kernel container left")


@pytest.mark.parametrize(("options", "said"), [
    ([], "No permissions to create new namespace"),  # Docker's default profile: no user namespaces
    (["--security-opt", f"seccomp={default_profile_path()}", "--security-opt", "systempaths=unconfined"],
     "Can't set hostname"),  # the engines' profile alone: without CAP_SYS_ADMIN, no sethostname
])
def test_without_what_gateway_docker_allows_the_kernel_refuses_to_start(place: Place, options: list[str],
                                                                          said: str) -> None:
    """Why the launcher widens the container: started without it (straight from docker here), the
    kernel refuses at its launch, naming what bubblewrap lacks, rather than at the first cell."""
    done = place.docker.run("run", "--rm", "--user", "1000:100", "--cap-drop", "ALL", "--network", "none",
                            "--env", "OWSANDBOX_PROVIDER=bwrap", *options, place.image, "owsandbox", "gateway-kernel",
                            "--RemoteProcessProxy.kernel-id", "k1", "--RemoteProcessProxy.response-address",
                            f"{BRIDGE.split('/')[0]}:9", "--RemoteProcessProxy.public-key", "AAAA", check=False)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "the spec's provider is bwrap, and bwrap cannot make a sandbox here" in done.stderr, done.stderr
    assert said in done.stderr, done.stderr


def test_the_gateway_refuses_a_root_kernel(place: Place) -> None:
    """The gateway's own guard (EG_PROHIBITED_UIDS, 0 by default); gateway-docker refuses uid 0 too, should
    a gateway allow it (tests/test_gateway_kernelspec.py)."""
    status, body = place.gateway.request("POST", "/api/kernels", {"name": KERNEL, "env": {**USER, "KERNEL_UID": "0"}})
    assert status == 403 and "UID value of '0'" in body["reason"], (status, body)
