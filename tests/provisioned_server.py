"""A plain `jupyter server` whose owsandbox kernels run on remote hosts, for the tests and the benchmark.

No gateway: the server's own kernel manager starts each kernel through the kernelspec's provisioner,
`owsandbox install --kernel-provisioner distributed --hosts H1,H2` (gateway_provisioners'
DistributedProvisioner, subclassed by owsandbox). It is the test environment's own Jupyter server (the
test extra has gateway_provisioners; the project's pins and its agree), run in the network namespace
`gw` of tests/gateway_hosts.py, on that namespace's loopback, with HOME a folder holding the ssh key
and the hosts' keys (paramiko reads `~/.ssh`), the spec found through JUPYTER_PATH, and the response
address on the first host's pair. The tests run as root, whom gateway_provisioners refuses by default
(its `unauthorized_users`), so the server names its kernels' user with KERNEL_USERNAME, as
docs/how-to/gateways.md says.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .gateway_hosts import GATEWAY_ADDRESSES, GatewayNetwork
from .namespace_server import NamespaceServer
from .server_config import without_nbgrader
from .waiting import WaitTimeout, wait_until

PORT = 8888  # on the gateway namespace's own loopback
KERNEL_NAME = "owsandbox-remote"
USER = "student"


def install_spec(prefix: Path, hosts: list[str], workspace: Path, extra: list[str] | None = None,
                 name: str = KERNEL_NAME) -> Path:
    """The kernelspec, as docs/how-to/gateways.md says: `owsandbox install --kernel-provisioner distributed
    --hosts ...`, its workspace on the hosts named (a login's home, root's here, is not the tests' to write)."""
    owsandbox = Path(sys.executable).parent / "owsandbox"
    done = subprocess.run([str(owsandbox), "install", "--kernel-provisioner", "distributed", "--hosts", ",".join(hosts),
                           "--prefix", str(prefix), "--name", name, "--provider", "bwrap",
                           "--env", f"OWSANDBOX_WORKSPACE={workspace}", *(extra or [])],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return prefix / "share" / "jupyter" / "kernels" / name


class ProvisionedServer(NamespaceServer):
    """One `jupyter server` in the gateway namespace, spoken to over REST and WebSockets."""

    def __init__(self, network: GatewayNetwork, spec_prefix: Path, log_path: Path,
                 extra_args: list[str] | None = None, port: int = PORT) -> None:
        super().__init__(network, log_path, port, KERNEL_NAME, USER)
        root = network.folder / f"server-root-{port}"
        root.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "GP_", "KERNEL_", "OWSANDBOX_"))}
        env.update(HOME=str(network.home), JUPYTER_PATH=str(spec_prefix / "share" / "jupyter"),
                   JUPYTER_RUNTIME_DIR=str(network.folder / f"server-runtime-{port}"),
                   JUPYTER_CONFIG_DIR=str(network.folder / f"server-config-{port}"),
                   GP_RESPONSE_IP=GATEWAY_ADDRESSES[0], GP_KERNEL_LOG_DIR=str(network.folder),
                   KERNEL_USERNAME=USER)
        without_nbgrader(network.folder / f"server-config-{port}")
        jupyter_server = Path(sys.executable).parent / "jupyter-server"
        argv = network.in_gateway([str(jupyter_server), "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                                   "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                                   f"--ServerApp.root_dir={root}", "--ServerApp.allow_root=True",
                                   "--ServerApp.open_browser=False", "--debug", *(extra_args or [])])
        self._start(argv, env)

    def _answers(self) -> bool:
        """The server answers `/api/status` (it says it runs a moment before it listens)."""

        def answered() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError("the Jupyter server ended")
            try:
                return self.request("GET", "/api/status", timeout=5)[0] == 200
            except OSError:
                return False

        try:
            return wait_until(answered, 30, "the Jupyter server's /api/status", interval=0.1)
        except (RuntimeError, WaitTimeout):
            return False

    def start_kernel(self) -> str:
        status, body = self.request("POST", "/api/kernels", {"name": KERNEL_NAME})
        assert status == 201, (status, body)
        return body["id"]
