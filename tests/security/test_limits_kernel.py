"""Limits through a real kernel on the default sandbox: a cell that hits one ends with a named error
and the next cell runs in the same shell, in the same folder."""

from __future__ import annotations

import pytest

from ..conftest import DEFAULT_KERNEL_NAME, require_bwrap
from ..kernel_session import KernelSession


@pytest.fixture
def kernel(tmp_path):
    require_bwrap()
    session = KernelSession(tmp_path, kernel_name=DEFAULT_KERNEL_NAME,
                            env={"OWSANDBOX_LIMITS": "memory=1G,pids=128,tmp=32M"})
    try:
        yield session
    finally:
        session.close()


def test_each_limit_is_a_named_error_and_the_next_cell_works(kernel, tmp_path):
    assert kernel.run("mkdir -p sub && cd sub && X=kept").status == "ok"
    memory = kernel.run("python3 -c 'b = bytearray(8 << 30)'")
    assert memory.status == "error" and memory.error["ename"] == "OutOfMemory", memory.outputs
    assert "1 GiB" in memory.error["evalue"]
    forks = kernel.run("for i in $(seq 200); do sleep 3 & done; wait", timeout=120)
    assert forks.status == "error" and forks.error["ename"] == "TooManyProcesses", forks.outputs
    disk = kernel.run("dd if=/dev/zero of=/tmp/big bs=1M count=64 status=none")
    assert disk.status == "error" and disk.error["ename"] == "NoSpaceLeft", disk.outputs
    after = kernel.run("rm -f /tmp/big; echo \"$PWD $X\"")
    assert after.status == "ok" and after.text() == f"{tmp_path}/sub kept\n"


def test_the_sandbox_magic_shows_limits_mounts_and_environment(kernel, tmp_path):
    shown = kernel.run("%sandbox --all")
    text = "".join(d["data"]["text/plain"] for d in shown.of_type("display_data"))
    assert "limits: memory" in text and "1 GiB" in text and "limits: processes" in text and "128" in text
    assert "path in the sandbox" in text and f"{tmp_path}" in text and "read-write (the workspace)" in text
    assert "/usr" in text and "environment" in text and "privileges" in text
    assert "seccomp" in text and "system calls refused" in text
    summary = kernel.run("%sandbox").of_type("display_data")[0]["data"]["text/plain"]
    assert "memory 1 GiB, processes 128, /tmp 32 MiB" in summary and len(summary.splitlines()) <= 25, summary
    assert f"{tmp_path} (the workspace); private /dev/shm, /tmp" in summary and "pg_hba" not in summary


def test_a_memory_limit_too_small_for_the_sandbox_is_named_in_the_first_cell(tmp_path):
    require_bwrap()
    session = KernelSession(tmp_path, kernel_name=DEFAULT_KERNEL_NAME, env={"OWSANDBOX_LIMITS": "memory=16M"})
    try:
        first = session.run("echo hi", timeout=60)
        assert first.status == "error" and "LimitTooSmall: memory=16 MiB leaves no room" in first.error["evalue"], (
            first.outputs)
    finally:
        session.close()
