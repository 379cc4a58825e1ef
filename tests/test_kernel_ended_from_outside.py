"""A kernel ended from outside: its launcher gone, or sent SIGTERM, alone or during a shutdown.

Nothing can restart a kernel whose manager died, so once its launcher is gone the box's daemon must not
linger for one (30 s, the local provider's default) and no process of the box may outlive the kernel.
The launcher here is a process of its own that starts the kernel with jupyter_client and is then
killed, as a crashed notebook server leaves its kernel, or as `jupyter console` does, which exits right
after sending `shutdown_request`. SIGTERM is what jupyter_client sends a kernel that has not exited
2.5 s after `shutdown_request`: the close under way must finish. A SIGTERM alone cannot be told from a
provisioner's restart, and leaves the box for the kernel that may come, as a crash does.

"During a shutdown" is made certain, not hoped for: the test holds the box's daemon stopped (SIGSTOP),
so the close waits on it (5 s, then SIGKILL), and acts once the daemon has the close's SIGTERM pending.
The proof is ordered, not timed: the kernel exits only after its sandbox has been dealt with, so once
the kernel's pidfd turns readable, what the close ends has ended.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient

from .conftest import KERNEL_NAME
from .processes import PinnedProcesses
from .waiting import wait_until

pytestmark = pytest.mark.timeout(180)

# Starts the kernel, says its pid, and waits to be killed. Its sockets are files (ipc), so no other
# process can take one of its ports between their choice and the kernel's bind.
LAUNCHER = """
import sys, threading
from jupyter_client.manager import KernelManager
manager = KernelManager(kernel_name=sys.argv[1], transport="ipc", ip=sys.argv[3] + "/kernel-socket")
manager.connection_file = sys.argv[2]
manager.start_kernel(cwd=sys.argv[3])
print(manager.provisioner.process.pid, flush=True)
threading.Event().wait()
"""


def sigterm_pending(pid: int) -> bool:
    """Whether the process has a SIGTERM waiting (it is stopped, so it has not taken it)."""
    pending = re.search(r"^ShdPnd:\s*([0-9a-f]+)$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    return bool(pending and int(pending.group(1), 16) & (1 << (signal.SIGTERM - 1)))


@pytest.fixture
def pinned() -> Iterator[PinnedProcesses]:
    processes = PinnedProcesses()
    yield processes
    processes.kill()  # whatever the test left: the kernel, its daemon, its shells
    processes.close()


def cell(client: BlockingKernelClient, code: str) -> str:
    printed: list[str] = []
    errors: list[dict] = []

    def seen(msg: dict) -> None:
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            errors.append(msg["content"])

    reply = client.execute_interactive(code, timeout=60, output_hook=seen)
    assert reply["content"]["status"] == "ok", (errors, printed)
    return "".join(printed)


@pytest.mark.parametrize("during_shutdown", [False, True], ids=["alone", "during a shutdown"])
@pytest.mark.parametrize("how", ["launcher killed", "SIGTERM"])
def test_a_kernel_ended_from_outside_deals_with_its_sandbox_before_it_exits(tmp_path: Path, pinned: PinnedProcesses,
                                                                             how: str, during_shutdown: bool) -> None:
    # the file's name is the sandbox's key: one of this test's own (a box kept for a restart is found by it)
    connection = tmp_path / f"kernel-{uuid.uuid4()}.json"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, KERNEL_NAME, str(connection), str(tmp_path)],
                                stdout=subprocess.PIPE, text=True)
    client = BlockingKernelClient()
    try:
        kernel_pid = int(launcher.stdout.readline())
        assert pinned.add(kernel_pid, lambda pid: "owsandbox.kernel" in Path(f"/proc/{pid}/cmdline").read_text())
        client.load_connection_file(str(connection))
        client.start_channels(hb=False)  # a heartbeat late on a busy machine would count as a death
        client.wait_for_ready(timeout=60)
        shown = cell(client, 'echo "pids: $$ $PPID"')
        shell_pid, daemon_pid = map(int, re.search(r"pids: (\d+) (\d+)", shown).groups())
        assert pinned.add(daemon_pid, lambda pid: f"PPid:\t{kernel_pid}\n" in Path(f"/proc/{pid}/status").read_text())
        assert pinned.add(shell_pid, lambda pid: f"PPid:\t{daemon_pid}\n" in Path(f"/proc/{pid}/status").read_text())

        if during_shutdown:
            pinned.signal(daemon_pid, signal.SIGSTOP)
            client.shutdown()  # what jupyter console does at Ctrl-D, before it exits at once
            wait_until(lambda: sigterm_pending(daemon_pid), 60, "the close's SIGTERM to the stopped daemon")
        if how == "SIGTERM":
            pinned.signal(kernel_pid, signal.SIGTERM)
        else:
            launcher.send_signal(signal.SIGKILL)
            launcher.wait()

        assert pinned.ended_within(kernel_pid, 120), "the kernel did not exit"
        left = pinned.still_running_after(0)
        if how == "SIGTERM" and not during_shutdown:  # kept for a restart: the daemon and its shell
            assert left == {daemon_pid, shell_pid}, {pid: pinned.seen[pid] for pid in left}
        else:  # ended before the kernel was
            assert not left, {pid: pinned.seen[pid] for pid in left}
    finally:
        client.stop_channels()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        launcher.stdout.close()
