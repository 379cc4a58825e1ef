"""A start sweeps the state folders of keyed sandboxes that are gone, never one a live kernel still holds.

Found by benchmarks/soak.py: ten kernels whose boxes were killed at random lost their state folder to
another kernel's start (the sweep saw a dead daemon), and their next cells said "the sandbox is
unreachable" until the kernel restarted. Real daemons through the local provider, in this process.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from owsandbox.host.executor import RunnerExecutor
from owsandbox.host.providers.local import CLAIM_FILE, LocalProvider

from .conftest import running
from .machine_lock import own_key
from .processes import wait_gone


def test_a_box_killed_under_a_live_kernel_keeps_its_folder_and_restarts_while_a_dead_kernels_goes(tmp_path: Path):
    held = LocalProvider(tmp_path, key=own_key("sweep-held"), linger_seconds=1)
    with running(held) as (_, client):
        executor = RunnerExecutor(client)
        assert executor.run("echo first")["output"] == "first\n"
        folder = Path(held.state_dir or "")
        gone = LocalProvider(tmp_path, key=own_key("sweep-gone"), linger_seconds=1)
        gone.create()
        gone_folder = Path(gone.state_dir or "")
        os.kill(gone.daemon_pid or 0, signal.SIGKILL)  # a kernel killed for good: its box gone too, no claim left
        gone._unclaim_state()
        assert wait_gone([gone.daemon_pid or 0]) == []
        os.kill(held.daemon_pid or 0, signal.SIGKILL)  # the live kernel's box killed under it
        assert wait_gone([held.daemon_pid or 0]) == []
        other = LocalProvider(tmp_path, key=own_key("sweep-other"), linger_seconds=1)
        with running(other):  # its start sweeps
            assert folder.is_dir() and (folder / CLAIM_FILE).is_file(), "a live kernel's folder was swept"
            assert not gone_folder.exists(), "a dead kernel's folder was kept"
        assert executor.run("echo after")["output"] == "after\n"  # a new box, in the same folder
        assert client.restarts == 1
