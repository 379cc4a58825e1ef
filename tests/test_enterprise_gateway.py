"""owsandbox kernels on two remote hosts through Jupyter Enterprise Gateway's DistributedProcessProxy.

Everything is real: two network namespaces with their own sshd stand for the hosts, the gateway (its
own virtual environment, tests/enterprise_gateway.py) runs in a third and logs in to them with ssh
(paramiko) to start `owsandbox gateway-kernel`, as written by `owsandbox install --enterprise-gateway
ssh --hosts H1,H2`; the kernels' bubblewrap sandboxes run on the hosts. The hosts share this machine's
file system (owsandbox, installed in the test's virtual environment, is at the same path on both,
as with a shared install); each host has a runtime folder of its own (tests/gateway_hosts.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import require_bwrap
from .enterprise_gateway import USER, EnterpriseGateway, install_spec, stop_keeps_state
from .gateway_hosts import SECOND_ADDRESS, GatewayNetwork, gateway_network
from .namespace_server import kernel_on, served
from .processes import PinnedProcesses, descendants, pid_alive, wait_gone
from .waiting import wait_until

pytestmark = [pytest.mark.system, pytest.mark.needs("enterprise-gateway")]

@dataclass
class Place:
    gateway: EnterpriseGateway
    network: GatewayNetwork
    processes: PinnedProcesses


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    require_bwrap()
    with gateway_network() as network:
        prefix = network.folder / "spec"
        install_spec(prefix, [host.address for host in network.hosts])
        gateway = EnterpriseGateway(network, prefix, tmp_path_factory.mktemp("eg") / "gateway.log")
        with served(gateway, network, "gateway") as processes:
            yield Place(gateway, network, processes)


def workspace(place: Place, name: str) -> dict[str, str]:
    folder = place.network.folder / "work" / name
    folder.mkdir(parents=True)
    return {**USER, "KERNEL_WORKING_DIR": str(folder)}


def pin(place: Place, pid: int) -> dict[int, str]:
    """The kernel and its sandbox (bubblewrap, the daemon, the shells), pinned; their command lines."""
    seen = place.processes.add_tree(pid)
    below = set(descendants(pid))
    tree = {p: c for p, c in seen.items() if p == pid or p in below}
    assert any(os.path.basename(c.split(" ", 1)[0]) == "bwrap" for c in tree.values()), tree
    return tree


def test_two_kernels_land_on_two_hosts_run_cells_and_stop(place: Place) -> None:
    first = place.gateway.start_kernel(workspace(place, "first"))
    second = place.gateway.start_kernel(workspace(place, "second"))
    (host_a, pid_a), (host_b, pid_b) = kernel_on(place.network, first), kernel_on(place.network, second)
    assert host_a is not host_b, f"both kernels on {host_a.name}"
    sockets = [place.gateway.websocket(first), place.gateway.websocket(second)]
    try:
        for ws, host, kernel_id in zip(sockets, (host_a, host_b), (first, second), strict=True):
            cell = ws.run("echo $((6 * 7)) > answer.txt; cat answer.txt", 60)
            assert cell.status == "ok" and cell.text() == "42\n", cell.outputs
            assert (place.network.folder / "work" / ("first" if kernel_id == first else "second")
                    / "answer.txt").read_text() == "42\n"  # the workspace is KERNEL_WORKING_DIR
            tree = pin(place, kernel_on(place.network, kernel_id)[1])
            state = Path(host.runtime)  # the sandbox's state folder is in this host's runtime folder
            assert any(f"kernel-{kernel_id}" in c and str(state) in c for c in tree.values()), tree
        ws = sockets[0]
        stop_keeps_state(place.gateway, ws, first)
    finally:
        for ws in sockets:
            ws.close()
    for kernel_id, pid in ((first, pid_a), (second, pid_b)):
        tree = pin(place, pid)
        status, _ = place.gateway.request("DELETE", f"/api/kernels/{kernel_id}")
        assert status == 204
        left = wait_gone(list(tree), 20)
        assert not left, f"still running after DELETE: {[tree[p] for p in left]}"
    for host in place.network.hosts:
        assert not list((host.runtime / "jupyter").glob("kernel-*.json")), "a connection file was left"


def test_a_restart_on_the_same_host_keeps_the_sandbox(place: Place) -> None:
    host = place.network.hosts[1]
    kernel_id = place.gateway.start_kernel({**workspace(place, "restart"), "KERNEL_REMOTE_HOST": host.address})
    on, pid = kernel_on(place.network, kernel_id)
    assert on is host
    ws = place.gateway.websocket(kernel_id)
    try:
        assert ws.run("echo kept-over-restart > /tmp/mark; echo $$", 60).status == "ok"
        before = pin(place, pid)
        box = {p for p, c in before.items() if "runner.pyz serve" in c}  # bubblewrap and the daemon
    finally:
        ws.close()
    status, _ = place.gateway.request("POST", f"/api/kernels/{kernel_id}/restart")
    assert status == 200
    again, new_pid = wait_until(lambda: (found := kernel_on(place.network, kernel_id)) and found[1] != pid and found,
                                60, "the restarted kernel's process")
    assert again is host and new_pid != pid
    ws = place.gateway.websocket(kernel_id)
    try:
        cell = ws.run("cat /tmp/mark", 60)
        assert cell.text().strip() == "kept-over-restart", cell.outputs
    finally:
        ws.close()
    assert box and all(pid_alive(p) for p in box), "the sandbox did not outlive the restart"
    after = place.processes.add_tree(new_pid)
    relay = [c for p, c in after.items() if p != new_pid and f"kernel-{kernel_id}/run/runner.sock" in c]
    assert relay and all(str(host.runtime) in c for c in relay), after  # the same box, on the same host
    status, _ = place.gateway.request("DELETE", f"/api/kernels/{kernel_id}")
    assert status == 204
    left = wait_gone([*before, *after], 20)
    assert not left, f"still running after DELETE: {left}"


def test_the_gateway_refuses_root_without_kernel_username(place: Place) -> None:
    status, body = place.gateway.request("POST", "/api/kernels", {"name": "owsandbox-eg", "env": {}})
    assert status == 403, (status, body)
    assert "root" in body["reason"] and "KERNEL_USERNAME" in body["reason"], body


def test_a_refused_launch_is_the_gateways_error_at_once_with_the_reason(place: Place) -> None:
    """The ssh proxy has no local process to see fail: without the launcher's refusal answer it waited
    out its whole launch timeout ("Waited too long (30s) to get connection file") and pointed at the
    kernel's log on the host."""
    status, body = place.gateway.request("POST", "/api/kernels", {"name": "owsandbox-eg",
                                                                  "env": {**USER, "KERNEL_WORKING_DIR": "/"}})
    assert status == 500, (status, body)
    assert "owsandbox refused this kernel: the workspace would be /" in body["reason"], body


