"""A kernel ended from outside, its launcher gone or sent SIGTERM, ends its sandbox before it leaves.

Nothing can restart a kernel whose manager died, so the box's daemon must not linger for one (30 s, the
local provider's default) and no shell may outlive the kernel. The launcher here is a process of its
own that starts the kernel with jupyter_client and is then killed, as a crashed notebook server or a
`jupyter console` that exits right after sending `shutdown_request` leaves its kernel. SIGTERM is what
jupyter_client sends a kernel that has not exited 2.5 s after `shutdown_request`; each comes alone, and
right after a `shutdown_request`, whose close of the sandbox it must let finish.

The proof is ordered, not timed: the kernel exits only after its sandbox has ended, so once the kernel's
pidfd turns readable, the daemon and the shell must have ended already.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient

from .conftest import KERNEL_NAME
from .processes import PinnedProcesses

pytestmark = pytest.mark.timeout(180)

# Starts the kernel, says its pid, and waits to be killed.
LAUNCHER = """
import sys, threading
from jupyter_client.manager import KernelManager
manager = KernelManager(kernel_name=sys.argv[1])
manager.connection_file = sys.argv[2]
manager.start_kernel(cwd=sys.argv[3])
print(manager.provisioner.process.pid, flush=True)
threading.Event().wait()
"""


@pytest.fixture
def pinned() -> Iterator[PinnedProcesses]:
    processes = PinnedProcesses()
    yield processes
    processes.kill()  # whatever the test left: the kernel, its daemon, its shells
    processes.close()


def cell(client: BlockingKernelClient, code: str) -> str:
    printed: list[str] = []
    reply = client.execute_interactive(code, timeout=60, output_hook=lambda m: printed.append(
        m["content"]["text"] if m["msg_type"] == "stream" else ""))
    assert reply["content"]["status"] == "ok", reply
    return "".join(printed)


@pytest.mark.parametrize("shutdown_first", [False, True], ids=["alone", "right after shutdown_request"])
@pytest.mark.parametrize("how", ["launcher killed", "SIGTERM"])
def test_a_kernel_ended_from_outside_ends_its_sandbox_before_it_exits(tmp_path: Path, pinned: PinnedProcesses,
                                                                        how: str, shutdown_first: bool) -> None:
    connection = tmp_path / "kernel-orphan.json"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, KERNEL_NAME, str(connection), str(tmp_path)],
                                stdout=subprocess.PIPE, text=True)
    client = BlockingKernelClient()
    try:
        kernel_pid = int(launcher.stdout.readline())
        assert pinned.add(kernel_pid, lambda pid: "owsandbox.kernel" in Path(f"/proc/{pid}/cmdline").read_text())
        client.load_connection_file(str(connection))
        client.start_channels()
        client.wait_for_ready(timeout=60)
        shown = cell(client, 'echo "pids: $$ $PPID"')
        shell_pid, daemon_pid = map(int, re.search(r"pids: (\d+) (\d+)", shown).groups())
        assert pinned.add(daemon_pid, lambda pid: f"PPid:\t{kernel_pid}\n" in Path(f"/proc/{pid}/status").read_text())
        assert pinned.add(shell_pid, lambda pid: f"PPid:\t{daemon_pid}\n" in Path(f"/proc/{pid}/status").read_text())

        if shutdown_first:
            client.shutdown()  # what jupyter console does at Ctrl-D, and then it exits at once
        if how == "SIGTERM":
            pinned.signal(kernel_pid, signal.SIGTERM)
        else:
            launcher.send_signal(signal.SIGKILL)
            launcher.wait()

        assert pinned.ended_within(kernel_pid, 120), "the kernel did not exit"
        left = pinned.still_running_after(0)
        assert not left, {pid: pinned.seen[pid] for pid in left}  # the daemon and the shell ended first
    finally:
        client.stop_channels()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        launcher.stdout.close()
