"""owsandbox kernels on two remote hosts from a plain Jupyter server, without a gateway.

Everything is real: two network namespaces with their own sshd stand for the hosts; a `jupyter server`
(the test environment's, tests/provisioned_server.py) runs in a third and, through the kernelspec that
`owsandbox install --kernel-provisioner distributed --hosts H1,H2` writes, logs in to them with ssh
(gateway_provisioners' DistributedProvisioner, paramiko) to start `owsandbox gateway-kernel`; the
kernels' bubblewrap sandboxes run on the hosts. The server asks for transport encryption
(`--KernelManager.transport_encryption=required`), so every ZMQ message between it and a kernel is
CurveZMQ. The hosts share this machine's file system (owsandbox is at the same path on both, as with a
shared install); each host has a runtime folder of its own (tests/gateway_hosts.py). The test speaks to
the server as JupyterLab does: REST and the kernel's WebSocket.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import require_bwrap
from .enterprise_gateway import stop_keeps_state
from .gateway_hosts import GatewayNetwork, Host, gateway_network
from .namespace_server import kernel_on, served
from .processes import PinnedProcesses, command_line, descendants, pid_alive, wait_gone
from .provisioned_server import ProvisionedServer, install_spec
from .waiting import patience, wait_until

pytestmark = [pytest.mark.system]

ROOT_WORKSPACE = "owsandbox-remote-root"  # a spec whose workspace is /, which the launcher refuses


@dataclass
class Place:
    server: ProvisionedServer
    network: GatewayNetwork
    processes: PinnedProcesses
    workspace: Path


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    require_bwrap()
    with gateway_network() as network:
        prefix = network.folder / "spec"
        workspace = network.folder / "work"
        workspace.mkdir()
        install_spec(prefix, [host.address for host in network.hosts], workspace)
        install_spec(prefix, [host.address for host in network.hosts], Path("/"), name=ROOT_WORKSPACE)
        server = ProvisionedServer(network, prefix, tmp_path_factory.mktemp("server") / "server.log",
                                   ["--KernelManager.transport_encryption=required"])
        with served(server, network, "server") as processes:
            yield Place(server, network, processes, workspace)


def pin(place: Place, pid: int) -> dict[int, str]:
    """The kernel and its sandbox (bubblewrap, the daemon, the shells), pinned; their command lines."""
    seen = place.processes.add_tree(pid)
    below = set(descendants(pid))
    tree = {p: c for p, c in seen.items() if p == pid or p in below}
    assert any(c.split(" ", 1)[0].endswith("bwrap") for c in tree.values()), tree
    return tree


def left_on(host: Host, kernel_id: str) -> list[Path]:
    """What the kernel left in the host's runtime folder: its connection file, its sandbox's state."""
    return [path for path in host.runtime.rglob("*") if kernel_id in path.name]


def delete(place: Place, kernel_id: str, pids: list[int]) -> None:
    """DELETE the kernel: answered 204, and nothing of it left on any host (no process, no file)."""
    status, body = place.server.request("DELETE", f"/api/kernels/{kernel_id}")
    assert status == 204, (status, body)
    left = wait_gone(pids, 20)
    assert not left, f"still running after DELETE: {[command_line(p) for p in left]}"
    for host in place.network.hosts:
        assert not left_on(host, kernel_id), f"left on {host.name}: {left_on(host, kernel_id)}"
        assert not [p for p in host.processes() if kernel_id in command_line(p)]


def test_kernels_start_on_both_hosts_run_cells_in_their_sandboxes_and_stop(place: Place) -> None:
    first, second = place.server.start_kernel(), place.server.start_kernel()
    (host_a, pid_a), (host_b, pid_b) = kernel_on(place.network, first), kernel_on(place.network, second)
    assert host_a is not host_b, f"both kernels on {host_a.name}"  # round-robin
    sockets = [place.server.websocket(first), place.server.websocket(second)]
    try:
        for ws, host, kernel_id in zip(sockets, (host_a, host_b), (first, second), strict=True):
            cell = ws.run(f"echo $((6 * 7)) > answer-{kernel_id}.txt; cat answer-{kernel_id}.txt", 60)
            assert cell.status == "ok" and cell.text() == "42\n", cell.outputs
            assert (place.workspace / f"answer-{kernel_id}.txt").read_text() == "42\n"  # the spec's workspace
            tree = pin(place, kernel_on(place.network, kernel_id)[1])
            # the sandbox is that host's: its state in the host's runtime folder (its network is a namespace of
            # its own, below the host's)
            assert any(f"kernel-{kernel_id}" in c and str(host.runtime) in c for c in tree.values()), tree
            connection = json.loads((host.runtime / "jupyter" / f"kernel-{kernel_id}.json").read_text())
            assert connection["ip"] == host.address and len(connection["curve_publickey"]) == 40  # encrypted
        stop_keeps_state(place.server, sockets[0], first)  # Stop (the interrupt) ends a sleep; the shell stays
    finally:
        for ws in sockets:
            ws.close()
    for kernel_id, pid in ((first, pid_a), (second, pid_b)):
        delete(place, kernel_id, list(pin(place, pid)))


def test_a_restart_stays_on_its_host_and_keeps_the_sandbox(place: Place) -> None:
    """The stock DistributedProvisioner would start the restarted kernel on the next host (round-robin), with
    a new, empty sandbox; owsandbox's keeps it where its sandbox is, every time."""
    kernel_id = place.server.start_kernel()
    host, pid = kernel_on(place.network, kernel_id)
    ws = place.server.websocket(kernel_id)
    try:
        assert ws.run("echo kept-over-restart > /tmp/mark; echo $$", 60).status == "ok"
        before = pin(place, pid)
        box = {p for p, c in before.items() if "runner.pyz serve" in c}  # bubblewrap and the daemon
    finally:
        ws.close()
    seen = [pid]
    for _ in range(2):  # round-robin alone would have moved it at one of two restarts
        status, body = place.server.request("POST", f"/api/kernels/{kernel_id}/restart")
        assert status == 200, (status, body)
        again, new_pid = wait_until(
            lambda: (found := kernel_on(place.network, kernel_id)) and found[1] not in seen and found, 60,
            "the restarted kernel's process")
        assert again is host, f"the restart moved from {host.name} to {again.name}"
        seen.append(new_pid)
        ws = place.server.websocket(kernel_id)
        try:
            cell = ws.run("cat /tmp/mark", 60)
            assert cell.status == "ok" and cell.text().strip() == "kept-over-restart", cell.outputs
        finally:
            ws.close()
    assert box and all(pid_alive(p) for p in box), "the sandbox did not outlive the restarts"
    assert not pid_alive(pid), "the first kernel process outlived its restart"
    after = place.processes.add_tree(seen[-1])
    delete(place, kernel_id, [*box, *after])


