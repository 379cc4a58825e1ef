"""The opensandbox provider against OpenSandbox's real server (`opensandbox-server` from PyPI), with its
Docker runtime on the tests' own dockerd, through the real SDK and the real kernel (jupyter_client).

What is real: the server (FastAPI, its auth, its validation, its sqlite store, its Docker runtime
copying `/execd` and `/bootstrap.sh` out of the execd image into each sandbox and starting it with
`/opt/opensandbox/bootstrap.sh`, its expiry labels, its delete), Docker, the sandbox image (Debian with
python3), the SDK, the kernel. What is not: execd itself. OpenSandbox's execd is a Go program that no
package registry carries, so the execd image made here (tests/opensandbox_server.py) serves the
project's own execd-compatible endpoint as a released execd behaves; running the real Go execd stays a
check by hand (docs/how-to/opensandbox.md says how).

The network, in most tests, is Docker's host mode: the tests' dockerd has no bridge, no firewall rules
and no userland proxy, and the endpoint is execd itself, `127.0.0.1:44772`.
`test_bridge_mode_here_gives_an_endpoint_nothing_answers_at_and_the_sandbox_is_deleted` shows what
bridge mode does on that dockerd. Bridge mode for real (the server's default: an endpoint that is execd
proxying to itself, `127.0.0.1:PUBLISHED/proxy/44772`) runs on a second dockerd, in a network
namespace of its own with a bridge and ports published by docker-proxy, with the server and the kernel
in that namespace too (`test_bridge_mode_a_kernel_...`): that dockerd stands in for a host's Docker,
and neither this machine's firewall nor the namespace's gets a rule (iptables-save, before and after).
The execd image's execd plays execd's own reverse proxy (`/proxy/{port}`, tests/released_execd.py
`ProxyingExecd`).

What only the lifecycle stand-in (tests/test_provider_opensandbox_lifecycle.py) covers, since this
server cannot be made to do it within a test: timeouts under its 60 s minimum (renewal on its own
clock and expiry within seconds), a sandbox deleted behind a kernel's back found by a renewal, a
sandbox stuck Pending or ending Failed, and the spec's refusals of malformed requests.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from owsandbox.host.providers import resolve
from owsandbox.host.providers.boxed import BoxError
from owsandbox.host.providers.opensandbox_lifecycle import OpenSandboxLifecycleProvider
from owsandbox.host.workspace import RunnerWorkspace

from .conftest import DEFAULT_KERNEL_NAME
from .containers import MARKER
from .kernel_session import KernelSession
from .opensandbox_server import BOOTSTRAP, EXECD_PORT, OpenSandboxServer, build_execd_image, require_server
from .waiting import patience

# In host mode the server's sandboxes listen on this machine's port 44772, so one such server runs at a
# time on a machine: a second test run waits for the first one's module to end (a lock file), inside its
# own first test's timeout (three minutes and more with two runs at once). The timeout is a hang guard.
pytestmark = [pytest.mark.system, pytest.mark.needs("opensandbox-server"), pytest.mark.timeout(900)]

ENGINE = Path(__file__).resolve().parents[1] / "notebooks" / "engines" / "echo_engine.py"
SETTINGS = ("OWSANDBOX_EXECD_URL", "OWSANDBOX_EXECD_TOKEN", "OWSANDBOX_EXECD_HEADERS", "OWSANDBOX_IMAGE",
            "OWSANDBOX_LIMITS", "OWSANDBOX_OPENSANDBOX_SERVER", "OWSANDBOX_OPENSANDBOX_API_KEY",
            "OWSANDBOX_OPENSANDBOX_TIMEOUT", "OWSANDBOX_OPENSANDBOX_READY_TIMEOUT", "OPEN_SANDBOX_API_KEY",
            "OPEN_SANDBOX_DOMAIN", "OWSANDBOX_OPENSANDBOX_SERVER_PROXY")


@pytest.fixture(scope="module")
def execd_image(docker) -> str:
    return build_execd_image(docker)


@pytest.fixture(scope="module")
def server(docker, execd_image: str) -> Iterator[OpenSandboxServer]:
    """OpenSandbox's server on the tests' dockerd, host network mode; its sandboxes removed at the end."""
    program = require_server()
    with OpenSandboxServer.started(program, docker, execd_image) as started:
        yield started


@pytest.fixture
def image(docker) -> str:
    return docker.image()


@pytest.fixture(autouse=True)
def no_outside_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings of the machine that runs the tests must not leak into the providers made here."""
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def no_sandbox_left(server: OpenSandboxServer) -> Iterator[None]:
    """Each test starts with no sandbox, and ends having deleted (or left to this check) the ones it made;
    one it left is removed after it fails, so that the next test does not fail for it too."""
    assert server.containers() == []
    yield
    left = server.containers()
    if left:
        server.docker.run("rm", "--force", *(c["Id"] for c in left), check=False)
    assert not left, "a sandbox was left behind"


