"""A student's Jupyter server in the single-user image (singleuser.Containerfile): the sandbox and nothing else.

A terminal, or any other kernel, would run in the server's container outside the box, as the student:
`allowed_kernelspecs` alone only filters the list (POST /api/kernels {"name": "python3"} would still
start one), so other kernels are refused before they are made.
"""

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web

KERNEL = "owsandbox"
c = get_config()  # noqa: F821


class SandboxKernelsOnly(AsyncMappingKernelManager):
    """Starts the sandbox kernel and no other (refused before a kernel is made: a start that fails later
    stays pending, and then the server's shutdown fails)."""

    async def start_kernel(self, **kwargs):
        name = kwargs.get("kernel_name") or self.default_kernel_name
        if name != KERNEL:
            raise web.HTTPError(403, f"only the sandbox kernel runs here, not {name!r}")
        return await super().start_kernel(**kwargs)


c.ServerApp.kernel_manager_class = SandboxKernelsOnly
c.KernelSpecManager.allowed_kernelspecs = {KERNEL}
c.KernelSpecManager.ensure_native_kernel = False
c.MappingKernelManager.default_kernel_name = KERNEL
c.ServerApp.terminals_enabled = False
