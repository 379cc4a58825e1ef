"""`owsandbox install --enterprise-gateway swarm` and `owsandbox gateway-swarm`, without a swarm.

The spec's content and its refusals, the `docker service create` line, and the launcher's handling of
the service's output and task state with a stand-in docker client (a shell script recording its calls:
no Docker runs in these tests). The real swarm, with the real gateway, is driven in
tests/test_enterprise_gateway_swarm.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from owsandbox import kernelspec
from owsandbox.kernelspec import gateway, gateway_launcher, gateway_swarm

SWARM_PROXY = "enterprise_gateway.services.processproxies.docker_swarm.DockerSwarmProcessProxy"


@pytest.fixture
def prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "prefix" / "share" / "jupyter"))
    return tmp_path / "prefix"


@pytest.fixture
def docker_client(tmp_path: Path) -> str:
    client = tmp_path / "bin" / "docker"
    client.parent.mkdir()
    client.write_text("#!/bin/sh\n")
    client.chmod(0o755)
    return str(client)


@pytest.mark.unit
def test_the_swarm_spec_pins_image_and_client_and_makes_the_container_the_sandbox(prefix: Path,
                                                                                   docker_client: str) -> None:
    assert kernelspec.main(["install", "--enterprise-gateway", "swarm", "--image", "registry.lab/owsbx:2",
                            "--docker", docker_client, "--prefix", str(prefix), "--name", "egs",
                            "--launch-timeout", "120"]) == 0
    spec = json.loads((prefix / "share/jupyter/kernels/egs/kernel.json").read_text())
    assert spec["metadata"]["process_proxy"] == {"class_name": SWARM_PROXY,
                                                 "config": {"image_name": "registry.lab/owsbx:2"}}
    command = Path(sys.executable).parent / "owsandbox"
    assert spec["argv"][:6] == [str(command), "gateway-swarm", "--image", "registry.lab/owsbx:2",
                                "--docker", docker_client]
    assert spec["argv"][6:] == gateway.LAUNCHER_ARGS
    assert spec["env"] == {"OWSANDBOX_PROVIDER": "local", "KERNEL_LAUNCH_TIMEOUT": "120"}
    facts = spec["metadata"]["owsandbox"]
    assert facts["enterprise_gateway"] == "swarm" and facts["sandbox"] == "the container (a swarm service's task)"


@pytest.mark.unit
@pytest.mark.parametrize(("argv", "said"), [
    (["--enterprise-gateway", "swarm"], "--enterprise-gateway swarm needs --image IMG"),
    (["--enterprise-gateway", "swarm", "--image", "Bad Image"], "is not an image reference"),
    (["--enterprise-gateway", "swarm", "--image", "i", "--provider", "bwrap"],
     "cannot give it the unmasked /proc"),
    (["--enterprise-gateway", "swarm", "--image", "i", "--provider", "container"], "cannot run in a swarm service"),
    (["--enterprise-gateway", "swarm", "--image", "i", "--engine", "docker"], "--engine is the container"),
    (["--enterprise-gateway", "swarm", "--image", "i", "--hosts", "a"], "--hosts is for --enterprise-gateway ssh"),
    (["--enterprise-gateway", "swarm", "--image", "i", "--docker", "/nonexistent/docker"], "not an executable"),
    (["--enterprise-gateway", "swarm", "--image", "i", "--launch-timeout", "5"], "whole seconds from 10"),
    (["--enterprise-gateway", "ssh", "--hosts", "a", "--docker", "/bin/true"], "--docker is for"),
])
def test_wrong_swarm_options_are_refused_by_name(prefix: Path, capsys: pytest.CaptureFixture[str],
                                                 argv: list[str], said: str) -> None:
    assert kernelspec.main(["install", *argv, "--prefix", str(prefix)]) == 2
    assert said in capsys.readouterr().err
    assert not (prefix / "share/jupyter/kernels/owsandbox").exists()


LAUNCHER = ["--RemoteProcessProxy.kernel-id", "0b1c", "--RemoteProcessProxy.response-address", "192.0.2.250:8877",
            "--RemoteProcessProxy.public-key", "AAAA", "--RemoteProcessProxy.port-range", "0..0"]


def swarm_args() -> tuple[Any, list[str]]:
    return gateway_swarm.parse(["--image", "owsbx:1", "--docker", "/usr/bin/docker", *LAUNCHER])


@pytest.mark.unit
def test_the_service_is_one_labelled_task_on_the_gateways_network_without_capabilities() -> None:
    args, rest = swarm_args()
    env = {"OWSANDBOX_PROVIDER": "local", "EG_DOCKER_NETWORK": "kernels", "KERNEL_UID": "1001", "KERNEL_GID": "100",
           "KERNEL_USERNAME": "ada", "PATH": "/usr/bin", "EG_AUTH_TOKEN": "secret", "DOCKER_HOST": "unix:///d.sock"}
    line = gateway_swarm.service_argv(args, rest, env, "0b1c")
    assert line[:7] == ["/usr/bin/docker", "service", "create", "--detach", "--quiet", "--name", "owsandbox-0b1c"]
    joined = " ".join(line)
    for label in ("kernel_id=0b1c", "component=kernel", "app=enterprise-gateway"):  # the proxy finds it by these
        assert f"--label {label} --container-label {label}" in joined
    assert ("--network kernels --endpoint-mode dnsrr --restart-condition none --init --user 1001:100 --cap-drop ALL"
            in joined)
    names = [line[i + 1] for i, word in enumerate(line) if word == "--env"]
    assert names == ["KERNEL_GID", "KERNEL_UID", "KERNEL_USERNAME", "OWSANDBOX_PROVIDER"]  # not the gateway's own
    assert line[-len(rest) - 4:] == ["owsbx:1", "owsandbox", "gateway-kernel", *rest, "--container-proxy"]


@pytest.mark.unit
@pytest.mark.parametrize(("env", "said"), [
    ({"OWSANDBOX_PROVIDER": "bwrap"}, "cannot nest bubblewrap"),
    ({}, "the spec's provider is auto"),
    ({"OWSANDBOX_PROVIDER": "local", "KERNEL_UID": "0"}, "does not run as root"),
    ({"OWSANDBOX_PROVIDER": "local", "KERNEL_GID": "users"}, "is not a number"),
    ({"OWSANDBOX_PROVIDER": "local", "KERNEL_IMAGE": "other:1"}, "runs only its own image"),
])
def test_a_service_the_spec_does_not_allow_is_refused(env: dict[str, str], said: str) -> None:
    args, rest = swarm_args()
    with pytest.raises(gateway_launcher.LaunchError, match=said):
        gateway_swarm.service_argv(args, rest, env, "0b1c")


@pytest.mark.unit
@pytest.mark.parametrize(("described", "said"), [
    ("local bridge\n", "'bridge' is a local-scoped bridge network"),
    ("swarm bridge\n", "'bridge' is a swarm-scoped bridge network"),
    ("", "is ''"),
])
def test_only_an_overlay_network_is_taken(described: str, said: str) -> None:
    gateway_swarm.check_network("kernels", "swarm overlay\n")
    with pytest.raises(gateway_launcher.LaunchError, match=said.replace("'bridge'", "'kernels'")):
        gateway_swarm.check_network("kernels", described)


@pytest.mark.unit
def test_a_swarm_spec_under_the_plain_docker_proxy_is_refused() -> None:
    gateway_swarm.check_mode({"EG_DOCKER_MODE": "swarm"})
    gateway_swarm.check_mode({})
    with pytest.raises(gateway_launcher.LaunchError, match="--enterprise-gateway docker"):
        gateway_swarm.check_mode({"EG_DOCKER_MODE": "docker"})


FAKE_DOCKER = """#!/bin/sh
# docker as gateway-swarm uses it: network inspect, service create|logs|ps|rm; $LOGS is what `logs` says,
# $STATE the task's state, $NETWORK what `network inspect` says; with $REFUSE, `service create` fails
echo "$@" >> "$CALLS"
case "$1 $2" in
    "network inspect") printf "$NETWORK" ;;
    "service create") echo "image owsbx:1 could not be accessed on a registry" >&2; [ -n "$REFUSE" ] && exit 1
                      echo svc0123 ;;
    "service logs") printf "$LOGS"; exec sleep 60 ;;
    "service ps") printf "$STATE\\t$ERROR\\n" ;;