def api(server: OpenSandboxServer, method: str, path: str, key: str | None = None) -> tuple[int, Any]:
    """A request to the server's lifecycle API made by hand (not the SDK): its status and JSON answer."""
    status, text = server.request(method, path, headers={"OPEN-SANDBOX-API-KEY": key or server.api_key})
    return status, json.loads(text) if text else None


def kernel_on(folder: Path, server: OpenSandboxServer, image: str, **env: str) -> KernelSession:
    settings = {"OWSANDBOX_PROVIDER": "opensandbox", "OWSANDBOX_OPENSANDBOX_SERVER": server.url,
                "OWSANDBOX_OPENSANDBOX_API_KEY": server.api_key, "OWSANDBOX_IMAGE": image, **env}
    return KernelSession(folder, kernel_name=DEFAULT_KERNEL_NAME, env=settings)


def provider(server: OpenSandboxServer, image: str, **options: Any) -> OpenSandboxLifecycleProvider:
    made = resolve("opensandbox")(**{"server": server.url, "api_key": server.api_key, "image": image, "cwd": "/",
                                     **options})
    assert isinstance(made, OpenSandboxLifecycleProvider)
    return made


def running_sandboxes(server: OpenSandboxServer) -> list[dict[str, Any]]:
    status, listed = api(server, "GET", "/v1/sandboxes?state=Running")
    assert status == 200, listed
    return listed["items"]


# -- through the kernel ------------------------------------------------------------------------------


def attach_echo_engine(kernel: Any, text: str) -> None:
    """%attach: the echo engine in the sandbox answers one %send, and is killed."""
    engine = base64.b64encode(ENGINE.read_bytes()).decode()
    assert kernel.run(f"echo {engine} | base64 -d > /tmp/echo_engine.py").status == "ok"
    started = kernel.run("%attach -- python3 /tmp/echo_engine.py")
    assert started.status == "ok", started.outputs
    answer = kernel.run("%send " + json.dumps({"id": 1, "type": "echo", "text": text}))
    assert answer.of_type("display_data")[0]["data"]["application/json"]["text"] == text
    assert kernel.run("%attach --kill").status == "ok"


def stop_keeps_the_shell(kernel: Any) -> None:
    """Stop: the command in the sandbox ends, its shell and variables stay."""
    assert kernel.run("export BEFORE=1").status == "ok"
    stopped = kernel.send("echo started; sleep 60")
    kernel.wait_for(lambda m: m["parent_header"].get("msg_id") == stopped and m["msg_type"] == "stream"
                    and "started" in m["content"]["text"], what="the command's first line")
    kernel.km.interrupt_kernel()
    run = kernel.collect(stopped)
    assert run.status == "error" and run.reply["content"]["ename"] == "Interrupted"
    assert kernel.run("echo $BEFORE").text() == "1\n"


