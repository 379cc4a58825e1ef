"""`owsandbox install --enterprise-gateway ssh` and the launcher's own parts, without a gateway.

What the gateway itself does with them (ssh, the response address, signals) is driven for real in
tests/test_enterprise_gateway.py; here are the spec's content, the refusals, and the payload, which
is decrypted as the gateway's ResponseManager._decode_payload does (the same library, the same steps).
The payload tests are not `unit`: pycryptodomex finds its native library through ldconfig.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from owsandbox import kernelspec
from owsandbox.kernelspec import gateway, gateway_docker, gateway_launcher

PROXY = "enterprise_gateway.services.processproxies.distributed.DistributedProcessProxy"


@pytest.fixture
def prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "prefix" / "share" / "jupyter"))
    return tmp_path / "prefix"


@pytest.mark.unit
def test_the_spec_starts_owsandboxs_launcher_on_the_given_hosts(prefix: Path) -> None:
    assert kernelspec.main(["install", "--enterprise-gateway", "ssh", "--hosts", "h1.lab,10.0.0.7",
                            "--prefix", str(prefix), "--name", "eg", "--provider", "bwrap"]) == 0
    spec = json.loads((prefix / "share/jupyter/kernels/eg/kernel.json").read_text())
    assert spec["metadata"]["process_proxy"] == {"class_name": PROXY, "config": {"remote_hosts": "h1.lab,10.0.0.7"}}
    command = Path(sys.executable).parent / "owsandbox"
    assert spec["argv"] == [str(command), "gateway-kernel", "--RemoteProcessProxy.kernel-id", "{kernel_id}",
                            "--RemoteProcessProxy.response-address", "{response_address}",
                            "--RemoteProcessProxy.public-key", "{public_key}",
                            "--RemoteProcessProxy.port-range", "{port_range}"]
    assert all(shlex.quote(word) == word for word in spec["argv"] if "{" not in word)  # the gateway joins them
    assert spec["env"]["OWSANDBOX_PROVIDER"] == "bwrap" and spec["interrupt_mode"] == "message"
    assert spec["metadata"]["owsandbox"]["hosts"] == ["h1.lab", "10.0.0.7"]


@pytest.mark.unit
def test_the_spec_asks_the_gateway_for_the_launch_timeout_its_kernels_need(prefix: Path) -> None:
    """180 s unless told (the gateway's own default, 30 s, was too short for a class on a busy host),
    in the spec's env where the gateway takes it as the default a request may override, and never
    passed on into the sandbox's cells."""
    for extra, seconds in (([], "180"), (["--launch-timeout", "300"], "300")):
        assert kernelspec.main(["install", "--enterprise-gateway", "ssh", "--hosts", "h1", "--prefix", str(prefix),
                                "--name", "eg", "--env", "COURSE=maths", *extra]) == 0
        spec = json.loads((prefix / "share/jupyter/kernels/eg/kernel.json").read_text())
        assert spec["env"]["KERNEL_LAUNCH_TIMEOUT"] == seconds
        assert spec["metadata"]["owsandbox"]["launch_timeout"] == int(seconds)
        assert spec["env"]["OWSANDBOX_ENV"] == "COURSE"  # the cells get COURSE, not the gateway's variable
    assert gateway_launcher.launch_timeout({"KERNEL_LAUNCH_TIMEOUT": spec["env"]["KERNEL_LAUNCH_TIMEOUT"]}) == 300


@pytest.mark.unit
@pytest.mark.parametrize(("argv", "said"), [
    (["--launch-timeout", "60"], "--launch-timeout is for --enterprise-gateway"),
    (["--enterprise-gateway", "ssh", "--hosts", "a", "--launch-timeout", "5"], "whole seconds from 10 to 3600"),
    (["--enterprise-gateway", "ssh", "--hosts", "a", "--launch-timeout", "90.5"], "whole seconds from 10 to 3600"),
    (["--enterprise-gateway", "ssh", "--hosts", "a", "--launch-timeout", "7200"], "--launch-timeout 7200"),
])
def test_a_wrong_launch_timeout_is_refused_by_name(prefix: Path, capsys: pytest.CaptureFixture[str],
                                                   argv: list[str], said: str) -> None:
    assert kernelspec.main(["install", *argv, "--prefix", str(prefix)]) == 2
    assert said in capsys.readouterr().err
    assert not (prefix / "share/jupyter/kernels/owsandbox").exists()


@pytest.mark.unit
@pytest.mark.parametrize(("argv", "said"), [
    (["--enterprise-gateway", "ssh"], "needs --hosts"),
    (["--hosts", "a,b"], "--hosts is for --enterprise-gateway ssh"),
    (["--enterprise-gateway", "ssh", "--hosts", "a,,b"], "give the hosts"),
    (["--enterprise-gateway", "ssh", "--hosts", "a;reboot"], "'a;reboot' is not a host name"),
])
def test_wrong_gateway_options_are_refused_by_name(prefix: Path, capsys: pytest.CaptureFixture[str],
                                                   argv: list[str], said: str) -> None:
    assert kernelspec.main(["install", *argv, "--prefix", str(prefix)]) == 2
    assert said in capsys.readouterr().err
    assert not (prefix / "share/jupyter/kernels/owsandbox").exists()


@pytest.mark.unit
def test_a_python_without_the_owsandbox_command_beside_it_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no owsandbox command beside"):
        gateway.launcher_command(str(tmp_path / "python3"))
    spaced = tmp_path / "with space" / "bin"
    spaced.mkdir(parents=True)
    (spaced / "owsandbox").write_text("")
    with pytest.raises(ValueError, match="not one shell word"):
        gateway.launcher_command(str(spaced / "python3"))


@pytest.mark.unit
def test_the_launcher_takes_both_spellings_and_names_what_is_missing() -> None:
    args = gateway_launcher.parse(["--RemoteProcessProxy.kernel-id", "k1", "--response-address", "10.1.2.3:8877",
                                   "--RemoteProcessProxy.public-key", "AAAA", "--RemoteProcessProxy.port-range",
                                   "40000..41000", "--RemoteProcessProxy.spark-context-initialization-mode", "none"])
    assert (args.kernel_id, args.address, args.ports) == ("k1", ("10.1.2.3", 8877), (40000, 41000))
    with pytest.raises(gateway_launcher.LaunchError, match="response-address, --RemoteProcessProxy.public-key"):
        gateway_launcher.parse(["--kernel-id", "k1"])
    with pytest.raises(gateway_launcher.LaunchError, match="expected IP:PORT"):
        gateway_launcher.parse(["--kernel-id", "k", "--response-address", "nowhere", "--public-key", "A"])
    with pytest.raises(gateway_launcher.LaunchError, match="expected LOWER..UPPER"):
        gateway_launcher.port_range("41000..40000")
    assert gateway_launcher.port_range("0..0") == (0, 0) and gateway_launcher.port_range(None) == (0, 0)


def test_the_payload_opens_with_the_gateways_private_key_as_the_gateway_opens_it() -> None:
    from Cryptodome.Cipher import AES, PKCS1_v1_5
    from Cryptodome.PublicKey import RSA
    from Cryptodome.Util.Padding import unpad

    private = RSA.generate(1024)
    public = "".join(private.publickey().export_key("PEM").decode().splitlines()[1:-1])  # as the gateway sends it
    info = {"shell_port": 5001, "key": "k", "pid": 42, "comm_port": 6001, "kernel_id": "k1"}
    payload = json.loads(base64.b64decode(gateway_launcher.encrypted(info, public)))
    assert payload["version"] == 1
    aes_key = PKCS1_v1_5.new(private).decrypt(base64.b64decode(payload["key"]), b"\x42")
    opened = unpad(AES.new(aes_key, AES.MODE_ECB).decrypt(base64.b64decode(payload["conn_info"])), 16)
    assert json.loads(opened) == info


def test_a_key_that_is_not_rsa_is_refused() -> None:
    with pytest.raises(gateway_launcher.LaunchError, match="not an RSA public key"):
        gateway_launcher.encrypted({}, base64.b64encode(b"not a key").decode())


# -- the launcher's refusals, as a real process (no gateway: each refusal comes before it is answered) --


def run_launcher(tmp_path: Path, cwd: Path, env: dict[str, str], address: str = "") -> tuple[int, str, Path]:
    import os
    import subprocess

    from Cryptodome.PublicKey import RSA

    from .ports import free_port

    public = "".join(RSA.generate(1024).publickey().export_key("PEM").decode().splitlines()[1:-1])
    runtime = tmp_path / "runtime"
    kernel_id = "6a1f0d4e-2b7c-4e8a-9f31-0c5d7e9b2a44"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KERNEL_", "OWSANDBOX_"))}
    done = subprocess.run([str(Path(sys.executable).parent / "owsandbox"), "gateway-kernel",
                           "--RemoteProcessProxy.kernel-id", kernel_id,
                           "--RemoteProcessProxy.response-address", address or f"127.0.0.1:{free_port()}",
                           "--RemoteProcessProxy.public-key", public, "--RemoteProcessProxy.port-range", "0..0"],
                          cwd=cwd, env={**base, "JUPYTER_RUNTIME_DIR": str(runtime), **env},
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr, runtime / f"kernel-{kernel_id}.json"


def test_the_launcher_refuses_root_as_the_workspace(tmp_path: Path) -> None:
    status, said, connection = run_launcher(tmp_path, Path("/"), {"OWSANDBOX_PROVIDER": "local"})
    assert status == 2 and "the workspace would be /" in said, said
    assert not connection.exists()


def test_the_launcher_refuses_to_fall_back_to_no_isolation(tmp_path: Path) -> None:
    # no bwrap on PATH: what a host (or a container) without bubblewrap looks like to the kernel
    status, said, connection = run_launcher(tmp_path, tmp_path, {"PATH": str(tmp_path / "empty")})
    assert status == 2 and "no sandbox on this host: bubblewrap (bwrap) is not installed" in said, said
    assert not connection.exists()


def test_the_launcher_refuses_a_spec_whose_bubblewrap_cannot_work_here(tmp_path: Path) -> None:
    status, said, connection = run_launcher(tmp_path, tmp_path, {"PATH": str(tmp_path / "empty"),
                                                                 "OWSANDBOX_PROVIDER": "bwrap"})
    assert status == 2 and "the spec's provider is bwrap, and bubblewrap (bwrap) is not installed" in said, said
    assert not connection.exists()


def test_the_launcher_names_a_missing_working_dir(tmp_path: Path) -> None:
    status, said, _ = run_launcher(tmp_path, tmp_path, {"KERNEL_WORKING_DIR": str(tmp_path / "gone")})
    assert status == 2 and f"KERNEL_WORKING_DIR '{tmp_path / 'gone'}'" in said, said


def test_the_launcher_says_the_gateway_cannot_be_reached_and_leaves_no_connection_file(tmp_path: Path) -> None:
    status, said, connection = run_launcher(tmp_path, tmp_path, {"OWSANDBOX_PROVIDER": "local"})
    assert status == 2 and "the gateway's response address 127.0.0.1:" in said and "cannot be reached" in said, said
    assert not connection.exists() and connection.parent.is_dir()  # it was written, then removed


def test_the_kernel_listens_where_the_gateways_ssh_session_came_in() -> None:
    """A host with two addresses: the gateway connects to the one it named (`--hosts`), which is where its
    ssh session came in, not necessarily the source of this host's route back to the gateway."""
    gateway = ("127.0.0.1", 9)
    assert gateway_launcher.gateway_side_address(gateway, {"SSH_CONNECTION": "10.0.0.9 52000 127.0.0.2 22"}) \
        == "127.0.0.2"
    assert gateway_launcher.gateway_side_address(gateway, {}) == "127.0.0.1"  # no ssh: the route's source
    # not an address of this host (or not IPv4): the route's source, and the log says so
    for elsewhere in ("203.0.113.7", "fe80::1", "not-an-address"):
        assert gateway_launcher.gateway_side_address(
            gateway, {"SSH_CONNECTION": f"10.0.0.9 52000 {elsewhere} 22"}) == "127.0.0.1"
    assert gateway_launcher.launch_timeout({"KERNEL_LAUNCH_TIMEOUT": "120"}) == 120
    assert gateway_launcher.launch_timeout({"KERNEL_LAUNCH_TIMEOUT": "soon"}) == gateway_launcher.LAUNCH_TIMEOUT_SECONDS


@pytest.mark.parametrize("when", ["started", "starting"])
def test_a_kernel_the_gateway_never_reaches_ends_itself_with_its_sandbox(tmp_path: Path, when: str) -> None:
    """A stand-in for a gateway that takes the kernel's answer and never connects (its connection was
    refused, or it gave up): past the launch timeout the kernel ends, with its sandbox, and leaves no
    connection file. (The real gateway's side of it: tests/test_enterprise_gateway.py.)

    "starting": the timeout comes while the sandbox is still starting, as it did on a busy machine (the
    kernel then left without a box that came a moment later). The start is held, for certain, by
    stopping the kernel's relay to the box's daemon as soon as it appears, and let go once the kernel has
    said the gateway never came."""
    import os
    import signal
    import socket
    import subprocess

    from Cryptodome.PublicKey import RSA

    from .processes import wait_gone

    public = "".join(RSA.generate(1024).publickey().export_key("PEM").decode().splitlines()[1:-1])
    runtime = tmp_path / "runtime"
    kernel_id = "0c6e4f1a-9d2b-4b7e-8a35-1f2d3c4b5a69"
    said = ""
    with socket.socket() as gateway:
        gateway.bind(("127.0.0.1", 0))
        gateway.listen(1)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("KERNEL_", "OWSANDBOX_"))}
        launcher = subprocess.Popen(
            [str(Path(sys.executable).parent / "owsandbox"), "gateway-kernel", "--RemoteProcessProxy.kernel-id",
             kernel_id, "--RemoteProcessProxy.response-address", f"127.0.0.1:{gateway.getsockname()[1]}",
             "--RemoteProcessProxy.public-key", public, "--RemoteProcessProxy.port-range", "0..0"],
            cwd=tmp_path, env={**base, "JUPYTER_RUNTIME_DIR": str(runtime), "OWSANDBOX_PROVIDER": "local",
                               "KERNEL_LAUNCH_TIMEOUT": "2"},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            gateway.settimeout(60)
            answer, _ = gateway.accept()
            with answer:
                answer.settimeout(30)
                while answer.recv(65536):
                    pass  # the encrypted answer, which this stand-in never acts on
            if when == "starting":
                relay = _first_child(launcher.pid, " attach ")
                os.kill(relay, signal.SIGSTOP)
                said = _stderr_until(launcher, "did not reach this kernel")
                os.kill(relay, signal.SIGCONT)
            status = launcher.wait(90)
            said += launcher.stderr.read().decode(errors="replace") if launcher.stderr else ""
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, 9)
                launcher.wait()
    assert status == gateway_launcher.UNREACHED_STATUS, said
    assert "the gateway did not reach this kernel within 3 s" in said and "listened on 127.0.0.1" in said, said
    assert not (runtime / f"kernel-{kernel_id}.json").exists()
    daemons = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
               and _cmdline(p).count(str(tmp_path)) and "serve" in _cmdline(p)]
    assert wait_gone(daemons) == []  # the sandbox's daemon ended with it


