"""OpenSandbox's own server (`opensandbox-server` from PyPI) for tests, on the tests' dockerd.

The server takes execd from a local image (`[runtime] execd_image`): it reads `/execd` and
`/bootstrap.sh` out of it, copies both into each sandbox under `/opt/opensandbox/` and runs the sandbox
with the entrypoint `/opt/opensandbox/bootstrap.sh` and the request's entrypoint as its arguments.
OpenSandbox's execd is a Go program that no package registry carries, so the image made here puts
the project's own execd-compatible endpoint there instead, as a released execd behaves
(`ProxyingExecd`, tests/released_execd.py: `ReleasedExecd` with execd's reverse proxy):

* `/execd`: a shell line that runs python3 on the file itself, followed by the box's zipapp with
  tests/released_execd.py added (Python reads a zip archive with anything before it). It serves on
  0.0.0.0:44772 with no access token, as the server's Docker runtime starts execd (it has no secure
  access). Its output is not held back
  (`lag=0`): the crossing of stdout and stderr that the lag plays is tested elsewhere
  (tests/test_provider_opensandbox.py), and here a cell's round trip is measured.
* `/bootstrap.sh`: starts `/opt/opensandbox/execd` in the background, then `exec "$@"`.

The network, host mode: the tests' dockerd has no bridge, no firewall rules and no userland proxy (the
host's firewall and network stay as they are), so the server runs with `[docker] network_mode =
"host"`: each sandbox shares the host's network and execd is at `127.0.0.1:44772` (a port of the host,
so one such server at a time on a machine: a lock file makes a second test run wait).

Bridge mode, the server's default, where it publishes each sandbox's execd port and the endpoint is
execd proxying to itself (`127.0.0.1:PORT/proxy/44772`): on a dockerd started with a bridge in a
network namespace of its own and port publishing through docker-proxy (`Docker.started(podman,
bridge=..., publish=True)`, still no iptables rule anywhere), the server runs in that namespace too
(nsenter), so its `127.0.0.1` is the namespace's, where docker-proxy listens. Its clients (the kernel,
the tests' own requests) run or connect there. That dockerd stands in for a host's Docker; on the
tests' plain dockerd (`--bridge=none`) the server still makes the sandbox, with nothing behind its
endpoint.

The server itself runs from a virtual environment of its own (its pins are not ours):
`.venv-opensandbox-server`, pinned in tests/requirements/opensandbox-server.txt and made by
tests/prepare.py (`.ci/run`, or the test session before its first test), or the program
`OWSANDBOX_TEST_OPENSANDBOX_SERVER` names.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from owsandbox.host.bundle import zipapp_bytes

from .gateway_hosts import socket_in
from .ports import free_port
from .prepare import ENVIRONMENTS, what
from .waiting import WaitTimeout, patience, wait_until

ROOT = Path(__file__).resolve().parents[1]
SERVER_ENV = "OWSANDBOX_TEST_OPENSANDBOX_SERVER"
SERVER = ENVIRONMENTS["opensandbox-server"]
EXECD_PORT = 44772
PORT_WAIT_SECONDS = 60  # for EXECD_PORT to be free, on a quiet machine (stretched by the load)
PORT_TRIES = 5  # free ports tried for the server's own, each free a moment before it binds it
API_KEY = "owsandbox-test-key"
#: The released execd whose behaviour the image's execd plays (tests/released_execd.py RELEASE_QUIRKS).
EXECD_RELEASE = "v1.0.18"

#: `/execd`: the shell runs its first lines only; python3 then reads the zipapp that follows them.
EXECD_HEAD = f"""#!/bin/sh
# OpenSandbox's execd, played by owsandbox's execd-compatible endpoint (the zip archive below).
exec python3 -S -c '
import sys, threading
sys.path.insert(0, sys.argv[1])
from released_execd import ProxyingExecd
class Open(ProxyingExecd):
    def _authorized(self, request):  # the Docker runtime starts execd with no access token
        return True