def test_a_kernel_creates_a_sandbox_attaches_stops_restarts_into_it_and_deletes_it(server, image, no_sandbox_left,
                                                                                  tmp_path):
    kernel = kernel_on(tmp_path, server, image, OWSANDBOX_LIMITS="memory=768M,cpu=1.5")
    try:
        # the first cell waits for the server to make the sandbox (a container start, slow on a busy machine)
        first = kernel.run(f"cat {MARKER}; echo $HOME", timeout=patience(60))
        assert first.status == "ok", first.outputs
        assert first.text() == f"{image}\n/root\n"  # the sandbox image's files, not this machine's
        [made] = running_sandboxes(server)
        assert made["image"]["uri"] == image and made["metadata"]["owsandbox.key"].startswith("kernel-")
        assert f"[sandbox: OpenSandbox sandbox {made['id']} · server {server.url} · image {image}" in first.notes()
        # the server's Docker runtime made it: its bootstrap as the entrypoint, our entrypoint after it,
        # the kernel's limits as Docker's, the host's network
        [container] = server.containers()
        assert container["Config"]["Labels"]["opensandbox.io/id"] == made["id"]
        assert container["Config"]["Entrypoint"] == ["/opt/opensandbox/bootstrap.sh"]
        assert container["Config"]["Cmd"] == ["tail", "-f", "/dev/null"]
        assert container["HostConfig"]["Memory"] == 768 << 20 and container["HostConfig"]["NanoCpus"] == 1_500_000_000
        assert container["HostConfig"]["NetworkMode"] == "host"
        table = kernel.run("%sandbox --all").of_type("display_data")[0]["data"]["text/plain"]
        for shown in (server.url, made["id"], f"http://127.0.0.1:{EXECD_PORT}", "this kernel"):
            assert shown in table, (shown, table)

        # %attach: a program in the sandbox, through the endpoint the server gave (execd itself)
        attach_echo_engine(kernel, "through the real server")

        # Stop: the command in the sandbox ends, its shell stays
        assert kernel.run("echo kept > /tmp/kept.txt").status == "ok"
        stop_keeps_the_shell(kernel)

        # a restart finds the sandbox by its labels and reuses it, with the daemon that lingered in it
        daemon = kernel.run("echo $PPID").text()
        kernel.restart(now=False)
        again = kernel.run("echo [$BEFORE]; cat /tmp/kept.txt")
        assert again.status == "ok", again.outputs
        assert again.text() == "[]\nkept\n"  # fresh shells, the same sandbox
        assert [s["id"] for s in running_sandboxes(server)] == [made["id"]]
        assert kernel.run("echo $PPID").text() == daemon
        assert "an earlier kernel with this key (reused)" in \
            kernel.run("%sandbox --all").of_type("display_data")[0]["data"]["text/plain"]
    finally:
        kernel.close()
    # shutdown deleted it: gone from the server and from Docker
    assert api(server, "GET", f"/v1/sandboxes/{made['id']}")[0] == 404, kernel.shutdown
    assert server.containers() == [], kernel.shutdown


def test_a_kernel_reaches_its_sandbox_through_the_servers_proxy(server, image, no_sandbox_left, tmp_path):
    """OWSANDBOX_OPENSANDBOX_SERVER_PROXY=1: every request to execd, the pipes' WebSockets and %attach's
    included, goes through the server's own proxy (`/v1/sandboxes/{id}/proxy/44772/...`)."""
    kernel = kernel_on(tmp_path, server, image, OWSANDBOX_OPENSANDBOX_SERVER_PROXY="1")
    try:
        first = kernel.run("echo through the proxy")
        assert first.status == "ok", first.outputs
        assert first.text() == "through the proxy\n"
        [made] = running_sandboxes(server)
        proxy = f"/v1/sandboxes/{made['id']}/proxy/{EXECD_PORT}"
        table = kernel.run("%sandbox --all").of_type("display_data")[0]["data"]["text/plain"]
        assert f"{server.url}{proxy} (the server's proxy)" in table, table
        engine = base64.b64encode(ENGINE.read_bytes()).decode()
        assert kernel.run(f"echo {engine} | base64 -d > /tmp/echo_engine.py").status == "ok"
        started = kernel.run("%attach -- python3 /tmp/echo_engine.py")
        assert started.status == "ok", started.outputs
        answer = kernel.run('%send {"id": 1, "type": "echo", "text": "proxied"}')
        assert answer.of_type("display_data")[0]["data"]["application/json"]["text"] == "proxied"
        killed = kernel.run("%attach --kill")  # a DELETE through the proxy, which streams its body on
        assert killed.status == "ok", killed.outputs
    finally:
        kernel.close()
    log = server.full_log()
    assert f'"POST {proxy}/pty HTTP/1.1" 201' in log and f'"WebSocket {proxy}/pty/' in log
    deletes = [line for line in log.splitlines() if f'"DELETE {proxy}/pty/' in line]
    assert deletes and all(line.endswith(" 200") or line.endswith(" 204") for line in deletes), deletes
    assert f'"GET /v1/sandboxes/{made["id"]}/endpoints/{EXECD_PORT}?use_server_proxy=true' in log