def test_an_unpinned_restart_moves_to_the_other_host_and_starts_empty(place: Place) -> None:
    """Round-robin gives a restart the next host (nothing else starts in between here): the kernel
    there has a new, empty sandbox, and the old one, kept for a restart on its own host, ends after
    its linger (30 s)."""
    kernel_id = place.gateway.start_kernel(workspace(place, "moved"))
    host, pid = kernel_on(place.network, kernel_id)
    ws = place.gateway.websocket(kernel_id)
    try:
        assert ws.run("echo only-here > /tmp/mark", 60).status == "ok"
        old_box = {p: c for p, c in pin(place, pid).items() if "runner.pyz serve" in c}
    finally:
        ws.close()
    status, _ = place.gateway.request("POST", f"/api/kernels/{kernel_id}/restart")
    assert status == 200
    moved, new_pid = wait_until(lambda: (found := kernel_on(place.network, kernel_id)) and found[1] != pid and found,
                                60, "the restarted kernel's process")
    assert moved is not host, "round-robin gave the restart the same host"
    ws = place.gateway.websocket(kernel_id)
    try:
        cell = ws.run("cat /tmp/mark 2>&1; true", 60)
        assert "No such file" in cell.text(), cell.outputs
    finally:
        ws.close()
    new_tree = pin(place, new_pid)
    assert not set(old_box) & set(new_tree)
    left = wait_gone(list(old_box), 45)  # the linger of a sandbox kept for a restart, and a margin
    assert not left, f"the old host's sandbox did not end: {[old_box[p] for p in left]}"
    status, _ = place.gateway.request("DELETE", f"/api/kernels/{kernel_id}")
    assert status == 204
    left = wait_gone(list(new_tree), 20)
    assert not left, f"still running after DELETE: {[new_tree[p] for p in left]}"


def test_a_host_reached_at_another_address_than_its_routes_source_runs_the_kernel(place: Place) -> None:
    """The gateway logs in to the first host at its second address, while the host's route back to the
    gateway leaves from its pair's address: the kernel must listen where the gateway connects (where its
    ssh session came in), or the gateway's connection is refused, it gives the kernel up, and the kernel
    runs on, orphaned, with its sandbox."""
    host = place.network.hosts[0]
    assert SECOND_ADDRESS in host.more_addresses
    kernel_id = place.gateway.start_kernel({**workspace(place, "second-address"), "KERNEL_REMOTE_HOST": SECOND_ADDRESS})
    on, pid = kernel_on(place.network, kernel_id)
    assert on is host
    ws = place.gateway.websocket(kernel_id)
    try:
        cell = ws.run("echo reached", 60)
        assert cell.status == "ok" and cell.text() == "reached\n", cell.outputs
    finally:
        ws.close()
    connection = next((host.runtime / "jupyter").glob(f"kernel-{kernel_id}*.json"))
    assert SECOND_ADDRESS in connection.read_text()  # where it listens: the address the gateway named
    tree = pin(place, pid)
    status, _ = place.gateway.request("DELETE", f"/api/kernels/{kernel_id}")
    assert status == 204
    assert not wait_gone(list(tree), 20)
    assert not list((host.runtime / "jupyter").glob(f"kernel-{kernel_id}*.json"))
