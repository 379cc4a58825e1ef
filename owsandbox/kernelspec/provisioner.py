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

A second change: a kernel asked to shut down gets `OWSANDBOX_SHUTDOWN_WAIT_TIME` seconds (15 by
default) before it is killed, not the server's 5. A kernel here ends its sandbox on the way out (its
processes, a container, its state folder), on a host that may be busy; killed first, it leaves them
for the host's next kernel start to sweep. gateway_provisioners' YARN provisioner lengthens the wait
the same way for its applications. A longer server setting (`KernelManager.shutdown_wait_time`) wins.

Jupyter finds it through its entry point (`owsandbox-distributed-provisioner` in the group
`jupyter_client.kernel_provisioners`, pyproject.toml); it needs gateway_provisioners where the server
runs: `pip install 'owsandbox[provisioners]'`.
"""

from __future__ import annotations

from typing import Any

from gateway_provisioners.distributed import DistributedProvisioner

from ..settings import SHUTDOWN_WAIT_TIME, SettingsError, read

SHUTDOWN_WAIT_SECONDS = 15.0


class OwSandboxDistributedProvisioner(DistributedProvisioner):  # type: ignore[misc]
    """DistributedProvisioner whose restarts stay on the kernel's host, and whose kernels have time to
    end their sandboxes when shut down (see the module's docstring)."""

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        """Called by jupyter_client's `KernelManager.finish_shutdown()` after a shutdown request: how
        long the kernel may take to exit before it is killed."""
        return max(recommended, shutdown_wait_seconds(self.log))

    def _determine_next_host(self, env_dict: dict[str, Any]) -> str:
        host = self.assigned_host  # "" before the first launch; the kernel's host after it, kept by cleanup()
        if host and not env_dict.get("KERNEL_REMOTE_HOST"):
            if self.least_connection:  # cleanup() counted the kernel off its host
                DistributedProvisioner.kernel_on_host.add_kernel_id(host, self.kernel_id)
            self.log.info(f"owsandbox: kernel {self.kernel_id} restarts on its host {host}, where its sandbox is")
            return str(host)
        return str(super()._determine_next_host(env_dict))


def shutdown_wait_seconds(log: Any) -> float:
    """The server's `OWSANDBOX_SHUTDOWN_WAIT_TIME`, or 15 s; a value that is not a number of seconds is
    named in the server's log and the default is used (a shutdown is no time to fail)."""
    try:
        seconds = read(SHUTDOWN_WAIT_TIME)
    except SettingsError as exc:
        log.error(f"owsandbox: {exc}; kernels get {SHUTDOWN_WAIT_SECONDS:g} s to shut down")
        return SHUTDOWN_WAIT_SECONDS
    return SHUTDOWN_WAIT_SECONDS if seconds is None else float(seconds)