# -- the provider on its own -------------------------------------------------------------------------

def test_a_renewal_moves_the_expiry_the_server_keeps(server, image, no_sandbox_left):
    made = provider(server, image, sandbox_timeout=120)
    workspace = RunnerWorkspace(made, "/")
    try:
        assert workspace.executor.run("echo ok")["output"] == "ok\n"
        status, before = api(server, "GET", f"/v1/sandboxes/{made.sandbox_id}")
        assert status == 200
        made._renew()  # what the renewal thread does every third of the timeout (40 s here)
        status, after = api(server, "GET", f"/v1/sandboxes/{made.sandbox_id}")
        moved_to = datetime.fromisoformat(after["expiresAt"].replace("Z", "+00:00"))
        assert moved_to > datetime.fromisoformat(before["expiresAt"].replace("Z", "+00:00"))
        assert made.expires_at == moved_to and made.renewals == 1
    finally:
        workspace.close()
    assert made.delete_seconds is not None and server.containers() == []


def test_a_wrong_api_key_is_the_servers_refusal_named(server, image, no_sandbox_left):
    with pytest.raises(BoxError, match=r"refused the API key from OWSANDBOX_OPENSANDBOX_API_KEY when asked to list its "
                                       r"sandboxes \(401 .*\): set OWSANDBOX_OPENSANDBOX_API_KEY") as err:
        provider(server, image, api_key="not-the-key").create()
    assert "not-the-key" not in str(err.value)


def test_an_image_the_server_cannot_pull_is_named(server, no_sandbox_left):
    nowhere = "127.0.0.1:1/nowhere/none:1"  # a registry on a closed port of this machine
    with pytest.raises(BoxError, match=rf"could not create a sandbox from the image {nowhere} \(500 .*\): "
                                       r"is OWSANDBOX_IMAGE an image the server can pull\?"):
        provider(server, nowhere).create()


def test_an_image_without_python3_is_named_and_its_sandbox_deleted(server, docker, no_sandbox_left):
    """The sandbox runs, but execd (python3 here) cannot start in it: nothing answers at its endpoint
    (tried until the ready timeout, as an execd may start listening a moment after its sandbox runs)."""
    made = provider(server, docker.no_python_image(), ready_timeout=3)
    with pytest.raises(BoxError, match=rf"cannot use the OpenSandbox execd at http://127.0.0.1:{EXECD_PORT}"):
        made.create()
    assert server.containers() == []  # made by this provider, so deleted when it could not be used


def other_server(server: OpenSandboxServer, execd_image: str, network_mode: str = "host") -> OpenSandboxServer:
    """A second server on the same dockerd (not started), while the module's has no sandbox."""
    return OpenSandboxServer(server.program, server.docker, execd_image, network_mode)


def test_an_execd_that_listens_after_its_sandbox_runs_is_waited_for(server, image, no_sandbox_left):
    """The server calls a sandbox Running once its first process runs; execd, which that process
    starts, may listen later (a Python one here takes a moment; the bootstrap below takes a second more)."""
    late = BOOTSTRAP.replace("/opt/opensandbox/execd >", "{ sleep 1; exec /opt/opensandbox/execd; } >")
    assert late != BOOTSTRAP
    slow = other_server(server, build_execd_image(server.docker, late))
    try:
        slow.start()
        made = provider(slow, image)
        workspace = RunnerWorkspace(made, "/")
        try:
            assert workspace.executor.run("echo late")["output"] == "late\n"
        finally:
            workspace.close()
        assert slow.containers() == []
    finally:
        slow.stop()