server = Open("unused", tcp_host="0.0.0.0", tcp_port={EXECD_PORT}, cwd="/", release="{EXECD_RELEASE}", lag=0.0)
server.start()
print("execd listening on", server.tcp_port, flush=True)
threading.Event().wait()
' "$0" "$@"
"""

BOOTSTRAP = """#!/bin/sh
# The sandbox's first process: execd in the background, then the sandbox's own entrypoint.
/opt/opensandbox/execd >/tmp/execd.log 2>&1 &
exec "$@"
"""


def execd_program() -> bytes:
    """`/execd`: EXECD_HEAD, then the box's zipapp with the released execd's module added."""
    buffer = io.BytesIO()
    box_zip = io.BytesIO(zipapp_bytes()[1])
    with zipfile.ZipFile(box_zip) as box, zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as out:
        for info in box.infolist():
            out.writestr(info, box.read(info))
        out.writestr("released_execd.py", (Path(__file__).parent / "released_execd.py").read_bytes())
    return EXECD_HEAD.encode() + buffer.getvalue()


def server_program() -> str | None:
    """The server's program: $OWSANDBOX_TEST_OPENSANDBOX_SERVER, else the one in .venv-opensandbox-server."""
    named = os.environ.get(SERVER_ENV)
    if named:
        return named
    return str(SERVER.program) if SERVER.made() else None


def require_server() -> str:
    """The server's program; a skip where it is not installed, a failure so in CI."""
    program = server_program()
    if program is None:
        why = f"opensandbox-server is not installed ({what(SERVER.name)}: run `{SERVER.command}`, or set {SERVER_ENV})"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run OpenSandbox's server: {why}")
        pytest.skip(why)
    return program


def build_execd_image(docker: Any, bootstrap: str = BOOTSTRAP) -> str:
    """The execd image on `docker` (from the Debian test image, which has `tail` for the server's
    copying container), built when this runner's version has none yet; `bootstrap` is its
    `/bootstrap.sh`."""
    program = execd_program()
    tag = hashlib.sha256(program + bootstrap.encode()).hexdigest()[:12]
    name = f"localhost/owsandbox-test-execd:{tag}"
    if docker.has_image(name):
        return name
    base = docker.image()
    with tempfile.TemporaryDirectory(prefix="owsbx-execd-image-") as folder:
        context = Path(folder)
        (context / "execd").write_bytes(program)
        (context / "bootstrap.sh").write_text(bootstrap)
        for path in (context / "execd", context / "bootstrap.sh"):
            path.chmod(0o755)
        (context / "Dockerfile").write_text(f"FROM {base}\nCOPY execd bootstrap.sh /\n")
        docker.run("build", "--quiet", "--network", "none", "--tag", name, str(context), timeout=300)
    return name


