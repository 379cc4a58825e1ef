"""The exec provider against a real container (`podman exec -i NAME`), whose files are not the host's.

The ssh tests reach this same machine, where the notebook's folder exists; a container has folders of
its own, so nothing of the host's may be sent into it: commands start in the box's home (or
OWSANDBOX_BOX_CWD) and the kernel works there. The images come from tests/containers.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from owsandbox.host.executor import RunnerExecutor
from owsandbox.host.providers.exec import BoxError, ExecProvider
from owsandbox.host.workspace import RunnerWorkspace

from .conftest import DEFAULT_KERNEL_NAME
from .containers import IMAGE, MARKER
from .kernel_session import KernelSession

# The first test builds the image with debootstrap (about a minute, more on a slow mirror); later runs find it.
pytestmark = [pytest.mark.timeout(900), pytest.mark.system]


def _exec_kernel(workspace: Path, podman, container: str, **env: str) -> KernelSession:
    return KernelSession(workspace, kernel_name=DEFAULT_KERNEL_NAME,
                         env={**podman.env, "OWSANDBOX_PROVIDER": "exec",
                              "OWSANDBOX_EXEC": shlex.join(podman.exec_prefix(container)),
                              "OWSANDBOX_BOX_CWD": "", **env})


def test_the_runner_works_in_the_container_in_its_own_folders(podman, debian_container, tmp_path):
    assert not Path(MARKER).exists()  # the host lacks the image's marker: what the box sees is the box's
    podman.exec(debian_container, "mkdir", "/srv/only-in-the-box")
    for box_cwd, expected in (("", "/root"), ("/srv/only-in-the-box", "/srv/only-in-the-box")):
        provider = ExecProvider(prefix=podman.exec_prefix(debian_container), box_cwd=box_cwd,
                                relay_silence_seconds=0)
        workspace = RunnerWorkspace(provider, str(tmp_path))  # the host's folder, which the box has not
        try:
            ran = workspace.executor.run(f"cat {MARKER}; pwd")
            assert ran["exit_code"] == 0, ran
            assert ran["output"] == f"{IMAGE}\n{expected}\n"
            assert workspace.host_cwd == str(tmp_path) and workspace.cwd == expected
            other = RunnerExecutor(workspace.client, shell="other")  # a shell started without a folder
            assert other.run("pwd")["output"] == f"{expected}\n"
        finally:
            workspace.close()


def test_the_kernel_works_in_a_container_without_the_notebook_folder(podman, debian_container, tmp_path):
    podman.exec(debian_container, "touch", "/root/made-in-the-box.txt")
    kernel = _exec_kernel(tmp_path, podman, debian_container)

    def matches(code: str) -> list[str]:
        kernel.kc.complete(code, len(code))
        return kernel.kc.get_shell_msg(timeout=30)["content"]["matches"]

    try:
        first = kernel.run("pwd")
        assert first.status == "ok", first.outputs
        assert first.text() == "/root\n"
        assert first.notes() == f"[sandbox: exec: podman exec -i {debian_container} · starts in /root of the box]\n"
        described = kernel.run("%sandbox")
        assert described.status == "ok", described.outputs
        table = described.of_type("display_data")[0]["data"]["text/plain"]
        assert "/root" in table and str(tmp_path) in table  # the box's folder, and the host's apart
        assert kernel.run("%shell fresh").status == "ok"  # a shell with no folder yet: the box's, not the host's
        assert matches("cat made-in") == ["made-in-the-box.txt"]
        assert kernel.run("pwd").text() == "/root\n"
        assert kernel.run("cd /tmp && touch made-in-tmp.txt").status == "ok"
        assert kernel.run("pwd").text() == "/tmp\n"
        assert matches("cat made-in") == ["made-in-tmp.txt"]
        assert matches("ls /etc/owsandbox-te") == [MARKER]
        assert kernel.run("%ls").status == "ok"
        started = kernel.run("%attach -- cat")  # in the shell's folder in the box, through the forward bridge
        assert started.status == "ok", started.outputs
        answer = kernel.run('%send {"id": 1, "text": "in the box"}')
        assert answer.of_type("display_data")[0]["data"]["application/json"]["text"] == "in the box"
        kernel.run("%attach --kill")
    finally:
        kernel.close()


def test_a_box_whose_python3_lacks_json_is_a_clear_error(podman, tmp_path, opensandbox_execd):
    """Debian's python3-minimal, for real: the exec provider, the kernel and the OpenSandbox provider
    (its execd on this machine, its python3 the container's) name what is missing and what to install."""
    from owsandbox.channel.endpoint import TOKEN_HEADER
    from owsandbox.host.providers.opensandbox import OpenSandboxProvider

    with podman.container(podman.minimal_image()) as name:
        with pytest.raises(BoxError) as raised:
            ExecProvider(prefix=podman.exec_prefix(name)).create()
        message = str(raised.value)
        assert "python3 lacks the modules" in message and " json," in message and "install python3" in message
        assert "Traceback" not in message
        python = tmp_path / "box-python3"
        python.write_text(f"#!/bin/sh\nexec {shlex.join(podman.exec_prefix(name))} python3 \"$@\"\n")
        python.chmod(0o755)
        address = opensandbox_execd.address()
        with pytest.raises(BoxError) as raised:
            OpenSandboxProvider(url=address["url"], headers={TOKEN_HEADER: address["token"]},
                                python=str(python)).create()
        assert " json," in str(raised.value) and "install python3" in str(raised.value)
        kernel = _exec_kernel(tmp_path, podman, name)
        try:
            first = kernel.run("echo hi")
            assert first.status == "error" and first.error["ename"] == "SandboxUnavailable"
            assert "python3-minimal" in first.error["evalue"] and "install python3" in first.error["evalue"]
        finally:
            kernel.close()