def test_bridge_mode_here_gives_an_endpoint_nothing_answers_at_and_the_sandbox_is_deleted(server, image, docker,
                                                                                         execd_image):
    """The server's default network mode on the tests' plain dockerd (`--bridge=none`, as a host whose
    Docker has no bridge network): Docker still makes the container, in a network namespace of its own
    with no interface, and publishes none of its ports,
    so the endpoint the server gives (`127.0.0.1:PORT/proxy/44772`, execd proxying to itself) has
    nothing behind it. The provider names that endpoint, and deletes the sandbox it made."""
    bridged = other_server(server, execd_image, "bridge")
    try:
        bridged.start()
        with pytest.raises(BoxError, match=r"cannot use the OpenSandbox execd at http://127\.0\.0\.1:\d+/proxy/44772: "
                                           r"cannot reach execd .*Connection refused"):
            provider(bridged, image, ready_timeout=3).create()  # execd is waited for until then
        assert bridged.containers() == []
    finally:
        bridged.stop()


# -- bridge mode, on a dockerd in a network namespace of its own ---------------------------------------

BRIDGE = "203.0.113.1/24"  # TEST-NET-3, on the bridge in that namespace only


# Podman's netavark writes its rules (chains named NETAVARK...) into this machine's firewall while a
# container of its default network lives: another test's (another worker's, another run's), never one of
# this module's, whose dockerd starts in a namespace of its own. They come and go without this module.
OTHERS_RULES = "NETAVARK"


def firewall(netns: str | None = None) -> list[str]:
    """The iptables and ip6tables rules and chains of this machine (of `netns` when given), without
    iptables-save's comments (they carry the time) and without podman's rules for other tests' containers."""
    tools = [shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin") for tool in ("iptables-save",
                                                                                         "ip6tables-save")]
    if None in tools:
        pytest.fail("iptables-save is needed to show that the firewall stays as it was (apt-get install iptables)")
    prefix = [shutil.which("nsenter") or "nsenter", f"--net=/run/netns/{netns}"] if netns else []
    lines = []
    for tool in tools:
        done = subprocess.run([*prefix, str(tool)], capture_output=True, text=True, timeout=30, check=True)
        lines += [line for line in done.stdout.splitlines() if meaningful(line) and OTHERS_RULES not in line]
    return lines


def meaningful(line: str) -> bool:
    """A rule, a chain of someone's own, or a built-in chain's policy other than ACCEPT: what a change of
    the firewall consists of. A table's header and its built-in chains with their ACCEPT policy show up in
    iptables-save once any rule of that table was ever loaded (podman's for another test, say)."""
    if line.startswith("-A"):
        return True
    if line.startswith(":"):
        return line.split()[1] != "ACCEPT"  # ":NAME - [0:0]" for a chain of its own, ":INPUT DROP [..]"
    return False


@pytest.fixture(scope="module")
def host_firewall() -> list[str]:
    """This machine's firewall before the bridged dockerd starts."""
    return firewall()


@pytest.fixture(scope="module")
def bridged_docker(podman, host_firewall: list[str]) -> Iterator[Any]:
    """The tests' dockerd in a network namespace of its own with a bridge and ports published by
    docker-proxy (tests/containers.py), standing in for a host's Docker; no iptables rule anywhere."""
    from .containers import Docker, require_docker

    require_docker()
    with Docker.started(podman, bridge=BRIDGE, publish=True) as started:
        yield started


@pytest.fixture(scope="module")
def bridged_server(bridged_docker) -> Iterator[OpenSandboxServer]:
    """OpenSandbox's server in bridge mode (its default), in the dockerd's network namespace."""
    program = require_server()
    with OpenSandboxServer.started(program, bridged_docker, build_execd_image(bridged_docker),
                                   network_mode="bridge") as started:
        assert started.netns is not None
        yield started