def _port_free(port: int) -> bool:
    """Whether a server could listen on `port` (as execd does: with SO_REUSEADDR, past TIME_WAIT)."""
    with contextlib.closing(socket.socket()) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class OpenSandboxServer:
    """A running `opensandbox-server` on 127.0.0.1 with the Docker runtime in `network_mode` ("host" or
    "bridge"); in bridge mode on a dockerd in a network namespace (`docker.netns`), the server runs in
    that namespace and `netns` names it (its URL is the namespace's loopback: `request()` reaches it).

    `url` is its base URL, `api_key` its key, `docker` the dockerd it drives, `log()` its log.
    Sandboxes it made are removed (by their label) when it stops, however the test ended."""

    START_SECONDS = 60.0

    def __init__(self, program: str, docker: Any, execd_image: str, network_mode: str = "host") -> None:
        self.program, self.docker, self.execd_image = program, docker, execd_image
        self.network_mode = network_mode
        self.netns: str | None = docker.netns if network_mode == "bridge" else None
        self.folder = Path(tempfile.mkdtemp(prefix="owsbx-osb-server-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = API_KEY
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0

    def config(self) -> str:
        return "\n".join([
            "[server]", 'host = "127.0.0.1"', f"port = {self.port}", f'api_key = "{self.api_key}"',
            "timeout_graceful_shutdown = 1",  # its WebSockets open at the end need not hold it 5 s
            "[log]", 'level = "INFO"',
            "[runtime]", 'type = "docker"', f'execd_image = "{self.execd_image}"',
            "[store]", 'type = "sqlite"', f'path = "{self.folder / "opensandbox.db"}"',
            "[docker]", f'network_mode = "{self.network_mode}"', "",
        ])

    @classmethod
    @contextlib.contextmanager
    def started(cls, program: str, docker: Any, execd_image: str,
                network_mode: str = "host") -> Iterator[OpenSandboxServer]:
        # in host mode execd listens on the host's port 44772: one such server at a time on this machine
        with open(os.path.join(tempfile.gettempdir(), "owsandbox-test-opensandbox-44772.lock"), "a") as lock:
            if network_mode == "host":
                fcntl.flock(lock, fcntl.LOCK_EX)
            server = cls(program, docker, execd_image, network_mode)
            try:
                server.start()
                yield server
            finally:
                server.stop()

    def start(self) -> None:
        # Taken for a while is not taken for good: 44772 is in the kernel's ephemeral range, so any outgoing
        # connection of a busy machine may hold it as its own end (two test runs at once met that).
        if self.network_mode == "host":
            try:
                wait_until(lambda: _port_free(EXECD_PORT), patience(PORT_WAIT_SECONDS), f"port {EXECD_PORT} to be free",
                           interval=0.5)
            except WaitTimeout as exc:
                raise RuntimeError(f"port {EXECD_PORT} of this machine is taken: the sandboxes' execd (host network "
                                   f"mode) needs it ({exc})") from None
        env = {**os.environ, **self.docker.settings, "HOME": str(self.folder)}
        argv = [self.program, "--config", str(self.folder / "config.toml")]
        if self.netns is not None:  # nsenter, not `ip netns exec`, which remounts /sys
            argv = [shutil.which("nsenter") or "nsenter", f"--net=/run/netns/{self.netns}", *argv]
        setpriv = shutil.which("setpriv")
        if setpriv is not None:  # the server ends with the tests even when they are killed
            argv = [setpriv, "--pdeathsig", "TERM", "--", *argv]
        started = time.monotonic()
        for tries_left in reversed(range(PORT_TRIES)):
            (self.folder / "config.toml").write_text(self.config())
            with open(self.folder / "server.log", "wb") as log:
                self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                cwd=self.folder, env=env, start_new_session=True)
            if self._answers_or_port_taken(started):
                break
            if not tries_left:
                raise RuntimeError(f"opensandbox-server found each of {PORT_TRIES} ports taken at its start: "
                                   f"{self.log()}")
            # Its port, free a moment before, was taken by another process meanwhile: another one.
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
        self.start_seconds = time.monotonic() - started

    def _answers_or_port_taken(self, started: float) -> bool:
        """Wait until the server answers (True) or has ended because its port was taken (False); raise
        if it ended otherwise or did not answer in time."""
        assert self.process is not None
        while not self._healthy():
            if self.process.poll() is not None:
                if "address already in use" in self.log().lower() and self.netns is None:
                    return False
                raise RuntimeError(f"opensandbox-server ended at its start (status {self.process.returncode}): "
                                   f"{self.log()}")
            if time.monotonic() - started > patience(self.START_SECONDS):  # stretched by the machine's load
                raise RuntimeError(f"opensandbox-server did not answer on {self.url} within "
                                   f"{time.monotonic() - started:.0f} s: "
                                   f"{self.log()}")
            time.sleep(0.1)
        return True

    def _healthy(self) -> bool:
        try:
            return self.request("GET", "/health", timeout=2)[0] == 200
        except OSError:
            return False

    def request(self, method: str, path: str, headers: dict[str, str] | None = None,
                timeout: float = 30) -> tuple[int, bytes]:
        """A request to the server made by hand, from its network namespace when it has one: its status
        and body."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if self.netns is not None:
            conn.sock = socket_in(self.netns, ("127.0.0.1", self.port), timeout)
        try:
            conn.request(method, path, headers=headers or {})
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    def log(self) -> str:
        try:
            return (self.folder / "server.log").read_text(errors="replace")[-3000:]
        except OSError as exc:
            return f"(no log: {exc})"

    def full_log(self) -> str:
        """The whole log, its colour codes taken out (uvicorn's access lines, one per request)."""
        return re.sub(r"\x1b\[[0-9;]*m", "", (self.folder / "server.log").read_text(errors="replace"))

    def containers(self, *filters: str) -> list[dict[str, Any]]:
        """The sandbox containers on the dockerd (label opensandbox.io/id), as `docker inspect` has them."""
        args = ["ps", "--all", "--quiet", "--filter", "label=opensandbox.io/id"]
        for extra in filters:
            args += ["--filter", extra]
        ids = self.docker.run(*args).stdout.split()
        return json.loads(self.docker.run("inspect", *ids).stdout) if ids else []

    def stop(self) -> None:
        """End the server by its pid, then remove whatever sandbox containers are left."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        with contextlib.suppress(Exception):
            left = [c["Id"] for c in self.containers()]
            if left:
                self.docker.run("rm", "--force", *left, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)
