"""The kernel's application: ipykernel's, with its exit made orderly.

After answering `shutdown_request`, ipykernel's control thread still flushes stdout and publishes its
`idle` status through the IOPub thread, while the main thread, its loop stopped, goes on to exit. At
exit `atexit` stops the IOPub thread first (it registered last), and a control thread not yet done
then waits for IOPub in vain (ipykernel 7: `OutStream.flush`, up to 10 s): the process cannot exit,
and the client kills it after its own wait (2.5 s with jupyter_client's defaults, on every shutdown
that loses the race). So the main thread lets the control thread finish before it exits.
"""

from __future__ import annotations

from ipykernel.kernelapp import IPKernelApp

CONTROL_FINISH_SECONDS = 2.0  # bounded: a control thread stuck elsewhere must not hold the exit up longer


class OwSandboxKernelApp(IPKernelApp):
    def start(self) -> None:
        """Called by `launch_instance`; returns once the kernel's loop has stopped (shutdown)."""
        super().start()
        control = self.control_thread
        if control is not None and control.is_alive():
            control.stop()  # after what it is doing now, which may still need IOPub
            control.join(CONTROL_FINISH_SECONDS)
