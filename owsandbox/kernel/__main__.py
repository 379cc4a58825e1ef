"""`python -m owsandbox.kernel -f {connection_file}`: how Jupyter starts the kernel."""

from ipykernel.kernelapp import IPKernelApp

from .kernel import OwSandboxKernel

IPKernelApp.launch_instance(kernel_class=OwSandboxKernel)