def _first_child(pid: int, named: str, seconds: float = 60) -> int:
    """The first child of `pid` whose command line holds `named`, found within a few milliseconds of
    its start (each thread's children, not a scan of /proc)."""
    import os

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                kids = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for kid in kids:
                if named in _cmdline(Path(f"/proc/{kid}")):
                    return int(kid)
        time.sleep(0.002)
    raise AssertionError(f"no child of {pid} ran {named.strip()!r} within {seconds:g} s")


def _stderr_until(process: subprocess.Popen[bytes], text: str, seconds: float = 60) -> str:
    """What the process wrote on stderr up to and including `text`."""
    import os
    import select

    assert process.stderr is not None
    fd, got = process.stderr.fileno(), b""
    deadline = time.monotonic() + seconds
    while text.encode() not in got:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            raise AssertionError(f"the process did not say {text!r}: {got.decode(errors='replace')}")
        got += chunk
    return got.decode(errors="replace")


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# -- the Docker kind -------------------------------------------------------------------------------

ADMIN = {"caps": ["CAP_SYS_ADMIN"]}
DOCKER_PROXY = "enterprise_gateway.services.processproxies.docker_swarm.DockerProcessProxy"


@pytest.fixture
def docker_client(tmp_path: Path) -> str:
    client = tmp_path / "bin" / "docker"
    client.parent.mkdir()
    client.write_text("#!/bin/sh\n")
    client.chmod(0o755)
    return str(client)


