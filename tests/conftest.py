"""Shared fixtures: a real daemon from the real zipapp, reached through a real relay."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from owsandbox.host.bundle import build_runner_zipapp
from owsandbox.host.client import RunnerClient
from owsandbox.host.providers.bwrap import BwrapProvider
from owsandbox.host.providers.exec import ExecProvider
from owsandbox.host.providers.local import LocalProvider

from .machine_lock import machine_lock

UNIT_RULE = "a unit test must start no process and open no socket"


class ImpureUnitTest(RuntimeError):
    """A test marked `unit` started a process or opened a socket."""


_FAILED = pytest.StashKey[bool]()  # the test's setup or call failed (a refusal that was not swallowed, say)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report = yield
    if report.when in ("setup", "call") and report.failed:
        item.stash[_FAILED] = True
    return report


def _unit_refusals() -> list[tuple[Any, str, str]]:
    """(owner, attribute, what it is) for every way a test could start a process or open a socket."""
    import _posixsubprocess
    import multiprocessing.process
    import pty
    import socket
    import subprocess

    found: list[tuple[Any, str, str]] = [
        (subprocess.Popen, "__init__", "subprocess.Popen"),
        (_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec"),
        (pty, "fork", "pty.fork"), (socket.socket, "__init__", "socket.socket"),
        (multiprocessing.process.BaseProcess, "start", "multiprocessing start"),
    ]
    found += [(os, name, f"os.{name}") for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")
              if hasattr(os, name)]
    return found


@pytest.fixture(autouse=True)
def _unit_purity(request: pytest.FixtureRequest) -> Iterator[None]:
    """For a test marked `unit`: every process start and socket (a socketpair too) fails with UNIT_RULE,
    from its function-scoped fixtures to their teardown; a refusal the code under test swallowed still
    fails the test. Temporary files and threads are fine."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    refused: list[str] = []

    def refusal(what: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            message = f"{request.node.nodeid}: {UNIT_RULE} ({what} was called)"
            refused.append(message)
            raise ImpureUnitTest(message)
        return refuse

    def zmq_refusal(original: Any, what: str) -> Any:
        def bind_or_connect(self: Any, address: str, *args: Any, **kwargs: Any) -> Any:
            if str(address).startswith("inproc://"):
                return original(self, address, *args, **kwargs)
            return refusal(f"{what} {address}")()
        return bind_or_connect

    with pytest.MonkeyPatch.context() as patch:
        for owner, name, what in _unit_refusals():
            patch.setattr(owner, name, refusal(what))
        zmq = sys.modules.get("zmq")
        if zmq is not None:  # a zmq socket in process (inproc://) is fine
            for name in ("bind", "connect"):
                patch.setattr(zmq.Socket, name, zmq_refusal(getattr(zmq.Socket, name), f"zmq {name}"))
        yield
    if refused and not request.node.stash.get(_FAILED, False):
        pytest.fail(refused[0], pytrace=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Install what the selected tests need (`needs` marks, tests/prepare.py) and is missing, before the
    first test: an install never counts against a test's timeout. .ci/run makes them beforehand."""
    if session.config.option.collectonly:
        return
    needed = sorted({name for item in session.items for mark in item.iter_markers("needs") for name in mark.args})
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else print
    images = any(IMAGE_FIXTURES & set(getattr(item, "fixturenames", ())) for item in session.items)
    if not needed and not images:
        return
    with machine_lock("prepare"):  # every worker collects; the first installs, the others find it made
        marked = {mark for item in session.items for mark in ("needs_owsandbox_image", "needs_singleuser_image")
                  if item.get_closest_marker(mark)} if images else set()
        _prepare(needed, "needs_owsandbox_image" in marked, images, say,
                 singleuser_image="needs_singleuser_image" in marked)


def _prepare(needed: list[str], owsandbox_image: bool, images: bool, say: Any, singleuser_image: bool = False) -> None:
    from . import prepare

    for name in needed:
        made, make = prepare.NEEDS[name]
        if made():
            continue
        say(f"tests/prepare.py: installing {prepare.what(name)} before the tests (.ci/run makes it beforehand)")
        try:
            make()
        except RuntimeError as exc:  # the tests that need it fail with the command that makes it
            say(f"tests/prepare.py: {exc}")
    if images:
        _build_test_images(owsandbox_image, say, singleuser_image)


# Fixtures whose tests run containers of the test images (tests/containers.py).
IMAGE_FIXTURES = {"podman", "debian_image", "debian_container", "docker"}


def _build_test_images(owsandbox: bool, say: Any, singleuser: bool = False) -> None:
    """Build the container images the selected tests use (debootstrap, about a minute; the owsandbox
    and single-user images stage their dependencies with pip) before the first test, when they are
    missing and this machine can build them; else the fixtures skip or fail as they say."""
    from .containers import Podman, _tool

    if os.geteuid() != 0 or any(_tool(tool) is None for tool in ("podman", "runc", "debootstrap")):
        return
    with tempfile.TemporaryDirectory(prefix="owsandbox-images-") as folder:
        podman = Podman(Path(folder))
        if podman.has_images(owsandbox, singleuser):
            return
        say("tests/conftest.py: building the test images before the tests (podman, debootstrap"
            + (", and owsandbox's with its dependencies" if owsandbox else "")
            + (", and the JupyterHub single-user server's" if singleuser else "") + ")")
        try:
            podman.image()
            if owsandbox:
                podman.owsandbox_image()
            if singleuser:
                podman.singleuser_image()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # the fixtures say it again
            say(f"tests/conftest.py: the test images could not be built: {exc}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    both = [item.nodeid for item in items if item.get_closest_marker("unit") and item.get_closest_marker("system")]
    if both:
        raise pytest.UsageError(f"marked both unit and system: {', '.join(both)}")


@pytest.fixture(scope="session")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_runner_zipapp(tmp_path_factory.mktemp("dist"))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


@pytest.fixture
def fresh_runtime() -> Iterator[str]:
    """A runtime folder this runner version has never met (short, for the socket paths in it)."""
    runtime = tempfile.mkdtemp(prefix="ows-rt-")
    try:
        yield runtime
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def require_bwrap() -> None:
    """Skip on a developer's machine without bubblewrap; in CI its absence is a failure."""
    from owsandbox.host.providers import bwrap_problem

    problem = bwrap_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to run bubblewrap: {problem}")
        pytest.skip(problem)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    """A real sshd on 127.0.0.1 with a host key and a user key made here; yields the ssh command
    prefix that logs in as this user with that key."""
    from .sshd_server import SSHD, loopback_sshd

    if not os.path.exists(SSHD) or not shutil.which("ssh"):
        if os.environ.get("CI"):
            pytest.fail("CI must have openssh-server and ssh installed")
        pytest.skip("openssh-server is not installed")
    with loopback_sshd(tmp_path_factory.mktemp("sshd")) as prefix:
        yield prefix


@pytest.fixture(scope="session")
def shared_sshd(sshd: list[str], tmp_path_factory: pytest.TempPathFactory):
    """The `sshd` prefix with its sessions over one shared connection (ssh's ControlMaster): how the
    runner suites reach their box over ssh, a connection per test costing a key exchange and a login
    each. The kernel tests over ssh (tests/test_provider_exec.py) log in anew for every session."""
    from .sshd_server import shared_connection

    with shared_connection(sshd, tmp_path_factory.mktemp("ssh-shared")) as prefix:
        yield prefix


@pytest.fixture(scope="session")
def opensandbox_execd(tmp_path_factory: pytest.TempPathFactory):
    """The project's own execd-compatible endpoint on 127.0.0.1, standing in for an OpenSandbox
    sandbox's execd (URL + X-EXECD-ACCESS-TOKEN); yields the server (`address()` has both)."""
    with _execd_server(tmp_path_factory, "execd") as server:
        yield server


@pytest.fixture(scope="session")
def opensandbox_release_execd(tmp_path_factory: pytest.TempPathFactory):
    """As `opensandbox_execd`, in release mode: the quirks of a released execd (v1.0.10 to v1.0.18:
    `command` ignored, no takeover, an ended program restarted by a new connection, `exit` before
    the last output, live stdout and stderr crossing, no list route); see tests/released_execd.py."""
    from .released_execd import ReleasedExecd

    with _execd_server(tmp_path_factory, "execd-release", server_class=ReleasedExecd) as server:
        yield server


# A running execd that the execd-backed tests can target besides the stand-ins: OpenSandbox's own
# (built from its source, docker/execd/v1.0.18, and run on this machine's loopback, so that it shares
# the filesystem the tests look at). The tests' own variables, not owsandbox settings.
EXTERNAL_EXECD_URL = "OWS_TEST_EXECD_URL"
EXTERNAL_EXECD_TOKEN = "OWS_TEST_EXECD_TOKEN"


class ExternalExecd:
    """An execd the tests did not start, named by `OWS_TEST_EXECD_URL` and `OWS_TEST_EXECD_TOKEN`:
    only its address is known (no white-box look at its sessions); the tests treat it as a released
    execd (the quirks of tests/released_execd.py may or may not show)."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def address(self) -> dict[str, str]:
        return {"url": self.url, "token": self.token}


@pytest.fixture(scope="session")
def external_execd() -> ExternalExecd:
    """The execd named by `OWS_TEST_EXECD_URL` (with its token in `OWS_TEST_EXECD_TOKEN`); skips, saying
    how to name one, when unset; fails when it is named but cannot be reached with that token."""
    from owsandbox.channel import ExecdControl, ExecdEndpoint
    from owsandbox.channel.endpoint import TOKEN_HEADER
    from owsandbox.channel.errors import ExecdError, ExecdNotFound

    url = os.environ.get(EXTERNAL_EXECD_URL, "").strip()
    if not url:
        pytest.skip(f"no external execd named: set {EXTERNAL_EXECD_URL} (e.g. http://127.0.0.1:44772) and "
                    f"{EXTERNAL_EXECD_TOKEN} to a released execd running on this machine to run this against it")
    token = os.environ.get(EXTERNAL_EXECD_TOKEN, "")
    if not token:
        pytest.fail(f"{EXTERNAL_EXECD_URL} names {url} but {EXTERNAL_EXECD_TOKEN} is not set: the tests need "
                    "its access token (execd --access-token)")
    try:  # reachable, with that token: an unknown session is a 404, a wrong token a 401
        ExecdControl(ExecdEndpoint(origin=url, headers={TOKEN_HEADER: token}), timeout=10).status("0" * 16)
    except ExecdNotFound:
        pass
    except (ExecdError, OSError) as exc:
        pytest.fail(f"the external execd {EXTERNAL_EXECD_URL}={url} cannot be used: {exc}")
    return ExternalExecd(url, token)


@pytest.fixture(params=["stand-in", "external"])
def released_execd(request: pytest.FixtureRequest) -> Any:
    """A released execd: the stand-in in release mode (`opensandbox_release_execd`), and the external
    one named by `OWS_TEST_EXECD_URL` (skipped when unset). Either has `address()`; only the stand-in
    has `sessions`."""
    return request.getfixturevalue("opensandbox_release_execd" if request.param == "stand-in" else "external_execd")


@contextmanager
def _execd_server(tmp_path_factory: pytest.TempPathFactory, folder: str, server_class: Any = None,
                  **options: Any) -> Iterator[Any]:
    """A started execd-compatible endpoint on 127.0.0.1 with a fresh token, stopped however its user ends."""
    import secrets

    from owsandbox.box.execd.endpoint import ExecdServer

    server = (server_class or ExecdServer)(secrets.token_urlsafe(18), tcp_host="127.0.0.1",
                                           cwd=str(tmp_path_factory.mktemp(folder)), **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory):
    """Podman as root with a containers.conf of the tests' own (see tests/containers.py); skips where
    podman or debootstrap is missing, fails so in CI."""
    from .containers import Podman, require_podman

    require_podman()
    return Podman(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="session")
def debian_image(podman) -> str:
    """A Debian 12 image with python3 and a marker file the host lacks; built once, then cached by podman."""
    return podman.image()


@pytest.fixture(scope="session")
def docker(podman):
    """A dockerd of the session's own (tests/containers.py: its own folders and socket, no bridge, no
    firewall rules), with the test images loaded from podman's when asked for; stopped, and its folder
    removed, when the session ends however it ends. Skips where Docker is missing, fails so in CI."""
    from .containers import Docker, require_docker

    require_docker()
    with Docker.started(podman) as started:
        yield started


@pytest.fixture
def debian_container(podman, debian_image: str):
    """A running container of `debian_image`, removed after the test; its name."""
    with podman.container(debian_image) as name:
        yield name


# The execd behind the `box` fixture's opensandbox params: the stand-in as execd's main branch, as
# a released execd (release mode), and the external execd named by OWS_TEST_EXECD_URL.
EXECD_OF_BOX = {"opensandbox": "opensandbox_execd", "opensandbox-release": "opensandbox_release_execd",
                "opensandbox-external": "external_execd"}


@pytest.fixture(params=["local", "bwrap", "ssh", "opensandbox", "opensandbox-external"])
def box(request: pytest.FixtureRequest, zipapp: Path, workspace: Path):
    """(provider, client) on a fresh daemon: plain, inside bubblewrap, over a real ssh, and through
    an execd endpoint as in an OpenSandbox sandbox (the stand-in, and an external execd when
    `OWS_TEST_EXECD_URL` names one); the relay never leaves on silence here."""
    with running(_provider(request, zipapp, workspace)) as pair:
        yield pair


def box_with_release(request: pytest.FixtureRequest, zipapp: Path, workspace: Path):
    """The `box` fixture's body, for modules that add "opensandbox-release" (a released execd, see
    `opensandbox_release_execd`) to its params: the whole runner suite through it would cost a minute,
    so a focused set of modules runs it."""
    with running(_provider(request, zipapp, workspace)) as pair:
        yield pair


@pytest.fixture(params=["local", "bwrap", "ssh"])
def pipe_box(request: pytest.FixtureRequest, zipapp: Path, workspace: Path):
    """As `box`, for the providers whose relay is a local process with a stdin of its own."""
    with running(_provider(request, zipapp, workspace)) as pair:
        yield pair


def _provider(request: pytest.FixtureRequest, zipapp: Path, workspace: Path) -> Any:
    provider: Any
    if request.param == "bwrap":
        require_bwrap()
        provider = BwrapProvider(cwd=workspace, runner_path=zipapp, relay_silence_seconds=0)
    elif request.param == "ssh":
        prefix = request.getfixturevalue("shared_sshd")
        provider = ExecProvider(prefix=prefix, box_cwd=str(workspace), relay_silence_seconds=0)
    elif request.param in EXECD_OF_BOX:
        from owsandbox.channel.endpoint import TOKEN_HEADER
        from owsandbox.host.providers.opensandbox import OpenSandboxProvider

        address = request.getfixturevalue(EXECD_OF_BOX[request.param]).address()
        provider = OpenSandboxProvider(url=address["url"], headers={TOKEN_HEADER: address["token"]},
                                       box_cwd=str(workspace), relay_silence_seconds=0)
    else:
        provider = LocalProvider(cwd=workspace, runner_path=zipapp, relay_silence_seconds=0)
    return provider


@contextmanager
def running(provider: Any, reconnect_timeout: float = 20.0) -> Iterator[tuple[Any, RunnerClient]]:
    """Create the sandbox, connect a client (pinging often), and end both afterwards, whatever happens."""
    provider.create()
    client = RunnerClient(provider.open_runner, ping_seconds=0.5, reconnect_timeout=reconnect_timeout)
    try:
        client.connect()
        yield provider, client
    finally:
        client.close()
        provider.destroy()


KERNEL_NAME = "owsandbox-test"  # the local provider: the host's view of pids and folders, for white-box tests
DEFAULT_KERNEL_NAME = "owsandbox-test-default"  # no provider named: what a user gets (auto)


@pytest.fixture(scope="module")
def module_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernel-ws")


@contextmanager
def kernel_in(folder: Path, kernel_name: str | None = None, env: dict[str, str] | None = None) -> Iterator[Any]:
    """A kernel (local sandbox, or the kernelspec named) working in `folder`, shut down however the test ends."""
    from .kernel_session import KernelSession

    session = KernelSession(folder, kernel_name=kernel_name or KERNEL_NAME, env=env)
    try:
        yield session
    finally:
        session.close()


@pytest.fixture(scope="module")
def module_kernel(module_workspace: Path):
    """One kernel shared by a test module's tests, working in `module_workspace`."""
    with kernel_in(module_workspace) as session:
        yield session


@pytest.fixture
def fresh_kernel(tmp_path: Path):
    """A kernel of its own (local sandbox, working in the test's folder), shut down after the test."""
    with kernel_in(tmp_path) as session:
        yield session


@pytest.fixture
def default_kernel(tmp_path: Path):
    """A kernel as a user gets it, with no provider named (bubblewrap here), working in the test's folder."""
    require_bwrap()
    with kernel_in(tmp_path, kernel_name=DEFAULT_KERNEL_NAME) as session:
        yield session


def pytest_configure(config: pytest.Config) -> None:
    """A kernelspec for the kernel under test, found through JUPYTER_PATH by every Jupyter client
    that the tests start (jupyter_client, jupyter_kernel_test, nbclient, jupyter console); and the
    `needs` mark."""
    config.addinivalue_line("markers", "needs(name, ...): a program from tests/prepare.py that the session installs "
                                       "before its first test when it is missing (outside every test's timeout)")
    config.addinivalue_line("markers", "needs_owsandbox_image: the session builds tests/containers.py's owsandbox "
                                       "image before its first test when it is missing")
    config.addinivalue_line("markers", "needs_singleuser_image: the session builds tests/containers.py's JupyterHub "
                                       "single-user image before its first test when it is missing")
    if (config.getoption("markexpr", "") or "").strip() == "unit":
        from . import fuzz_budget  # the fast tier tries fewer examples per property

        fuzz_budget.scale = fuzz_budget.FAST_TIER_SCALE
    import json
    import os
    import sys
    import tempfile

    from owsandbox.kernelspec import kernel_argv

    root = Path(tempfile.mkdtemp(prefix="owsandbox-kernelspec-"))
    for name, env in ((KERNEL_NAME, {"OWSANDBOX_PROVIDER": "local"}), (DEFAULT_KERNEL_NAME, {})):
        spec = root / "kernels" / name
        spec.mkdir(parents=True)
        spec.joinpath("kernel.json").write_text(json.dumps({
            "argv": kernel_argv(sys.executable),
            "display_name": f"Sandbox ({name})", "language": "bash", "interrupt_mode": "message", "env": env,
        }))
    os.environ["JUPYTER_PATH"] = str(root) + (os.pathsep + os.environ["JUPYTER_PATH"] if os.environ.get("JUPYTER_PATH")
                                              else "")
    config._owsandbox_kernelspec_root = root  # type: ignore[attr-defined]
    _spread_over_workers(config)
    _interruptible_children()


def _interruptible_children() -> None:
    """Let the shells the tests start get SIGINT and SIGQUIT.

    A shell without job control starts `pytest ... &` with both ignored, and an ignored signal stays
    ignored through every fork and exec: the bash sessions that the tests' own execd endpoints start in
    this process would then sleep through a SIGINT (a test of Ctrl-C fails, not the product). The box's
    daemon handles SIGINT itself, so what it starts gets the default; here this process does the same."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


# `-n auto` (pyproject's addopts) runs the suite in six workers, a module at a time in each
# (tests/scheduling.py). On 2 cores, back to back on one tree: 785 s of pytest in four workers and 698 s
# in six, the CPU busy 99% of that run (many tests wait: a cell's timeout, a server's start, a browser).
# `-n 0` runs it in this process.
WORKERS = 6


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many workers `-n auto` (pyproject's addopts) starts: one per core for the unit tier, whose
    tests only compute (84 s in one process on 2 slow cores, 59 s in two); WORKERS for anything else,
    whose tests mostly wait. `-n N` on the command line says otherwise, `-n 0` runs in this process
    (for pdb, say)."""
    if (config.getoption("markexpr") or "").strip() == "unit":
        return max(1, min(os.cpu_count() or 1, WORKERS))
    return WORKERS


def _spread_over_workers(config: pytest.Config) -> None:
    """A module (or an `xdist_group`) at a time, the longest first: tests/scheduling.py."""
    from .scheduling import Units

    config.pluginmanager.register(Units(config), "owsandbox-units")


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    root = getattr(config, "_owsandbox_kernelspec_root", None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