esac
"""


def launch_swarm(tmp_path: Path, logs: str, state: str = "Running 1 second ago", error: str = "",
                 network: str = "swarm overlay\\n", **env: str) -> tuple[int, str, list[str]]:
    client = tmp_path / "docker"
    client.write_text(FAKE_DOCKER)
    client.chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    argv = ["--image", "owsbx:1", "--docker", str(client), *LAUNCHER]
    code = ("import sys; from owsandbox.kernelspec.gateway_swarm import launch; "
            f"sys.exit(launch({argv!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "LOGS": logs, "CALLS": str(calls), "STATE": state,
                               "ERROR": error, "NETWORK": network, "OWSANDBOX_PROVIDER": "local",
                               "EG_DOCKER_NETWORK": "kernels", "EG_DOCKER_MODE": "swarm", **env})
    return done.returncode, done.stderr, calls.read_text().splitlines()


def test_the_swarm_launcher_returns_once_the_kernel_has_answered(tmp_path: Path) -> None:
    status, said, calls = launch_swarm(tmp_path, f"starting\\nowsandbox gateway-kernel: kernel 0b1c "
                                                 f"{gateway_launcher.READY}; it listens on ...\\n")
    assert status == 0 and "starting" in said and gateway_launcher.READY in said, said
    assert "provider local: the service's container is the kernel's sandbox" in said, said
    assert "could not be accessed on a registry" in said  # Docker's warnings reach the gateway's log
    assert calls[0] == "network inspect --format {{.Scope}} {{.Driver}} kernels"
    assert calls[1].startswith("service create --detach --quiet --name owsandbox-0b1c")
    assert "service logs --follow --raw owsandbox-0b1c" in calls
    assert not any(call.startswith("service rm") for call in calls)


def test_the_swarm_launcher_reports_a_task_that_ended_and_removes_its_service(tmp_path: Path) -> None:
    status, said, calls = launch_swarm(tmp_path, "owsandbox gateway-kernel: error: the workspace would be /\\n",
                                       state="Failed 1 second ago", error="task: non-zero exit (2)")
    assert status == 2 and "the workspace would be /" in said, said
    assert ("the kernel's service ended (its task is failed: task: non-zero exit (2)) before its kernel answered "
            "the gateway") in said, said
    assert calls[-1] == "service rm owsandbox-0b1c"


def test_a_failing_service_create_is_named_with_dockers_words(tmp_path: Path) -> None:
    status, said, calls = launch_swarm(tmp_path, "", REFUSE="1")
    assert status == 2, said
    assert "docker service create failed (status 1): image owsbx:1 could not be accessed on a registry" in said, said
    assert not any(call.startswith(("service logs", "service rm")) for call in calls), calls


def test_the_swarm_launcher_leaves_a_silent_task_to_the_gateways_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    status, said, calls = launch_swarm(tmp_path, "", KERNEL_LAUNCH_TIMEOUT="1")
    assert status == 0 and time.monotonic() - started < 20, said
    assert not any(call.startswith("service rm") for call in calls)


@pytest.mark.parametrize(("network", "env", "said"), [
    ("local bridge\\n", {}, "EG_DOCKER_NETWORK 'kernels' is a local-scoped bridge network"),
    ("swarm overlay\\n", {"EG_DOCKER_MODE": "docker"}, "this kernelspec is for the gateway's DockerSwarmProcessProxy"),
])
def test_the_swarm_launcher_refuses_before_creating_anything(tmp_path: Path, network: str, env: dict[str, str],
                                                              said: str) -> None:
    status, message, calls = launch_swarm(tmp_path, "", network=network, **env)
    assert status == 2 and said in message, message
    assert not any(call.startswith("service create") for call in calls), calls


def test_a_container_proxys_kernel_outlives_the_watch_that_ends_an_unreached_one(tmp_path: Path) -> None:
    """The gateway's container proxies never come to the signal port but to interrupt (their liveness poll
    asks Docker), so a kernel in their container must not end as an unreached one does: two launchers
    answer a stand-in gateway that never connects, alike but for `--container-proxy`; once the plain one
    has ended itself, the other still runs."""
    import os
    import socket

    from Cryptodome.PublicKey import RSA

    public = "".join(RSA.generate(1024).publickey().export_key("PEM").decode().splitlines()[1:-1])
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KERNEL_", "OWSANDBOX_"))}
    launchers: list[subprocess.Popen[str]] = []
    with socket.socket() as gateway:
        gateway.bind(("127.0.0.1", 0))
        gateway.listen(2)
        try:
            gateway.settimeout(60)
            # the contained one first, and answered before the plain one starts: without --container-proxy
            # its watch would end it before the plain one's
            for number, extra in enumerate((["--container-proxy"], [])):
                launchers.append(subprocess.Popen(
                    [str(Path(sys.executable).parent / "owsandbox"), "gateway-kernel", "--RemoteProcessProxy.kernel-id",
                     f"0c6e4f1a-9d2b-4b7e-8a35-1f2d3c4b5a6{number}", "--RemoteProcessProxy.response-address",
                     f"127.0.0.1:{gateway.getsockname()[1]}", "--RemoteProcessProxy.public-key", public, *extra],
                    cwd=tmp_path, env={**base, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
                                       "OWSANDBOX_PROVIDER": "local", "KERNEL_LAUNCH_TIMEOUT": "2"},
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True))
                answer, _ = gateway.accept()
                with answer:  # the answer, which this stand-in never acts on
                    answer.settimeout(30)
                    while answer.recv(65536):
                        pass
            contained, plain = launchers
            assert plain.wait(90) == gateway_launcher.UNREACHED_STATUS
            assert contained.poll() is None, contained.stderr.read() if contained.stderr else ""
        finally:
            for launcher in launchers:
                if launcher.poll() is None:
                    os.killpg(launcher.pid, 9)
                launcher.wait()
    said = launchers[0].stderr.read() if launchers[0].stderr else ""
    assert "no watch for an unreached kernel" in said, said
