"""`%network on|off` on a running bubblewrap box: out to a server of the test's own, never the host's loopback.

The kernel (or the attacker's host process, for the plain user) runs in a network namespace the test
made (tests/netns.py), so the box's outbound connections, carried by pasta from there, can reach only
the test's HTTP server in the other namespace: no traffic goes anywhere else. As root through a real
kernel, and as root and as a plain user through the attacker's provider: off, the box has loopback only;
on, it reaches the server and still not the host's loopback; off again ends that pasta (by the pid the
host recorded) and the box is unreachable again; a box that ends on its own takes its pasta with it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from owsandbox.kernelspec import kernel_argv

from ..kernel_session import KernelSession
from ..machine_lock import own_key
from ..netns import GREETING, LOOPBACK_PORT, OTHER_ADDRESS, SERVER_ADDRESS, OwnNetwork, fetch, own_network
from ..processes import wait_gone
from ..waiting import wait_until
from .conftest import Attacker

HOST_LOOPBACK = [f"http://127.0.0.1:{LOOPBACK_PORT}/hello.txt", f"http://localhost:{LOOPBACK_PORT}/hello.txt"]


@pytest.fixture
def network() -> Iterator[OwnNetwork]:
    with own_network() as made:
        yield made


@pytest.fixture
def kernel_in_network(network: OwnNetwork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KernelSession]:
    """A real kernel on the bubblewrap provider, started in the client namespace (over IPC: the test's own
    TCP could not reach it there)."""
    spec = tmp_path / "kernels" / "owsandbox-in-netns"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": network.in_client(kernel_argv(sys.executable)), "display_name": "Sandbox (test network)",
        "language": "bash", "interrupt_mode": "message", "env": {"OWSANDBOX_PROVIDER": "bwrap"}}))
    monkeypatch.setenv("JUPYTER_PATH", f"{tmp_path}{os.pathsep}{os.environ.get('JUPYTER_PATH', '')}")
    workspace = tmp_path / "work"
    workspace.mkdir()
    session = KernelSession(workspace, kernel_name="owsandbox-in-netns", transport="ipc", ip=str(tmp_path / "kernel"))
    try:
        yield session
    finally:
        session.close()


def _reached(run) -> bool:
    return run.status == "ok" and run.text() == GREETING


def test_network_on_reaches_out_never_the_hosts_loopback_and_off_ends_it(kernel_in_network, network):
    kernel = kernel_in_network
    first = kernel.run(fetch(network.url + "hello.txt"))
    assert "· no network ·" in first.notes() and first.status == "error", first.outputs
    assert "unreachable" in first.text("stderr")
    shown = kernel.run("%network").text()
    assert shown.startswith("network: none: own network namespace")

    on = kernel.run("%network on")
    assert on.status == "ok" and on.text().startswith("network: outbound (through pasta"), on.outputs
    pasta = network.processes_in_client("pasta")
    assert len(pasta) == 1, pasta
    reached = kernel.run(fetch(network.url + "hello.txt"))
    assert _reached(reached), reached.outputs
    assert "· network out (pasta) ·" in reached.notes()  # the next cell's line says so
    for url in HOST_LOOPBACK:
        tried = kernel.run(fetch(url, timeout=3))
        assert tried.status == "error" and "loopback service" not in tried.text(), (url, tried.outputs)
    summary = kernel.run("%sandbox").of_type("display_data")[0]["data"]["text/plain"]
    assert re.search(r"^Network +outbound: through pasta", summary, re.M), summary
    assert json.loads(kernel.run("%sandbox --json").of_type("display_data")[0]["data"]["text/plain"])[
        "network"] == "outbound"

    off = kernel.run("%network off")
    assert off.status == "ok" and off.text().startswith("network: none"), off.outputs
    assert wait_gone(pasta) == [] and network.processes_in_client("pasta") == []
    again = kernel.run(fetch(network.url + "hello.txt"))
    assert again.status == "error" and "unreachable" in again.text("stderr"), again.outputs
    assert "· no network ·" in again.notes()

    assert kernel.run("%network on").status == "ok" and _reached(kernel.run(fetch(network.url + "hello.txt")))
    kernel.run("%network on")  # on twice is on once
    assert len(network.processes_in_client("pasta")) == 1
    kernel.close()  # shutdown ends the box and its pasta, and the pasta's watcher with it
    wait_until(lambda: not network.processes_in_client("pasta"), 10, "the box's pasta to end with the kernel")


def test_a_restarted_kernel_finds_the_network_it_turned_on_and_can_end_it(kernel_in_network, network):
    """The box lingers for a restarting kernel with its pasta; the host's record says which pasta it is."""
    kernel = kernel_in_network
    assert kernel.run("%network on").status == "ok"
    pasta = network.processes_in_client("pasta")
    kernel.km.restart_kernel(now=False)
    kernel.kc.wait_for_ready(timeout=60)
    kernel.drain()
    again = kernel.run(fetch(network.url + "hello.txt"))
    assert _reached(again) and "· network out (pasta) ·" in again.notes(), again.outputs
    assert network.processes_in_client("pasta") == pasta
    assert kernel.run("%network off").status == "ok"
    assert wait_gone(pasta) == [] and kernel.run(fetch(network.url + "hello.txt")).status == "error"


