"""The kernel as a user gets it, with no provider named: bubblewrap where it works (here, and in CI)."""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from pathlib import Path

import pytest

from .processes import children, descendants, name, wait_gone


@pytest.fixture
def kernel(default_kernel):
    return default_kernel


def test_the_default_sandbox_isolates_and_says_so(kernel):
    kernel.kc.kernel_info()
    banner = kernel.kc.get_shell_msg(timeout=10)["content"]["banner"]
    assert "provider auto" in banner and "isolated by bubblewrap" in banner
    first = kernel.run("hostname; touch /etc/probe 2>&1 || echo refused")
    assert first.status == "ok", first.outputs  # the sandbox made on a helper thread outlives it
    assert first.text() == "sandbox\ntouch: cannot touch '/etc/probe': Read-only file system\nrefused\n"
    assert first.text("stderr") == ""
    where = first.notes()  # the first cell says where commands run
    assert where.startswith("[sandbox: bubblewrap · writes to ") and "· no network ·" in where and "processes]" in where


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
    described = kernel.run("%sandbox --all").of_type("display_data")[0]["data"]["text/plain"]
    assert re.search(r"^restarts +0$", described, re.M)


def test_shutdown_ends_the_sandbox(kernel):
    kernel.run("sleep 600 &")
    bwrap = [pid for pid in children(kernel.pid) if name(pid) == "bwrap"]
    assert bwrap, "the sandbox runs as a child of the kernel"
    inside = [p for pid in bwrap for p in descendants(pid)]
    kernel.close()
    assert wait_gone(bwrap + inside) == []


def test_a_failed_name_lookup_in_a_box_without_network_gets_a_hint(kernel):
    kernel.run("true")
    lookup = kernel.run("python3 -c \"import socket; socket.getaddrinfo('example.org', 443)\"")
    assert lookup.status == "error" and "name resolution" in lookup.text("stderr")
    assert "has no network" in lookup.notes() and "OWSANDBOX_NETWORK=1" in lookup.notes()
    other = kernel.run("ls /nowhere")  # a failure that is not the network's gets no hint
    assert other.status == "error" and other.notes() == ""


def test_a_notebook_in_tmp_itself_runs(tmp_path, monkeypatch):
    """Where many people try things first: the private state folder moves out of the workspace. As root,
    the kernel has a /tmp of its own (tests/private_tmp.py): its sandbox's git check would otherwise change
    the repositories of the tests running beside it."""
    from jupyter_core.paths import jupyter_runtime_dir

    from owsandbox.kernelspec import kernel_argv

    from .conftest import DEFAULT_KERNEL_NAME
    from .kernel_session import KernelSession
    from .private_tmp import private_tmp

    spec = tmp_path / "specs" / "kernels" / "owsandbox-test-private-tmp"
    spec.mkdir(parents=True)
    shown = json.loads((Path(os.environ["JUPYTER_PATH"].split(os.pathsep)[0]) / "kernels" / DEFAULT_KERNEL_NAME /
                        "kernel.json").read_text())
    project = Path(__file__).resolve().parents[1]  # the kernel's own code and environment may be in /tmp
    argv = [*private_tmp(project, Path(sys.prefix), Path(sys.executable)), *kernel_argv(sys.executable)]
    spec.joinpath("kernel.json").write_text(json.dumps({**shown, "argv": argv}))
    monkeypatch.setenv("JUPYTER_PATH", f"{tmp_path / 'specs'}{os.pathsep}{os.environ['JUPYTER_PATH']}")
    name = f"owsbx-in-tmp-{tmp_path.name}"
    # its connection file where the kernel sees it: jupyter_client would make it in this machine's /tmp
    Path(jupyter_runtime_dir()).mkdir(parents=True, exist_ok=True)
    connection_file = os.path.join(jupyter_runtime_dir(), f"kernel-{uuid.uuid4()}.json")
    session = KernelSession(Path("/tmp"), kernel_name=spec.name, connection_file=connection_file)
    try:
        if os.getuid() == 0:
            assert "pytest-of-" not in session.run("ls -A /tmp").text()  # its own /tmp
        ran = session.run(f"pwd; echo made > {name} && cat {name} && rm {name}")
        assert ran.status == "ok" and ran.text() == "/tmp\nmade\n", ran.outputs
    finally:
        session.close()


def test_two_kernels_under_one_inherited_kernel_id_get_a_sandbox_each(tmp_path):
    """KERNEL_ID is set for a gateway's kernel and inherited by what starts under it, as two papermill runs
    from a notebook there: each kernel (a temporary connection file each) gets its own box."""
    from .conftest import DEFAULT_KERNEL_NAME
    from .kernel_session import KernelSession

    inherited = {"KERNEL_ID": "3f0c8a52-5b1e-4d8f-9a51-2b7c1f0e9d44"}
    first = KernelSession(tmp_path, env=inherited, kernel_name=DEFAULT_KERNEL_NAME)
    try:
        second = KernelSession(tmp_path, env=inherited, kernel_name=DEFAULT_KERNEL_NAME)
        try:
            assert first.run("echo first > /tmp/whose").status == "ok"
            assert second.run("cat /tmp/whose 2>&1; echo second > /tmp/whose").text().startswith("cat: ")
            assert first.run("cat /tmp/whose").text() == "first\n"
            second.close()
            assert first.run("echo still").text() == "still\n"  # the other's shutdown ended its own box only
        finally:
            second.close()
    finally:
        first.close()
