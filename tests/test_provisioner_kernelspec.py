"""`owsandbox install --kernel-provisioner distributed` and its parts, without a Jupyter server.

The server starting kernels with it on two hosts over ssh is driven for real in
tests/test_kernel_provisioner.py; here are the spec's content, the refusals of wrong combinations,
the launcher's `--transport-encryption` as gateway_provisioners passes it, and the provisioner's
choice of host (a restart stays where the sandbox is).
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from pathlib import Path

import pytest

from owsandbox import kernelspec
from owsandbox.kernelspec import gateway, gateway_launcher


@pytest.fixture
def prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "prefix" / "share" / "jupyter"))
    return tmp_path / "prefix"


def installed(prefix: Path, name: str = "remote") -> dict:
    return json.loads((prefix / "share/jupyter/kernels" / name / "kernel.json").read_text())


@pytest.mark.unit
def test_the_spec_names_owsandboxs_distributed_provisioner_with_the_hosts(prefix: Path) -> None:
    assert kernelspec.main(["install", "--kernel-provisioner", "distributed", "--hosts", "h1.lab,10.0.0.7",
                            "--prefix", str(prefix), "--name", "remote", "--provider", "bwrap",
                            "--env", "COURSE=maths"]) == 0
    spec = installed(prefix)
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "owsandbox-distributed-provisioner",
        "config": {"remote_hosts": ["h1.lab", "10.0.0.7"], "launch_timeout": 180}}
    assert spec["metadata"]["supported_encryption"] == ["curve"]  # the launcher honours the server's policy
    command = Path(sys.executable).parent / "owsandbox"
    assert spec["argv"] == [str(command), "gateway-kernel", "--kernel-id", "{kernel_id}",
                            "--response-address", "{response_address}", "--public-key", "{public_key}",
                            "--port-range", "{port_range}", "--transport-encryption={transport_encryption}"]
    # the provisioner joins the words with spaces into one shell line on the host, an empty value included
    assert all(shlex.quote(word) == word for word in spec["argv"] if "{" not in word)
    assert spec["env"]["KERNEL_LAUNCH_TIMEOUT"] == "180"  # the launcher's wait for the server's first contact
    assert spec["env"]["OWSANDBOX_PROVIDER"] == "bwrap" and spec["env"]["OWSANDBOX_ENV"] == "COURSE"
    assert "process_proxy" not in spec["metadata"] and spec["interrupt_mode"] == "message"
    assert spec["metadata"]["owsandbox"]["kernel_provisioner"] == "distributed"
    assert spec["metadata"]["owsandbox"]["hosts"] == ["h1.lab", "10.0.0.7"]


@pytest.mark.unit
def test_the_launch_timeout_goes_to_the_provisioner_and_the_launcher(prefix: Path) -> None:
    assert kernelspec.main(["install", "--kernel-provisioner", "distributed", "--hosts", "h1", "--launch-timeout",
                            "300", "--prefix", str(prefix), "--name", "remote"]) == 0
    spec = installed(prefix)
    assert spec["metadata"]["kernel_provisioner"]["config"]["launch_timeout"] == 300
    assert gateway_launcher.launch_timeout({"KERNEL_LAUNCH_TIMEOUT": spec["env"]["KERNEL_LAUNCH_TIMEOUT"]}) == 300


@pytest.mark.unit
@pytest.mark.parametrize(("argv", "said"), [
    (["--kernel-provisioner", "distributed"], "--kernel-provisioner distributed needs --hosts H1,H2"),
    (["--kernel-provisioner", "distributed", "--hosts", "a", "--enterprise-gateway", "ssh"], "choose one"),
    (["--kernel-provisioner", "distributed", "--hosts", "a", "--docker", "/usr/bin/docker"],
     "--docker is for --enterprise-gateway docker or swarm, not --kernel-provisioner"),
    (["--kernel-provisioner", "distributed", "--hosts", "a;reboot"], "'a;reboot' is not a host name"),
    (["--kernel-provisioner", "distributed", "--hosts", "a", "--launch-timeout", "5"], "whole seconds from 10"),
    (["--hosts", "a,b"], "--hosts is for --enterprise-gateway ssh and --kernel-provisioner distributed"),
    (["--launch-timeout", "60"], "--launch-timeout is for --enterprise-gateway and --kernel-provisioner"),
])
def test_wrong_provisioner_options_are_refused_by_name(prefix: Path, capsys: pytest.CaptureFixture[str],
                                                       argv: list[str], said: str) -> None:
    assert kernelspec.main(["install", *argv, "--prefix", str(prefix)]) == 2
    assert said in capsys.readouterr().err
    assert not (prefix / "share/jupyter/kernels/owsandbox").exists()


@pytest.mark.unit
def test_an_unknown_provisioner_kind_is_refused_by_argparse(prefix: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        kernelspec.main(["install", "--kernel-provisioner", "yarn", "--hosts", "a", "--prefix", str(prefix)])
    assert exited.value.code == 2 and "invalid choice: 'yarn'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="the kinds are distributed"):
        gateway.provisioner_spec({}, "yarn", ["a"], sys.executable)


@pytest.mark.unit
def test_a_server_without_gateway_provisioners_is_told_what_to_install(prefix: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    found = gateway.importlib.util.find_spec
    monkeypatch.setattr(gateway.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gateway_provisioners" else found(name, *a))
    assert kernelspec.main(["install", "--kernel-provisioner", "distributed", "--hosts", "a",
                            "--prefix", str(prefix)]) == 2
    assert "pip install 'owsandbox[provisioners]'" in capsys.readouterr().err


BASE = ["--kernel-id", "k1", "--response-address", "10.1.2.3:8877", "--public-key", "AAAA", "--port-range", "0..0"]


@pytest.mark.unit
@pytest.mark.parametrize(("words", "policy"), [
    (["--transport-encryption="], None),  # the server asked for none: owsandbox's spec's one word, empty
    (["--transport-encryption"], None),  # gateway_provisioners' own spelling, its value empty (no word)
    (["--transport-encryption={transport_encryption}"], None),  # a server that substitutes nothing
    (["--transport-encryption=disabled"], None),
    (["--transport-encryption=auto"], "auto"),
    (["--transport-encryption", "REQUIRED"], "required"),
    ([], None),
])
def test_the_launcher_takes_the_servers_transport_encryption_policy(words: list[str], policy: str | None) -> None:
    assert gateway_launcher.parse([*BASE, *words]).curve == policy


@pytest.mark.unit
def test_an_unknown_transport_encryption_policy_is_refused() -> None:
    with pytest.raises(gateway_launcher.LaunchError, match="--transport-encryption 'always': expected auto"):
        gateway_launcher.parse([*BASE, "--transport-encryption=always"])


@pytest.mark.unit
def test_encryption_asked_for_gives_the_kernel_a_curve_key_pair_of_its_own() -> None:
    assert gateway_launcher.curve_keys(None) == {}
    first, second = gateway_launcher.curve_keys("required"), gateway_launcher.curve_keys("auto")
    assert set(first) == {"curve_publickey", "curve_secretkey"}
    assert all(len(key) == 40 for key in first.values())  # Z85, as the provisioner checks them
    assert first != second


def test_the_connection_file_carries_the_curve_keys_the_kernel_binds_with(tmp_path: Path) -> None:
    keys = gateway_launcher.curve_keys("required")
    info = gateway_launcher.write_connection(tmp_path / "kernel-k1.json", "127.0.0.1", (0, 0), keys)
    assert info["curve_publickey"] == keys["curve_publickey"].decode()
    assert info["curve_secretkey"] == keys["curve_secretkey"].decode()
    plain = gateway_launcher.write_connection(tmp_path / "kernel-k2.json", "127.0.0.1", (0, 0))
    assert "curve_publickey" not in plain


# -- the provisioner's choice of host (not `unit`: gateway_provisioners looks up this machine's addresses
# when imported); the provisioner is made without its __init__, which opens the server's response socket --


def provisioner(kernel_id: str, hosts: list[str], algorithm: str = "round-robin"):
    from gateway_provisioners.distributed import DistributedProvisioner

    from owsandbox.kernelspec.provisioner import OwSandboxDistributedProvisioner

    made = OwSandboxDistributedProvisioner.__new__(OwSandboxDistributedProvisioner)
    made.kernel_id, made.remote_hosts, made.assigned_host = kernel_id, hosts, ""
    made.least_connection = algorithm == "least-connection"
    made.log = logging.getLogger("test-provisioner")
    DistributedProvisioner.host_index = 0
    DistributedProvisioner.kernel_on_host._host_kernels.clear()
    DistributedProvisioner.kernel_on_host.init_host_kernels(hosts)
    return made


def launch(made, env: dict[str, str] | None = None) -> str:
    """What launch_kernel() does with the host: choose it and keep it as assigned_host."""
    made.assigned_host = made._determine_next_host(env or {})
    return made.assigned_host


@pytest.mark.parametrize("algorithm", ["round-robin", "least-connection"])
def test_a_restart_stays_on_the_kernels_host_and_new_kernels_spread(algorithm: str) -> None:
    first = provisioner("k1", ["h1", "h2"], algorithm)
    second = provisioner("k2", ["h1", "h2"], algorithm)
    second.remote_hosts = first.remote_hosts
    assert launch(first) == "h1"
    assert launch(second) == "h2"
    for _ in range(3):  # a restart: cleanup(restart=True) counted the kernel off its host, then launch again
        first._unregister_assigned_host()
        assert launch(first) == "h1"
    if algorithm == "least-connection":
        from gateway_provisioners.distributed import DistributedProvisioner

        assert DistributedProvisioner.kernel_on_host._host_kernels == {"h1": 1, "h2": 1}
    assert launch(first, {"KERNEL_REMOTE_HOST": "h2"}) == "h2"  # the operator's pin still wins


def test_a_shut_down_kernel_gets_time_to_end_its_sandbox_before_it_is_killed(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    made = provisioner("k1", ["h1"])
    monkeypatch.delenv("OWSANDBOX_SHUTDOWN_WAIT_TIME", raising=False)
    assert made.get_shutdown_wait_time(5.0) == 15.0  # the server's default, lengthened
    assert made.get_shutdown_wait_time(40.0) == 40.0  # a longer server setting wins
    monkeypatch.setenv("OWSANDBOX_SHUTDOWN_WAIT_TIME", "30")
    assert made.get_shutdown_wait_time(5.0) == 30.0
    monkeypatch.setenv("OWSANDBOX_SHUTDOWN_WAIT_TIME", "soon")
    with caplog.at_level(logging.ERROR, logger="test-provisioner"):
        assert made.get_shutdown_wait_time(5.0) == 15.0
    assert "OWSANDBOX_SHUTDOWN_WAIT_TIME='soon' is not a number of seconds, 0 or more" in caplog.text
