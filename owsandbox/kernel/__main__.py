"""The kernel's entry point: Jupyter starts it through the kernelspec's argv (owsandbox.kernelspec)."""

from ..logs import configure
from .app import OwSandboxKernelApp
from .kernel import OwSandboxKernel


def main() -> None:
    configure()
    OwSandboxKernelApp.launch_instance(kernel_class=OwSandboxKernel)


if __name__ == "__main__":
    main()