def test_a_refused_launch_is_the_servers_error_at_once_with_the_reason(place: Place) -> None:
    """The provisioner has no local process to see fail: without the launcher's refusal answer it would
    wait out its whole launch timeout (180 s) for a kernel that never started. Jupyter Server answers a
    500 without the reason ("Unhandled error"); its log has it, as an error (not only in --debug's lines),
    and not hidden behind a complaint about missing CurveZMQ keys, which the provisioner checks first."""
    started = time.monotonic()
    status, body = place.server.request("POST", "/api/kernels", {"name": ROOT_WORKSPACE})
    assert status == 500, (status, body)
    said = "owsandbox refused this kernel: the workspace would be /"
    wait_until(lambda: any(line.startswith("[E") and said in line for line in place.server.log().splitlines()), 10,
               "the refusal in an error line of the server's log")
    assert "did not return valid CurveZMQ keys" not in place.server.log()
    assert time.monotonic() - started < 60, "the refusal waited for the launch timeout"
    # The refused launcher has answered; it may still be ending (a busy machine's CI found it there).
    def no_launcher() -> bool:
        return not any("gateway-kernel" in command_line(p) for host in place.network.hosts for p in host.processes())

    wait_until(no_launcher, patience(10), "the refused launcher to end on every host")


def test_stopping_the_server_ends_its_remote_kernels_and_their_sandboxes(place: Place, tmp_path: Path) -> None:
    """An operator stops JupyterLab (SIGTERM) with kernels running: a second server of the same spec, on
    another port, is stopped with its kernel busy; nothing of the kernel stays on its host."""
    server = ProvisionedServer(place.network, place.network.folder / "spec", tmp_path / "second.log",
                               ["--KernelManager.transport_encryption=required"], port=8890)
    try:
        kernel_id = server.start_kernel()
        host, pid = kernel_on(place.network, kernel_id)
        ws = server.websocket(kernel_id)
        try:
            assert ws.run("echo here > /tmp/mark", 60).status == "ok"
            tree = pin(place, pid)
            ws.send("sleep 300")  # busy when the server stops
        finally:
            ws.close()
    finally:
        server.stop()
    assert server.process.returncode is not None
    left = wait_gone(list(tree), 30)
    assert not left, f"still running after the server stopped: {[tree[p] for p in left]}"
    assert not left_on(host, kernel_id), left_on(host, kernel_id)