def test_the_packages_recipe_a_venv_made_in_a_cell_takes_pip_install_over_the_network(kernel_in_network, network):
    """README's "Packages in the box": %network on, a venv, pip install, %network off; the index is the
    test's own server, holding one wheel the test made."""
    _simple_index(network.served)
    kernel = kernel_in_network
    assert kernel.run("%network on").status == "ok"
    installed = kernel.run("python3 -m venv .venv && .venv/bin/pip install --isolated --disable-pip-version-check "
                           f"--no-cache-dir --index-url {network.url}simple/ --trusted-host {SERVER_ADDRESS} "
                           "owsbx-net-demo", timeout=180)  # plain http: the test's own server has no certificate
    assert installed.status == "ok", (installed.text(), installed.text("stderr"), installed.notes())
    assert "Successfully installed owsbx-net-demo-1.0" in installed.text()
    assert kernel.run("%network off").status == "ok"
    used = kernel.run(".venv/bin/python -c 'import owsbx_net_demo; print(owsbx_net_demo.WORDS)'")
    assert used.text() == "installed over the box's network\n", used.outputs
    assert (kernel.workspace / ".venv" / "pyvenv.cfg").is_file()


def _simple_index(served: Path) -> None:
    """A package index of one wheel (PEP 503 layout), written by hand: no build tool runs."""
    import base64
    import hashlib
    import zipfile

    files = {"owsbx_net_demo/__init__.py": "WORDS = \"installed over the box's network\"\n",
             "owsbx_net_demo-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: owsbx-net-demo\nVersion: 1.0\n",
             "owsbx_net_demo-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: the test\nRoot-Is-Purelib: true\n"
                                                   "Tag: py3-none-any\n"}
    def digest(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).decode().rstrip("=")

    record = "".join(f"{name},sha256={digest(text)},{len(text.encode())}\n" for name, text in files.items())
    files["owsbx_net_demo-1.0.dist-info/RECORD"] = record + "owsbx_net_demo-1.0.dist-info/RECORD,,\n"
    folder = served / "simple" / "owsbx-net-demo"
    folder.mkdir(parents=True)
    wheel = folder / "owsbx_net_demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    (folder / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    for path in (served / "simple", folder, wheel, folder / "index.html"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def test_network_on_and_off_as_root_and_as_a_plain_user(attacker_factory, home: Path, network, who: str):
    attacker: Attacker = attacker_factory(outer=tuple(network.in_client([])))
    attacker.start(home / "project", key=own_key("kernel-network-switch"), linger_seconds=2)
    url = network.url + "hello.txt"
    assert attacker.run(fetch(url))["exit_code"] != 0
    said = attacker.step(network=True)
    assert said.get("said", "").startswith("outbound · through pasta"), said
    assert attacker.run(fetch(url))["output"] == GREETING
    for loopback in HOST_LOOPBACK:
        tried = attacker.run(fetch(loopback, timeout=3))
        assert tried["exit_code"] != 0 and "loopback service" not in tried["output"], (who, loopback, tried)
    pasta = attacker.step(state=True)["pasta_pid"]
    assert network.processes_in_client("pasta") == [pasta]
    assert attacker.step(network=False)["said"].startswith("none · own network namespace")
    assert wait_gone([pasta]) == [] and attacker.step(state=True)["pasta_pid"] is None
    assert attacker.run(fetch(url))["exit_code"] != 0
    assert attacker.step(network=True)["said"].startswith("outbound")
    pasta = attacker.step(state=True)["pasta_pid"]
    attacker.kill()  # the host process dies at once, as a kernel killed for good: the box lingers, then ends
    wait_until(lambda: not network.processes_in_client("pasta"), 30, "pasta to end with the box that ended")
    assert wait_gone([pasta]) == []


def test_network_on_never_reaches_the_hosts_other_addresses(attacker_factory, home: Path, network, who: str):
    """The host's other interfaces (a second network, a container bridge), IPv4 and IPv6, and a service
    bound to every address: pasta would carry the box's connections there as its own, so the box's
    namespace has a refusing route to each address of the host, set before pasta gives it a network,
    which the box, with no capability over its namespace, cannot take away."""
    attacker = attacker_factory(outer=tuple(network.in_client([])))
    attacker.start(home / "project", network=True)
    assert attacker.run(fetch(network.url + "hello.txt"))["output"] == GREETING  # out, as before
    assert attacker.run(fetch(network.url6 + "hello.txt"))["output"] == GREETING
    for url in [*network.host_urls, *HOST_LOOPBACK]:
        tried = attacker.run(fetch(url, timeout=3))
        assert tried["exit_code"] != 0 and "loopback service" not in tried["output"], (who, url, tried)
    removed = attacker.run(f"PATH=$PATH:/usr/sbin:/sbin ip route del unreachable {OTHER_ADDRESS} 2>&1")
    assert removed["exit_code"] != 0 and "Operation not permitted" in removed["output"], removed
    described = attacker.step(describe=True)
    assert "host's addresses" in described["network note"], described["network note"]
    attacker.close()


def test_a_box_started_with_network_on_turns_it_off_as_a_plain_user_too(attacker_factory, home: Path, network,
                                                                        who: str):
    """Network on at start is the same pasta, joined once the box exists (a plain user's pasta no longer
    wraps bubblewrap), so it can be turned off while the box runs."""
    attacker = attacker_factory(outer=tuple(network.in_client([])))
    attacker.start(home / "project", network=True)
    assert attacker.step(describe=True)["network"] == "outbound"
    assert attacker.run(fetch(network.url + "hello.txt"))["output"] == GREETING
    assert attacker.step(network=False)["said"].startswith("none")
    assert attacker.run(fetch(network.url + "hello.txt"))["exit_code"] != 0
    attacker.close()
    assert network.processes_in_client("pasta") == []