@pytest.mark.unit
def test_the_docker_spec_pins_image_and_client_and_nests_bubblewrap(prefix: Path, docker_client: str) -> None:
    assert kernelspec.main(["install", "--enterprise-gateway", "docker", "--image", "registry.lab/owsbx:2",
                            "--docker", docker_client, "--prefix", str(prefix), "--name", "egd"]) == 0
    spec = json.loads((prefix / "share/jupyter/kernels/egd/kernel.json").read_text())
    assert spec["metadata"]["process_proxy"] == {"class_name": DOCKER_PROXY,
                                                 "config": {"image_name": "registry.lab/owsbx:2"}}
    command = Path(sys.executable).parent / "owsandbox"
    assert spec["argv"][:6] == [str(command), "gateway-docker", "--image", "registry.lab/owsbx:2",
                                "--docker", docker_client]
    assert spec["argv"][6:] == gateway.LAUNCHER_ARGS
    # not the container provider's OWSANDBOX_IMAGE; the launch timeout the spec asks the gateway for
    assert spec["env"] == {"OWSANDBOX_PROVIDER": "bwrap", "KERNEL_LAUNCH_TIMEOUT": "180"}
    assert spec["metadata"]["owsandbox"]["sandbox"] == "bubblewrap in the container"


@pytest.mark.unit
def test_the_docker_spec_says_when_the_container_is_the_sandbox(prefix: Path, docker_client: str) -> None:
    assert kernelspec.main(["install", "--enterprise-gateway", "docker", "--image", "owsbx", "--docker",
                            docker_client, "--provider", "local", "--prefix", str(prefix), "--name", "egd"]) == 0
    spec = json.loads((prefix / "share/jupyter/kernels/egd/kernel.json").read_text())
    assert spec["env"]["OWSANDBOX_PROVIDER"] == "local" and spec["metadata"]["owsandbox"]["sandbox"] == "the container"


