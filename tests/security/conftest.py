"""The attacker: a bubblewrap sandbox started by root or by a plain user, with a cell's code in it.

Every isolation promise is tested both ways. As root (CI) the test creates a plain user with
`useradd` for the second way; run by a plain user, the `root` way is skipped and the `user` way is
the current user. The sandbox runs from a world-readable copy of the package under the system
Python, because a plain user may not be able to read the project's folder or its virtual env.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from owsandbox.host.bundle import build_runner_zipapp

from ..conftest import require_bwrap
from ..machine_lock import ensure_user, machine_lock, own_key
from ..plain_python import as_user

PROJECT = Path(__file__).resolve().parents[2]
PLAIN_USER = "owsbx-attacker"
SYSTEM_PYTHON = "/usr/bin/python3"


def plain_user() -> pwd.struct_passwd:
    """A user with no privileges: made here when the tests run as root, else the current user."""
    if os.getuid() != 0:
        return pwd.getpwuid(os.getuid())
    return ensure_user(PLAIN_USER)


@pytest.fixture(scope="session")
def readable_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package, the runner and the attacker script where any user can read them."""
    base = Path(tempfile.mkdtemp(prefix="owsbx-code-"))
    os.chmod(base, 0o755)
    shutil.copytree(PROJECT / "owsandbox", base / "owsandbox", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(Path(__file__).with_name("box_attacker.py"), base / "box_attacker.py")
    build_runner_zipapp(base / "dist")
    for root, folders, files in os.walk(base):
        for name in folders:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    yield base
    shutil.rmtree(base, ignore_errors=True)


class Attacker:
    """One sandbox, started by `who`, and the code run in it. Answers are JSON from box_attacker."""

    def __init__(self, who: str, code: Path, home: Path, env: dict[str, str], wrapper: tuple[str, ...] = (),
                 outer: tuple[str, ...] = (), python: str | None = None) -> None:
        self.who = who
        self.home = home
        # python: the host's (the kernel's) own Python, the system's unless a test gives another
        python = python or (SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else shutil.which("python3") or "python3")
        argv = [*wrapper, python, "-B", str(code / "box_attacker.py")]  # wrapper: run as `who`, around it
        full_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(code),
                    "LANG": "C.UTF-8", **env}
        if who == "user" and os.getuid() == 0:
            argv = as_user(PLAIN_USER, argv, full_env)
        argv = [*outer, *argv]  # outer: run as root around it all (`ip netns exec NAME`)
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env=full_env, cwd="/", start_new_session=True)
        self.runner = str(next((code / "dist").glob("runner-*.pyz")))

    def step(self, **step: Any) -> dict[str, Any]:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps(step) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the attacker's host process ended (exit {self.process.wait()})"
        return json.loads(line)

    def start(self, cwd: Path | str, **options: Any) -> dict[str, Any]:
        answer = self.step(start={"cwd": str(cwd), "runner_path": self.runner, **options})
        assert answer.get("started"), answer
        return answer

    def run(self, command: str, timeout: float = 60) -> dict[str, Any]:
        return self.step(run=command, timeout=timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.step(close=True)
            except (AssertionError, OSError, ValueError):
                pass
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def kill(self) -> None:
        """The host process dies at once, as a kernel killed with SIGKILL does (with `runuser` above it)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@pytest.fixture(params=["root", "user"])
def who(request: pytest.FixtureRequest) -> str:
    require_bwrap()
    if request.param == "root" and os.getuid() != 0:
        pytest.skip("the root half runs where the tests run as root (CI)")
    return request.param


@pytest.fixture
def owner(who: str) -> Iterator[pwd.struct_passwd]:
    """The attacker's account. The plain user's half holds the machine's lock on that user for the whole
    test: its processes count against every limit the kernel counts per user (a fork bomb's processes, say,
    under RLIMIT_NPROC), so another worker's or another run's test as the same user would share them."""
    if who == "root":
        yield pwd.getpwuid(0)
        return
    with machine_lock("plain-user"):
        yield plain_user()


@pytest.fixture
def home(owner: pwd.struct_passwd) -> Iterator[Path]:
    """A home folder of the attacker's own, with secrets in it, in place of the real one."""
    folder = Path(tempfile.mkdtemp(prefix="owsbx-home-"))
    (folder / ".ssh").mkdir()
    (folder / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (folder / ".aws").mkdir()
    (folder / ".aws" / "credentials").write_text("aws_secret_access_key = SECRET\n")
    (folder / ".bashrc").write_text("# the user's own\n")
    (folder / "project").mkdir()
    for root, folders, files in os.walk(folder):
        for name in [*folders, *files, "."]:
            os.chown(os.path.join(root, name), owner.pw_uid, owner.pw_gid)
    os.chmod(folder, 0o700)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def marker() -> Iterator[Path]:
    """Where a program the box planted would leave its mark if the host ran it: the host's /tmp, which the
    box's own /tmp hides, so only a program run outside the box can write it."""
    path = Path(tempfile.gettempdir()) / f"owsbx-planted-{uuid.uuid4().hex}"
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def project(home: Path) -> Path:
    """The workspace in the attacker's home (its owner's)."""
    return home / "project"


@pytest.fixture
def attacker_factory(who: str, readable_copy: Path, home: Path) -> Iterator[Any]:
    made: list[Attacker] = []

    def make(wrapper: tuple[str, ...] = (), outer: tuple[str, ...] = (), python: str | None = None,
             **env: str) -> Attacker:
        attacker = Attacker(who, readable_copy, home, env, wrapper, outer, python)
        made.append(attacker)
        return attacker

    yield make
    for attacker in made:
        attacker.close()


@pytest.fixture
def attacker(attacker_factory: Any, home: Path) -> Attacker:
    found = attacker_factory()
    found.start(home / "project", linger_seconds=5)
    return found


# -- a rootful container (podman as root, Docker's root daemon), where root is the host's root ----------


@pytest.fixture(params=["podman", "docker"])
def rootful_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Rootful podman with the tests' containers.conf, or the session's dockerd. The rootful half only: a
    rootless engine's root is the kernel's own user."""
    from ..containers import engine_of

    if os.getuid() != 0:
        pytest.skip("the rootful half: run as root (CI)")
    return engine_of(request, monkeypatch)


@contextlib.contextmanager
def rootful_box(engine: Any, folder: Path, key: str) -> Iterator[tuple[Any, Any]]:
    """(provider, executor) of the `container` provider on `folder`, as root in the container, with
    the profile it extends on this machine; closed afterwards."""
    from owsandbox.host.isolation import container_seccomp
    from owsandbox.host.providers.container import ContainerProvider
    from owsandbox.host.workspace import RunnerWorkspace

    if container_seccomp.default_profile_path() is None:
        pytest.fail("the default seccomp profile to extend (containers-common's seccomp.json) is missing")
    provider = ContainerProvider(folder, image=engine.image(), engine=engine.path, key=own_key(key))
    workspace = RunnerWorkspace(provider, str(folder))
    try:
        assert workspace.executor.run("id -u")["output"] == "0\n"  # root in the container, root on the host
        yield provider, workspace.executor
    finally:
        workspace.close()

