"""Root in a rootful container (podman as root, Docker's root daemon) is root on the host, and the
workspace is the host's folder: a cell tries to leave a setuid root program there for any host user
to run. The container's seccomp profile (containers-common's default plus no setuid or setgid modes;
Docker's own default is built into dockerd, so the same file, in the same format, stands for it)
refuses every way of making one."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..plain_python import as_user
from .conftest import PLAIN_USER, plain_user, rootful_box
from .test_syscalls import python_in_box

pytestmark = [pytest.mark.timeout(300), pytest.mark.system]  # the first container test may build the image


@pytest.fixture
def engine(rootful_engine):
    return rootful_engine


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A workspace other host users may enter, as a course folder is."""
    folder = Path(tempfile.mkdtemp(prefix="owsbx-ctr-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_rootful_container_leaves_no_setuid_program_in_the_workspace(engine, shared_folder):
    with rootful_box(engine, shared_folder, "kernel-setuid-attack") as (provider, ex):
        attacks = ["cp /usr/bin/python3 ./py && chmod 4755 ./py", "cp /usr/bin/id ./id-u && chmod u+s ./id-u",
                   "cp /usr/bin/id ./id-g && chmod g+s ./id-g", "install -m 4755 /usr/bin/id ./id-i",
                   python_in_box("import os; os.open('made', os.O_CREAT | os.O_WRONLY, 0o4755)"),
                   python_in_box("import os; fd = os.open('.', os.O_TMPFILE | os.O_WRONLY, 0o2755); "
                                 "os.link(f'/proc/self/fd/{fd}', 'tmpfile')"),
                   python_in_box("import os, stat; os.mknod('node', stat.S_IFREG | 0o4755)"),
                   python_in_box("import os; fd = os.open('f', os.O_CREAT | os.O_WRONLY); os.fchmod(fd, 0o6755)")]
        for attack in attacks:
            done = ex.run(attack)
            assert "not permitted" in done["output"], (attack, done)
        setid = [str(p) for p in shared_folder.rglob("*") if p.lstat().st_mode & 0o6000]
        assert setid == [], setid
        # ordinary modes and files still work
        assert ex.run("chmod 755 ./py && ./py -c 'print(42)'")["output"] == "42\n"
        assert ex.run("install -m 755 /usr/bin/id ./id-plain && touch new && chmod 600 new && stat -c %a new"
                      )["output"] == "600\n"
        other = plain_user()
        ran = subprocess.run(as_user(PLAIN_USER, [str(shared_folder / "py"), "-c", "import os; print(os.geteuid())"]),
                             capture_output=True, text=True, timeout=60, cwd="/")
        assert ran.stdout.strip() == str(other.pw_uid), ran
        assert provider.state_dir is not None and (provider.state_dir / "seccomp.json").is_file()
        assert "and no setuid or setgid modes" in provider.describe()["privileges"]


def test_the_engines_default_profile_alone_lets_the_attack_through(engine, shared_folder):
    """The attack is real: a container with the engine's own default profile (built into dockerd, or
    podman's) and the same privileges otherwise makes the setuid copy, which a test removes at once."""
    control = shared_folder / "control"
    control.mkdir()
    try:
        engine.run("run", "--rm", "--network", "none", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                   "--mount", f"type=bind,source={control},destination=/w", "--entrypoint", "sh", engine.image(), "-c",
                   "cp /usr/bin/id /w/id && chmod 4755 /w/id")
        mode = (control / "id").stat()
        assert mode.st_mode & 0o4000 and mode.st_uid == 0, oct(mode.st_mode)
    finally:
        shutil.rmtree(control, ignore_errors=True)