@pytest.mark.unit
@pytest.mark.parametrize(("argv", "said"), [
    (["--enterprise-gateway", "docker"], "needs --image IMG"),
    (["--enterprise-gateway", "docker", "--image", "Bad Image"], "is not an image reference"),
    (["--enterprise-gateway", "docker", "--image", "i", "--provider", "container"], "cannot run inside"),
    (["--enterprise-gateway", "docker", "--image", "i", "--engine", "docker"], "--engine is the container"),
    (["--enterprise-gateway", "docker", "--image", "i", "--hosts", "a"], "--hosts is for --enterprise-gateway ssh"),
    (["--enterprise-gateway", "docker", "--image", "i", "--docker", "/nonexistent/docker"], "not an executable"),
    (["--enterprise-gateway", "ssh", "--hosts", "a", "--docker", "/bin/true"], "--docker is for"),
])
def test_wrong_docker_options_are_refused_by_name(prefix: Path, capsys: pytest.CaptureFixture[str],
                                                  argv: list[str], said: str) -> None:
    assert kernelspec.main(["install", *argv, "--prefix", str(prefix)]) == 2
    assert said in capsys.readouterr().err
    assert not (prefix / "share/jupyter/kernels/owsandbox").exists()


def docker_args(kernel_id: str = "0b1c") -> tuple[Any, list[str]]:
    return gateway_docker.parse(["--image", "owsbx:1", "--docker", "/usr/bin/docker",
                                 "--RemoteProcessProxy.kernel-id", kernel_id, "--RemoteProcessProxy.response-address",
                                 "203.0.113.1:8877", "--RemoteProcessProxy.public-key", "AAAA",
                                 "--RemoteProcessProxy.port-range", "0..0"])


