"""The kernel as a user gets it, with no provider named: bubblewrap where it works (here, and in CI)."""

from __future__ import annotations

import os
import re
import time

import pytest

from .conftest import DEFAULT_KERNEL_NAME, require_bwrap
from .kernel_session import KernelSession


@pytest.fixture
def kernel(tmp_path):
    require_bwrap()
    session = KernelSession(tmp_path, kernel_name=DEFAULT_KERNEL_NAME)
    try:
        yield session
    finally:
        session.close()


def test_the_default_sandbox_isolates_and_says_so(kernel):
    kernel.kc.kernel_info()
    banner = kernel.kc.get_shell_msg(timeout=10)["content"]["banner"]
    assert "provider auto" in banner and "isolated by bubblewrap" in banner
    first = kernel.run("hostname; touch /etc/probe 2>&1 || echo refused")
    assert first.status == "ok", first.outputs  # the sandbox made on a helper thread outlives it
    assert first.text() == "sandbox\ntouch: cannot touch '/etc/probe': Read-only file system\nrefused\n"
    assert "[owsandbox" not in first.text("stderr")  # no warning: it does isolate


def test_cells_keep_state_and_stop_works_in_the_default_sandbox(kernel):
    for _ in range(3):  # several cells in a row on the same sandbox, not one restarted under them
        assert kernel.run("export N=$((${N:-0} + 1)); echo $N").status == "ok"
    msg_id = kernel.send("echo started; sleep 60")
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            break
    kernel.km.interrupt_kernel()
    assert kernel.collect(msg_id).reply["content"]["ename"] == "Interrupted"
    assert kernel.run("echo $N").text() == "3\n"
    described = kernel.run("%sandbox").of_type("display_data")[0]["data"]["text/plain"]
    assert re.search(r"^restarts +0$", described, re.M)


def test_shutdown_ends_the_sandbox(kernel):
    kernel.run("sleep 600 &")
    bwrap = [pid for pid in _children(kernel.pid) if _name(pid) == "bwrap"]
    assert bwrap, "the sandbox runs as a child of the kernel"
    kernel.close()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in bwrap) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in bwrap)


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
