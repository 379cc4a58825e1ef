"""`python -m owsandbox.kernel -f {connection_file}`: how Jupyter starts the kernel."""

from ipykernel.kernelapp import IPKernelApp

from ..logs import configure
from .kernel import OwSandboxKernel

configure()
IPKernelApp.launch_instance(kernel_class=OwSandboxKernel)