@pytest.fixture
def engines_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for containers-common's default profile, with the engines' CAP_SYS_ADMIN-only rules."""
    from owsandbox.host.isolation import container_seccomp

    path = tmp_path / "seccomp.json"
    path.write_text(json.dumps({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["unshare", "mount", "read"], "action": "SCMP_ACT_ALLOW", "args": []},
        {"names": ["sethostname", "setns"], "action": "SCMP_ACT_ALLOW", "args": [], "includes": ADMIN},
        {"names": ["sethostname", "setns"], "action": "SCMP_ACT_ERRNO", "args": [], "excludes": ADMIN},
    ]}))
    monkeypatch.setattr(container_seccomp, "DEFAULT_PROFILES", (str(path),))
    return path


@pytest.mark.unit
def test_the_container_gets_the_kernels_variables_and_not_the_gateways(tmp_path: Path, engines_profile: Path) -> None:
    args, rest = docker_args()
    env = {"PATH": "/gateway/bin", "DOCKER_HOST": "unix:///gw.sock", "EG_AUTH_TOKEN": "t", "KERNEL_USERNAME": "ana",
           "KERNEL_UID": "1001", "KERNEL_GID": "100", "OWSANDBOX_PROVIDER": "bwrap", "EG_DOCKER_NETWORK": "labnet",
           "KERNEL_IMAGE": "owsbx:1", "KERNEL_ID": "0b1c"}
    line = gateway_docker.run_argv(args, rest, env, "0b1c", tmp_path)
    assert line[:6] == ["/usr/bin/docker", "run", "--detach", "--name", "owsandbox-0b1c", "--label"]
    assert line[line.index("--network") + 1] == "labnet" and line[line.index("--user") + 1] == "1001:100"
    passed = [line[i + 1] for i, word in enumerate(line) if word == "--env"]
    assert passed == ["KERNEL_GID", "KERNEL_ID", "KERNEL_IMAGE", "KERNEL_UID", "KERNEL_USERNAME", "OWSANDBOX_PROVIDER"]
    assert line[-len(rest) - 4:] == ["owsbx:1", "owsandbox", "gateway-kernel", *rest, "--container-proxy"]
    assert "systempaths=unconfined" in line and "--cap-drop" in line and "no-new-privileges" in line
    profile = json.loads((tmp_path / "seccomp.json").read_text())
    rules = [r for r in profile["syscalls"] if "sethostname" in r["names"]]
    assert len(rules) == 1 and rules[0]["action"] == "SCMP_ACT_ALLOW" and "includes" not in rules[0]
    assert any("setns" in r["names"] and r["action"] == "SCMP_ACT_ERRNO" for r in profile["syscalls"])  # kept
    assert any("chmod" in r["names"] for r in profile["syscalls"])  # and owsandbox's no-setuid rules are in


@pytest.mark.unit
def test_the_local_provider_keeps_dockers_own_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args, rest = docker_args()
    line = gateway_docker.run_argv(args, rest, {"OWSANDBOX_PROVIDER": "local"}, "0b1c", tmp_path)
    assert not [word for word in line if word.startswith(("seccomp=", "systempaths="))]
    assert line[line.index("--user") + 1] == "1000:100" and line[line.index("--network") + 1] == "bridge"
    assert "the container itself is the kernel's sandbox" in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize(("env", "said"), [
    ({"KERNEL_IMAGE": "other:1"}, "runs only its own image, owsbx:1"),
    ({"KERNEL_UID": "0"}, "does not run as root"),
    ({"KERNEL_UID": "ana"}, "KERNEL_UID 'ana' is not a number"),
    ({"KERNEL_GID": "-1"}, "KERNEL_GID '-1' is not a number"),
])
def test_the_docker_launcher_refuses_by_name(tmp_path: Path, engines_profile: Path, env: dict[str, str],
                                             said: str) -> None:
    args, rest = docker_args()
    with pytest.raises(gateway_launcher.LaunchError, match=re.escape(said)):
        gateway_docker.run_argv(args, rest, {"OWSANDBOX_PROVIDER": "bwrap", **env}, "0b1c", tmp_path)


@pytest.mark.unit
def test_nested_bubblewrap_needs_a_profile_to_widen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from owsandbox.host.isolation import container_seccomp

    monkeypatch.setattr(container_seccomp, "DEFAULT_PROFILES", (str(tmp_path / "none.json"),))
    args, rest = docker_args()
    with pytest.raises(gateway_launcher.LaunchError, match="install containers-common"):
        gateway_docker.run_argv(args, rest, {"OWSANDBOX_PROVIDER": "bwrap"}, "0b1c", tmp_path)


FAKE_DOCKER = """#!/bin/sh
# docker as gateway-docker uses it: run, logs --follow, inspect, rm; what `logs` says comes from $LOGS;
# with $REFUSE, `run` fails as Docker does
echo "$@" >> "$CALLS"
case "$1" in
    run) [ -n "$REFUSE" ] && { echo "docker: $REFUSE" >&2; exit 125; }; echo 0123abcd ;;
    logs) printf "$LOGS"; [ -n "$HANG" ] && exec sleep 60; exit 0 ;;
    inspect) echo 2 ;;
