"""`python -m owsandbox.kernel -f {connection_file}`: how Jupyter starts the kernel."""

from ..logs import configure
from .app import OwSandboxKernelApp
from .kernel import OwSandboxKernel

configure()
OwSandboxKernelApp.launch_instance(kernel_class=OwSandboxKernel)
