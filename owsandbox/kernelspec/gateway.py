"""The kernelspec for Jupyter Enterprise Gateway: owsandbox kernels spread over remote hosts.

`owsandbox install --enterprise-gateway ssh --hosts H1,H2` writes a spec whose `metadata.process_proxy`
is the gateway's DistributedProcessProxy with those hosts (round-robin, or least-connection where the
gateway is configured so): for each kernel the gateway logs in to the next host with ssh and runs the
spec's argv there. That argv starts `owsandbox gateway-kernel` (owsandbox.kernelspec.gateway_launcher),
which speaks the gateway's launcher protocol and runs owsandbox's own kernel app, not the gateway's
`launch_ipykernel.py` with plain ipykernel.

The gateway joins the argv with spaces into one shell line on the host, so every word must be one
shell word: the launcher is started by the `owsandbox` command beside the interpreter installing the
spec (a console script: the current folder, which the sandbox may write, is not on its path), never
with `python -c CODE`. That command must exist at the same path on every host (owsandbox installed
in the same place).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

PROXIES = {"ssh": "enterprise_gateway.services.processproxies.distributed.DistributedProcessProxy"}
LAUNCHER_ARGS = ["--RemoteProcessProxy.kernel-id", "{kernel_id}",
                 "--RemoteProcessProxy.response-address", "{response_address}",
                 "--RemoteProcessProxy.public-key", "{public_key}",
                 "--RemoteProcessProxy.port-range", "{port_range}"]
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.:_-]{0,252})")


def parse_hosts(text: str | None) -> list[str]:
    """`--hosts H1,H2`: host names or addresses the gateway can ssh to."""
    hosts = [word.strip() for word in (text or "").split(",")]
    if not text or not all(hosts):
        raise ValueError(f"--hosts {text!r}: give the hosts the gateway starts kernels on, as --hosts h1,h2")
    bad = [h for h in hosts if not _HOST.fullmatch(h)]
    if bad:
        raise ValueError(f"--hosts: {', '.join(map(repr, bad))} is not a host name or address")
    return list(dict.fromkeys(hosts))


def launcher_command(executable: str) -> str:
    """The `owsandbox` command beside `executable`, checked to be there and to be one shell word."""
    command = Path(executable).parent / "owsandbox"
    if not Path(executable).is_absolute() or not command.is_file():
        raise ValueError(f"--enterprise-gateway: no owsandbox command beside {executable} ({command}); install "
                         "the spec with the Python that has owsandbox installed")
    if shlex.quote(str(command)) != str(command):
        raise ValueError(f"--enterprise-gateway: the gateway runs the kernel through a shell line, and the path "
                         f"{command} is not one shell word; install owsandbox under a path without spaces")
    return str(command)


def gateway_spec(spec: dict[str, Any], kind: str, hosts: list[str] | None, executable: str) -> dict[str, Any]:
    """`spec` (owsandbox's kernel.json) turned into the gateway's remote kernelspec."""
    if kind not in PROXIES:
        raise ValueError(f"--enterprise-gateway {kind!r}: the kinds are {', '.join(PROXIES)}")
    if not hosts:
        raise ValueError("--enterprise-gateway ssh needs --hosts H1,H2: the hosts the gateway starts kernels on")
    remote = dict(spec)
    remote["argv"] = [launcher_command(executable), "gateway-kernel", *LAUNCHER_ARGS]
    metadata = dict(remote.get("metadata") or {})
    metadata["process_proxy"] = {"class_name": PROXIES[kind], "config": {"remote_hosts": ",".join(hosts)}}
    metadata["owsandbox"] = {**metadata.get("owsandbox", {}), "enterprise_gateway": kind, "hosts": hosts}
    remote["metadata"] = metadata
    return remote
