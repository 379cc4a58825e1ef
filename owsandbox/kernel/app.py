"""The kernel's application: ipykernel's, with its exit made orderly and its start lighter.

After answering `shutdown_request`, ipykernel's control thread still flushes stdout and publishes its
`idle` status through the IOPub thread, while the main thread, its loop stopped, goes on to exit. At
exit `atexit` stops the IOPub thread first (it registered last), and a control thread not yet done
then waits for IOPub in vain (ipykernel 7: `OutStream.flush`, up to 10 s): the process cannot exit,
and the client kills it after its own wait (2.5 s with jupyter_client's defaults, on every shutdown
that loses the race). So the main thread lets the control thread finish before it exits.

Two things ipykernel's start does for Python code, and that an idle kernel here kept in memory for
nothing (together about 0.6 MiB, benchmarks/kernel_start.py), are left out: IPython's interruptible
pdb in place of pdb (a cell is bash in a box: no Python runs here to debug), and the listing of the
machine's network interfaces, with psutil, to work out a default address that the connection file
always replaces (jupyter_client reads `info.get("ip", self._ip_default())`).

The kernel's launcher gone, or SIGTERM, end the kernel only after the sandbox has been dealt with
(ending.py).
"""

from __future__ import annotations

from typing import Any

from ipykernel.kernelapp import IPKernelApp
from ipykernel.parentpoller import ParentPollerUnix

from .ending import OrphanWatch, end_on_sigterm

CONTROL_FINISH_SECONDS = 2.0  # bounded: a control thread stuck elsewhere must not hold the exit up longer


class OwSandboxKernelApp(IPKernelApp):
    _given_ip: str | None = None

    def init_pdb(self) -> None:
        """ipykernel's makes pdb interruptible for the Python a cell runs; no cell runs Python here."""

    def init_poller(self) -> None:
        """ipykernel decides whether there is a parent to watch; the watching is OrphanWatch's."""
        super().init_poller()
        if isinstance(self.poller, ParentPollerUnix):
            self.poller = OrphanWatch(self.poller.parent_pid, lambda: self.kernel.end_for_good(
                "the kernel's launcher went away"))

    def init_signal(self) -> None:
        super().init_signal()
        end_on_sigterm(lambda: self.kernel.end_terminated())

    def load_connection_info(self, info: Any) -> None:
        ip = info.get("ip")
        self._given_ip = ip if isinstance(ip, str) else None
        super().load_connection_info(info)

    def _ip_default(self) -> str:
        """The connection file's address when it has one (jupyter_client asks for the default anyway)."""
        return self._given_ip if self._given_ip is not None else super()._ip_default()

    def start(self) -> None:
        """Called by `launch_instance`; returns once the kernel's loop has stopped (shutdown)."""
        super().start()
        control = self.control_thread
        if control is not None and control.is_alive():
            control.stop()  # after what it is doing now, which may still need IOPub
            control.join(CONTROL_FINISH_SECONDS)