def kernel_in_netns(folder: Path, server: OpenSandboxServer, image: str, monkeypatch: pytest.MonkeyPatch,
                    **env: str) -> KernelSession:
    """A real kernel started in the server's network namespace (nsenter), where its endpoints are
    (`127.0.0.1` there), reached over IPC since the test's TCP is outside that namespace."""
    from owsandbox.kernelspec import kernel_argv

    name = "owsandbox-opensandbox-netns"
    spec = folder / "kernels" / name
    spec.mkdir(parents=True)
    nsenter = [shutil.which("nsenter") or "nsenter", f"--net=/run/netns/{server.netns}"]
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [*nsenter, *kernel_argv(sys.executable)],
        "display_name": "Sandbox (OpenSandbox, bridge)", "language": "bash", "interrupt_mode": "message", "env": {}}))
    monkeypatch.setenv("JUPYTER_PATH", f"{folder}{os.pathsep}{os.environ.get('JUPYTER_PATH', '')}")
    workspace = folder / "work"
    workspace.mkdir()
    settings = {"OWSANDBOX_PROVIDER": "opensandbox", "OWSANDBOX_OPENSANDBOX_SERVER": server.url,
                "OWSANDBOX_OPENSANDBOX_API_KEY": server.api_key, "OWSANDBOX_IMAGE": image, **env}
    return KernelSession(workspace, kernel_name=name, env=settings, transport="ipc", ip=str(folder / "kernel"))


def docker_proxies(netns: str) -> list[str]:
    """The command lines of the docker-proxy processes in `netns`."""
    inode = os.stat(f"/run/netns/{netns}").st_ino
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.stat(entry / "ns" / "net").st_ino == inode:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if argv and argv[0].endswith(b"docker-proxy"):
                    found.append(b" ".join(argv).decode())
        except OSError:
            continue
    return found


def test_bridge_mode_a_kernel_reaches_execd_through_its_own_proxy_on_the_published_port(
        bridged_server, bridged_docker, host_firewall, tmp_path, monkeypatch):
    """The server's default network mode, for real: the sandbox on Docker's bridge with execd's port
    published (docker-proxy, in the namespace), the endpoint `127.0.0.1:PUBLISHED/proxy/44772`, every
    request and WebSocket of the kernel's (its first cell, %attach, Stop) through execd's proxy to itself;
    shutdown deletes the sandbox. Neither this machine's firewall nor the namespace's gets a rule."""
    server = bridged_server
    image = bridged_docker.image()
    assert server.containers() == []
    kernel = kernel_in_netns(tmp_path, server, image, monkeypatch)
    try:
        first = kernel.run(f"cat {MARKER}")
        assert first.status == "ok", first.outputs
        assert first.text() == f"{image}\n"
        [made] = running_sandboxes(server)
        [container] = server.containers()
        assert container["Config"]["Labels"]["opensandbox.io/id"] == made["id"]
        assert container["HostConfig"]["NetworkMode"] == "bridge"
        assert container["NetworkSettings"]["Networks"]["bridge"]["IPAddress"].startswith("203.0.113.")
        [binding] = container["NetworkSettings"]["Ports"][f"{EXECD_PORT}/tcp"]
        published = binding["HostPort"]
        endpoint = f"http://127.0.0.1:{published}/proxy/{EXECD_PORT}"
        table = kernel.run("%sandbox --all").of_type("display_data")[0]["data"]["text/plain"]
        assert endpoint in table, table
        # published by docker-proxy in the namespace, with no rule in its tables or this machine's
        assert any(f"-host-port {published} " in proxy and f"-container-port {EXECD_PORT}" in proxy
                   for proxy in docker_proxies(str(server.netns))), docker_proxies(str(server.netns))
        assert not [line for line in firewall(server.netns) if line.startswith("-A")]
        assert firewall() == host_firewall

        attach_echo_engine(kernel, "through execd's proxy")

        stop_keeps_the_shell(kernel)
        # what came through execd's proxy, as the execd in the sandbox saw it: the pipes' sessions and
        # their WebSockets, %attach's session and its WebSocket
        proxied = bridged_docker.run("exec", container["Id"], "cat", "/tmp/execd.log").stdout.splitlines()
        sockets = [line for line in proxied if line.startswith("proxied GET /pty/") and "/ws" in line]
        assert any(line.startswith("proxied POST /pty") for line in proxied), proxied
        assert len(sockets) >= 2, proxied  # the kernel's pipe, and %attach's
    finally:
        kernel.close()
    assert api(server, "GET", f"/v1/sandboxes/{made['id']}")[0] == 404, kernel.shutdown
    assert server.containers() == [], kernel.shutdown
    assert firewall() == host_firewall
