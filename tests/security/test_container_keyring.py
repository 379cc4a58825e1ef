"""The kernel's keyrings are not namespaced: root in a rootful container (podman as root, Docker's
root daemon) is the host's root to them, and containers-common's default seccomp profile allows
`keyctl`. A cell looks for a secret that the host's root keeps in its user keyring, readable by its
user, as a login's tools may leave one. The container's profile refuses the keyring calls, as
Docker's built-in default does; the control shows containers-common's profile alone lets the read
through. The rootful half only, as tests/security/test_container_setuid.py: a rootless engine's
root is the kernel's own user."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from owsandbox.host.isolation import container_seccomp

from .conftest import rootful_box
from .test_syscalls import answers, python_in_box

pytestmark = [pytest.mark.timeout(300), pytest.mark.system]

SECRET = "HOST-ROOT-KEYRING-SECRET"
KEYCTL, KEYCTL_DESCRIBE, KEYCTL_SEARCH, KEYCTL_READ = 250, 6, 10, 11  # x86_64
KEY_SPEC_USER_KEYRING = -4


@pytest.fixture
def engine(rootful_engine):
    if os.uname().machine != "x86_64":
        pytest.skip("the attack's system-call numbers are x86_64's")
    return rootful_engine


@pytest.fixture
def host_secret() -> Iterator[str]:
    """A key in the host root's user keyring that its user may read (possessor all, user view and read),
    revoked and unlinked afterwards."""
    if not shutil.which("keyctl"):
        if os.environ.get("CI"):
            pytest.fail("CI must have keyutils (keyctl)")
        pytest.skip("keyutils (keyctl) is not installed")
    name = f"owsbx-ctr-{os.getpid()}"
    made = subprocess.run(["keyctl", "add", "user", name, SECRET, "@u"], capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    try:
        subprocess.run(["keyctl", "setperm", key, "0x3f030000"], check=True, timeout=30)
        yield name
    finally:
        subprocess.run(["keyctl", "revoke", key], capture_output=True, timeout=30)
        subprocess.run(["keyctl", "unlink", key, "@u"], capture_output=True, timeout=30)


def reach_for(name: str) -> str:
    """A box command: find the key in the user keyring, describe it, read it; prints each [result, errno]
    and what was read."""
    return python_in_box("\n".join([
        "import ctypes, json", "libc = ctypes.CDLL(None, use_errno=True)", "libc.syscall.restype = ctypes.c_long",
        "buf = ctypes.create_string_buffer(256)", "done = {}",
        f"ctypes.set_errno(0); key = libc.syscall({KEYCTL}, {KEYCTL_SEARCH}, {KEY_SPEC_USER_KEYRING}, b'user', "
        f"{name.encode()!r}, 0); done['search'] = [key, ctypes.get_errno()]",
        f"ctypes.set_errno(0); done['describe'] = [libc.syscall({KEYCTL}, {KEYCTL_DESCRIBE}, key, buf, 256), "
        "ctypes.get_errno()]",
        f"ctypes.set_errno(0); n = libc.syscall({KEYCTL}, {KEYCTL_READ}, key, buf, 256); "
        "done['read'] = [n, ctypes.get_errno()]; done['text'] = buf.raw[:max(n, 0)].decode(errors='replace')",
        "print(json.dumps(done))"]))


def test_a_rootful_container_cannot_reach_the_host_roots_keyring(engine, host_secret, tmp_path):
    with rootful_box(engine, tmp_path, "kernel-keyring-attack") as (provider, ex):
        done = answers(ex.run(reach_for(host_secret)))
        assert done["search"] == [-1, 1] and done["describe"] == [-1, 1] and done["read"] == [-1, 1], done
        assert SECRET not in str(done)
        assert "no kernel keyrings" in provider.describe()["privileges"]
    kept = subprocess.run(["keyctl", "search", "@u", "user", host_secret], capture_output=True, text=True, timeout=30)
    assert kept.returncode == 0  # the host's key is as it was


def test_the_default_profile_alone_lets_the_container_read_it(engine, host_secret):
    """The attack is real: containers-common's profile, the same privileges otherwise, reads the secret
    (Docker's built-in default would refuse keyctl; the file is what the provider extends for both)."""
    profile = container_seccomp.default_profile_path()
    if profile is None:
        pytest.fail("the default seccomp profile (containers-common's seccomp.json) is missing")
    said = engine.run("run", "--rm", "--network", "none", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                      "--security-opt", f"seccomp={profile}", "--entrypoint", "sh", engine.image(), "-c",
                      reach_for(host_secret))
    done = answers({"exit_code": said.returncode, "output": said.stdout})
    assert done["search"][0] > 0 and done["text"] == SECRET, done
