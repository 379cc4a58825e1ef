"""The kernel provisioner of `owsandbox install --kernel-provisioner distributed`: a plain Jupyter server
starts owsandbox kernels on remote hosts over ssh, without a gateway.

It is gateway_provisioners' DistributedProvisioner (Enterprise Gateway's ssh process proxy as a
jupyter_client kernel provisioner: ssh to the next of its `remote_hosts`, run the spec's argv there,
wait for the launcher's encrypted answer, signal the kernel through the launcher's port) with one
change: a restart stays on the host the kernel ran on. The stock provisioner picks the next host for
a restart as for a new kernel (round-robin), and a plain Jupyter server has no request environment
to pin it (Enterprise Gateway's `KERNEL_REMOTE_HOST`): a restart in JupyterLab would land on the
other host with a new, empty sandbox, while the old one, kept for the restart, waited on the first
host until it ended. Here the sandbox is where the restarted kernel is, as on one machine. A
`KERNEL_REMOTE_HOST` in the kernel's environment (the server's) still wins. A host that is gone
fails the restart at the launch timeout; a new kernel goes to the next host.

Jupyter finds it through its entry point (`owsandbox-distributed-provisioner` in the group
`jupyter_client.kernel_provisioners`, pyproject.toml); it needs gateway_provisioners where the server
runs: `pip install 'owsandbox[provisioners]'`.
"""

from __future__ import annotations

from typing import Any

from gateway_provisioners.distributed import DistributedProvisioner


class OwSandboxDistributedProvisioner(DistributedProvisioner):  # type: ignore[misc]
    """DistributedProvisioner whose restarts stay on the kernel's host (see the module's docstring)."""

    def _determine_next_host(self, env_dict: dict[str, Any]) -> str:
        host = self.assigned_host  # "" before the first launch; the kernel's host after it, kept by cleanup()
        if host and not env_dict.get("KERNEL_REMOTE_HOST"):
            if self.least_connection:  # cleanup() counted the kernel off its host
                DistributedProvisioner.kernel_on_host.add_kernel_id(host, self.kernel_id)
            self.log.info(f"owsandbox: kernel {self.kernel_id} restarts on its host {host}, where its sandbox is")
            return str(host)
        return str(super()._determine_next_host(env_dict))