esac
"""


def launch_docker(tmp_path: Path, logs: str, **env: str) -> tuple[int, str, list[str]]:
    client = tmp_path / "docker"
    client.write_text(FAKE_DOCKER)
    client.chmod(0o755)
    calls = tmp_path / "calls"
    argv = ["--image", "owsbx:1", "--docker", str(client), "--RemoteProcessProxy.kernel-id", "0b1c",
            "--RemoteProcessProxy.response-address", "203.0.113.1:8877", "--RemoteProcessProxy.public-key", "AAAA"]
    code = ("import sys; from owsandbox.kernelspec.gateway_docker import launch; "
            f"sys.exit(launch({argv!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "LOGS": logs, "CALLS": str(calls),
                               "OWSANDBOX_PROVIDER": "local", **env})
    return done.returncode, done.stderr, calls.read_text().splitlines()


def test_the_docker_launcher_returns_once_the_kernel_has_answered(tmp_path: Path) -> None:
    status, said, calls = launch_docker(tmp_path, f"starting\\nowsandbox gateway-kernel: kernel 0b1c "
                                                  f"{gateway_launcher.READY}; it listens on ...\\n", HANG="1")
    assert status == 0 and "starting" in said and gateway_launcher.READY in said, said
    assert calls[0].startswith("run --detach --name owsandbox-0b1c") and calls[1] == "logs --follow owsandbox-0b1c"
    assert len(calls) == 2  # nothing removed


def test_the_docker_launcher_reports_a_container_that_ended_and_removes_it(tmp_path: Path) -> None:
    status, said, calls = launch_docker(tmp_path, "owsandbox gateway-kernel: error: the workspace would be /\\n")
    assert status == 2 and "the workspace would be /" in said, said
    assert "the kernel's container ended (status 2) before its kernel answered the gateway" in said, said
    assert calls[-1] == "rm --force owsandbox-0b1c"


def test_the_docker_launcher_leaves_a_silent_container_to_the_gateways_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    status, said, calls = launch_docker(tmp_path, "", HANG="1", KERNEL_LAUNCH_TIMEOUT="1")
    assert status == 0 and time.monotonic() - started < 20, said
    assert not any(call.startswith("rm") for call in calls)


def test_a_failing_docker_run_is_named_with_dockers_words(tmp_path: Path) -> None:
    status, said, calls = launch_docker(tmp_path, "", REFUSE="invalid reference format.")
    assert status == 2, said
    assert "docker run failed (status 125): docker: invalid reference format." in said, said
    assert len(calls) == 1  # nothing followed, nothing to remove


@pytest.mark.parametrize(("words", "said"), [
    (("inspect", "--format", "{{.State.ExitCode}}", "k"), "docker inspect: the docker client"),
    (("service", "rm", "k"), "docker service rm: the docker client"),
])
def test_a_docker_client_that_cannot_run_is_named_with_the_command(tmp_path: Path, words: tuple[str, ...],
                                                                     said: str) -> None:
    """The launchers' one way to docker (gateway-swarm's too): a client that cannot run is a LaunchError
    naming the command, not a traceback."""
    args = gateway_docker.parse(["--image", "owsbx:1", "--docker", str(tmp_path / "no-docker"),
                                 "--RemoteProcessProxy.kernel-id", "k", "--RemoteProcessProxy.response-address",
                                 "203.0.113.1:8877", "--RemoteProcessProxy.public-key", "AAAA"])[0]
    with pytest.raises(gateway_launcher.LaunchError, match=re.escape(said)) as raised:
        gateway_docker.docker(args, *words)
    assert str(tmp_path / "no-docker") in str(raised.value)


def test_a_checked_docker_call_that_fails_quotes_its_stderr(tmp_path: Path) -> None:
    client = tmp_path / "docker"
    client.write_text("#!/bin/sh\necho 'Error: No such object: k' >&2\nexit 1\n")
    client.chmod(0o755)
    args = gateway_docker.parse(["--image", "owsbx:1", "--docker", str(client), "--RemoteProcessProxy.kernel-id",
                                 "k", "--RemoteProcessProxy.response-address", "203.0.113.1:8877",
                                 "--RemoteProcessProxy.public-key", "AAAA"])[0]
    assert gateway_docker.docker(args, "inspect", "k").returncode == 1  # unchecked: the caller reads the status
    with pytest.raises(gateway_launcher.LaunchError,
                       match=re.escape("docker inspect failed (status 1): Error: No such object: k")):
        gateway_docker.docker(args, "inspect", "k", check=True)
