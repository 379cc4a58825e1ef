"""A real JupyterHub for a class of students, each a system user running the owsandbox kernel in a box.

What a teacher would run, on this machine: `jupyterhub` (as root) with `configurable-http-proxy` in
front, an authenticator with a fixed password per student, and the `LocalProcessSpawner` starting each
student's single-user server as that student's own system user (stopping it with SIGTERM first, so that
its kernels, and their sandboxes, are shut down at once: StudentSpawner). Students cannot read the project's
virtual env, so their servers run `python3 -m jupyterhub.singleuser` from the world-readable
environment of tests/plain_python.py, where the owsandbox kernelspec is installed (JUPYTER_PATH), and
each student's limits come from the spawner's environment (`OWSANDBOX_LIMITS`). The single-user
servers offer the sandbox and nothing else: no terminals, no other kernel (SERVER_CONFIG).

The hub's state (config, sqlite db, cookie secret, proxy token, logs) is in a folder only root may
enter, inside a world-traversable temporary folder; ports are free loopback ports. `Hub.stop()` ends
the hub (which stops every server, `cleanup_servers`, and the proxy), then makes sure that nothing it
started, nor anything run by a student, is still running.

tests/test_jupyterhub.py drives it through the hub's URL (REST, kernel WebSockets, JupyterLab in
Chromium); benchmarks/hub_memory.py measures it.
"""

from __future__ import annotations

import glob
import html
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

from .kernel_ws import KernelWebSocket
from .machine_lock import ensure_user, machine_lock
from .plain_python import PlainPython, _link_tree, make_plain_python
from .ports import free_port
from .processes import PinnedProcesses, command_line, descendants, name, parent_of, stop_watched, terminate
from .waiting import WaitTimeout, patience, wait_until

KERNEL_NAME = "owsandbox"  # as `owsandbox install` names it
KERNEL_DISPLAY_NAME = "Sandbox (bash)"
ADMIN_SERVICE = "course-admin"
HUB_START_SECONDS = 60
PORT_TRIES = 3  # starts of a hub on new ports, when one it was given was taken first
SPAWN_SECONDS = 90
STOP_SECONDS = 30


@dataclass(frozen=True)
class Student:
    """A student's account: a system user of that name, a password for the hub, the box's limits."""

    name: str
    password: str
    limits: str  # OWSANDBOX_LIMITS for this student's sandboxes

    @property
    def account(self) -> pwd.struct_passwd:
        return pwd.getpwnam(self.name)

    @property
    def home(self) -> Path:
        return Path(self.account.pw_dir)

    @property
    def pids(self) -> int:
        """The process limit of this student's sandboxes."""
        return int(dict(item.split("=") for item in self.limits.split(","))["pids"])


def class_of(count: int, prefix: str = "owsbx-hub-") -> list[Student]:
    """`count` students, `owsbx-hub-a`, `owsbx-hub-b`, … (users only these tests use: every process
    of theirs was started by a hub of ours), each with a password and limits of their own."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    names = [letters[i] if i < 26 else f"{letters[i // 26 - 1]}{letters[i % 26]}" for i in range(count)]
    return [Student(f"{prefix}{n}", secrets.token_urlsafe(12), f"memory=1G,pids={128 + 32 * (i % 4)}")
            for i, n in enumerate(names)]


def classroom_users() -> AbstractContextManager[None]:
    """The machine's one classroom, held by whoever logs `class_of`'s students in (tests/test_jupyterhub.py,
    benchmarks/hub_memory.py): the students are system users shared by every run on this machine, and a
    hub's stop ends every process of theirs, so a second class at once would end the first one's."""
    return machine_lock("classroom-users")


def processes_of(uid: int) -> list[int]:
    """Every process whose real user is `uid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            found.append(int(entry))
                        break
        except OSError:
            continue
    return found


def environ_of(pid: int) -> dict[str, str]:
    """A process's environment as it started (root reads any)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.decode(errors="replace").partition("=") for item in f.read().split(b"\0") if item]
    return {key: value for key, _, value in pairs}


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of a process in KiB, (0, 0) when it is gone."""
    found = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("Rss", "Pss"):
                    found[key] = int(value.split()[0])
    except (OSError, ValueError):
        return 0, 0
    return found.get("Rss", 0), found.get("Pss", 0)


@dataclass
class SandboxFacts:
    """A kernel's sandbox as the host sees it (root reads every process's command line)."""

    kernel_pid: int
    bwrap_pid: int  # bubblewrap, child of the kernel
    init_pid: int  # the sandbox's PID-namespace init, from which everything in the box descends
    state_dir: str  # the host's private folder for this sandbox (sockets, records), never in the box
    pids: list[int] = field(default_factory=list)  # bwrap and everything under it

    @property
    def runtime_root(self) -> str:
        return os.path.dirname(self.state_dir)


def sandbox_of(kernel_id: str) -> SandboxFacts:
    """The sandbox of the kernel `kernel_id` (a Jupyter server names its connection file after it)."""
    marker = f"kernel-{kernel_id}.json"
    kernels = [int(p) for p in os.listdir("/proc") if p.isdigit() and marker in command_line(int(p))
               and "owsandbox.kernel" in command_line(int(p))]
    assert len(kernels) == 1, f"kernel {kernel_id}: {kernels}"
    kernel = kernels[0]

    def find() -> SandboxFacts | None:
        below = descendants(kernel)
        # bubblewrap reads its arguments from a file descriptor: the outer one is the bwrap with a bwrap below
        outer = [p for p in below if name(p) == "bwrap" and any(name(c) == "bwrap" for c in descendants(p))]
        for bwrap in outer:
            inner = [p for p in descendants(bwrap) if name(p) == "bwrap"]
            # the host's state folder of a keyed sandbox: KEY in this user's private runtime folder
            states = [path for root in ("/tmp", "/var/tmp") for path in
                      glob.glob(f"{root}/owsandbox-*/kernel-{kernel_id}") if os.path.isdir(path)]
            if inner and len(states) == 1:
                return SandboxFacts(kernel, bwrap, inner[0], states[0], [bwrap, *descendants(bwrap)])
        return None

    return wait_until(find, 30, f"the bubblewrap sandbox of kernel {kernel_id}")


class HubKernel(KernelWebSocket):
    """A kernel in a student's server, started and driven through the hub's URL: REST to start and
    delete it, its `/channels` WebSocket for cells."""

    def __init__(self, hub: Hub, user: str, token: str, kernel_name: str = KERNEL_NAME) -> None:
        self.hub, self.token = hub, token
        status, model = hub.request("POST", f"/user/{user}/api/kernels", {"name": kernel_name}, token=token)
        assert status == 201, (status, model)
        self.id: str = model["id"]
        self.closed = False
        super().__init__(f"{hub.ws_url}user/{user}/api/kernels/{self.id}/channels", token, user)

    def close(self, shutdown: bool = True) -> None:
        """Close the WebSocket and (with `shutdown`) shut the kernel down: its sandbox ends with it. Leave
        the kernel to its server when the server is about to stop: a DELETE still in progress when the
        server shuts its kernels down fails that shutdown (jupyter_server), and the server lingers."""
        if self.closed:
            return
        self.closed = True
        try:
            super().close()
        finally:
            if shutdown:
                self.hub.request("DELETE", f"/user/{self.user}/api/kernels/{self.id}", token=self.token)


HUB_CONFIG = '''\
"""{title}: written by tests/hub.py."""
import hmac

from jupyterhub.auth import Authenticator

c = get_config()  # noqa: F821
PASSWORDS = {passwords!r}


class FixedPasswords(Authenticator):
    """One fixed password per student."""

    async def authenticate(self, handler, data):
        name = data.get("username", "")
        expected = PASSWORDS.get(name)
        if expected is not None and hmac.compare_digest(expected.encode(), data.get("password", "").encode()):
            return name
        return None


c.JupyterHub.authenticator_class = FixedPasswords
c.Authenticator.allowed_users = set(PASSWORDS)
c.JupyterHub.bind_url = "http://127.0.0.1:{public_port}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.auth_token = open({proxy_token_file!r}).read().strip()
c.ConfigurableHTTPProxy.pid_file = {proxy_pid_file!r}
c.JupyterHub.db_url = "sqlite:///{db}"
c.JupyterHub.cookie_secret_file = {cookie_secret_file!r}
c.JupyterHub.cleanup_servers = True
c.JupyterHub.cleanup_proxy = True
c.JupyterHub.services = [{{"name": {admin!r}, "api_token": {admin_token!r}}}]
c.JupyterHub.load_roles = [{{"name": {admin!r}, "services": [{admin!r}],
                            "scopes": ["admin:users", "admin:servers", "tokens", "read:users"]}}]

'''

# Each student's server, as that student, from an environment every user can read: the part of the
# config of `Hub` after HUB_CONFIG.
CONFIG = '''\
import signal

from jupyterhub.spawner import LocalProcessSpawner

LIMITS = {limits!r}


class StudentSpawner(LocalProcessSpawner):
    """LocalProcessSpawner, stopping a server with SIGTERM first. Its SIGINT ends a server whose stdin is
    not a terminal (a hub run by systemd) at once, without shutting its kernels down: each sandbox then
    lingers for a restarting kernel (30 s) before it ends. SIGTERM shuts the kernels down first."""

    async def stop(self, now=False):
        if not now and await self.poll() is None:
            await self._signal(signal.SIGTERM)
            await self.wait_for_death(self.term_timeout)
        await super().stop(now=now)


# Each student's server, as that student, from an environment every user can read.
c.JupyterHub.spawner_class = StudentSpawner
c.LocalProcessSpawner.term_timeout = 60  # a server ends as soon as its kernels are shut down
c.Spawner.cmd = [{python!r}, "-m", "jupyterhub.singleuser"]
c.Spawner.environment = {{**{environment!r}, "OWSANDBOX_LIMITS": lambda spawner: LIMITS[spawner.user.name]}}
c.Spawner.notebook_dir = "~"
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = {spawn_seconds}
c.Spawner.http_timeout = {spawn_seconds}
'''

SERVER_CONFIG = '''\
"""The students' Jupyter servers: the sandbox and nothing else. Written by tests/hub.py."""
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web

c = get_config()  # noqa: F821


class SandboxKernelsOnly(AsyncMappingKernelManager):
    """Starts the sandbox kernel and no other. `allowed_kernelspecs` only filters the list: Python's own
    kernel would still start, outside the box, for POST /api/kernels. Refused before a kernel is made:
    a start that fails later stays pending, and then the server's shutdown fails (jupyter_client 8)."""

    async def start_kernel(self, **kwargs):
        name = kwargs.get("kernel_name") or self.default_kernel_name
        if name != "{kernel}":
            raise web.HTTPError(403, f"only the sandbox kernel runs here, not {{name!r}}")
        return await super().start_kernel(**kwargs)


c.ServerApp.kernel_manager_class = SandboxKernelsOnly
c.KernelSpecManager.allowed_kernelspecs = {{"{kernel}"}}
c.KernelSpecManager.ensure_native_kernel = False
c.MappingKernelManager.default_kernel_name = "{kernel}"
c.ServerApp.terminals_enabled = False  # a terminal would be a shell outside the box

# For these tests: JupyterLab only (no nbgrader, no language server), fetching nothing off this machine.
c.ServerApp.jpserver_extensions = {{"jupyterlab": True}}
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
c.LabApp.extension_manager = "readonly"
'''
LAB_OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}


def students_environment(plain: PlainPython) -> dict[str, str]:
    """`plain`'s environment, plus what a JupyterLab needs from it (its static files, which are in the
    venv's share/jupyter, and the server's config), made in `plain.root`; the variables to set. The
    kernelspec is installed again with `--provider bwrap`: a class fails closed (a box that cannot start
    is an error in the cell), where `auto` would run cells unisolated."""
    subprocess.run([plain.python, "-m", "owsandbox.cli", "install", "--prefix", str(plain.root), "--provider", "bwrap"],
                   env={**os.environ, "PYTHONPATH": str(plain.root / "site")}, check=True, capture_output=True)
    spec = plain.root / "share" / "jupyter" / "kernels" / KERNEL_NAME
    for path in (spec, *spec.iterdir()):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    lab = plain.root / "share" / "jupyter" / "lab"
    if not lab.exists():
        _link_tree(Path(sys.prefix) / "share" / "jupyter" / "lab", lab)
        settings = lab / "settings"
        settings.mkdir(mode=0o755)
        (settings / "overrides.json").write_text(json.dumps(LAB_OVERRIDES))
        os.chmod(settings / "overrides.json", 0o644)
    config = plain.root / "etc" / "jupyter"
    config.mkdir(parents=True, exist_ok=True)
    for folder in (config.parent, config):
        os.chmod(folder, 0o755)
    (config / "jupyter_server_config.py").write_text(SERVER_CONFIG.format(kernel=KERNEL_NAME))
    os.chmod(config / "jupyter_server_config.py", 0o644)
    return {**plain.env, "JUPYTER_CONFIG_PATH": str(config), "JUPYTERLAB_DIR": str(lab), "LANG": "C.UTF-8"}


def prepare_student(student: Student) -> None:
    """The student's system user, with a home holding only `work/` that only they may enter (0700: their own server
    follows links a box plants in the workspace, and reads as them what the home modes let them)."""
    account = ensure_user(student.name)
    home = Path(account.pw_dir)
    for entry in home.iterdir():  # a fresh start: nothing left from an earlier run
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    os.chmod(home, 0o700)
    # a lesson folder: the top of a home that is the workspace is read-only in the box (docs/how-to/classroom.md)
    (home / "work").mkdir()
    os.chown(home / "work", account.pw_uid, account.pw_gid)


class PortTaken(AssertionError):
    """A port the hub or its proxy was given was in use at its start (the hub exits; without its proxy it goes on)."""


class Hub:
    """One JupyterHub with its proxy, for `students`; `start()`, then `stop()` whatever happened."""

    def __init__(self, students: list[Student], plain: PlainPython | None = None) -> None:
        self.own_plain = plain is None
        self.plain = plain or make_plain_python()
        self._make_state(students)

    def _make_state(self, students: list[Student]) -> None:
        """The hub's folders, ports, secrets' paths and admin token (nothing started)."""
        self.students = {s.name: s for s in students}
        self.folder = Path(tempfile.mkdtemp(prefix="owsbx-hub-"))
        self.state = self.folder / "state"  # root's alone: the students' boxes and accounts never read it
        self.state.mkdir(mode=0o700)
        self._choose_ports()
        self.admin_token = secrets.token_hex(32)
        self.proxy_token_file = self.state / "proxy_auth_token"
        self.db = self.state / "jupyterhub.sqlite"
        self.cookie_secret_file = self.state / "jupyterhub_cookie_secret"
        self.config_file = self.state / "jupyterhub_config.py"
        self.log_path = self.state / "jupyterhub.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.processes = PinnedProcesses()  # everything seen under the hub and run by a student
        self.final_log = ""  # the log's tail, kept when stop() removes the hub's folder

    def _choose_ports(self) -> None:
        self.public_port, self.hub_port, self.proxy_api_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.public_port}/"
        self.ws_url = f"ws://127.0.0.1:{self.public_port}/"

    # -- files and process -----------------------------------------------------------------------

    def secret_files(self) -> list[Path]:
        return [self.db, self.cookie_secret_file, self.proxy_token_file, self.config_file, self.log_path]

    def start(self) -> None:
        for student in self.students.values():
            prepare_student(student)
        self._launch_on_free_ports("JupyterHub for owsandbox's tests", CONFIG.format(
            limits={s.name: s.limits for s in self.students.values()}, python=self.plain.python,
            environment=students_environment(self.plain), spawn_seconds=round(patience(SPAWN_SECONDS))))

    def _launch_on_free_ports(self, title: str, spawner: str, settings: dict[str, str] | None = None) -> None:
        """Write the config and launch; again on new ports, up to PORT_TRIES times, when a port chosen
        free was taken before the hub or its proxy bound it (free_port's ports are the kernel's
        ephemeral ones, which any outgoing connection of a busy machine may get meanwhile)."""
        for attempt in range(1, PORT_TRIES + 1):
            self._write_config(title, spawner)
            try:
                self._launch(settings)
                return
            except PortTaken as taken:
                if attempt == PORT_TRIES:
                    raise
                print(f"start {attempt}: {taken}\n(the hub and its proxy are ended; again on new ports)")
                self._end_failed_start()
                self.proxy_token_file.unlink()
                self._choose_ports()

    def _end_failed_start(self) -> None:
        """End a hub that did not start, and whatever it started, before another is started."""
        assert self.process is not None
        self.remember_processes()
        terminate(self.process, patience(STOP_SECONDS))
        self.processes.kill(self.processes.still_running_after(patience(STOP_SECONDS)))

    def _write_config(self, title: str, spawner: str) -> None:
        """The proxy's token and the hub's config file, root's alone: HUB_CONFIG (what every hub of the
        tests is: its students' passwords, its ports and state files, the admin service), titled
        `title`, then `spawner` (how it starts a student's server)."""
        fd = os.open(self.proxy_token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        self.config_file.write_text(HUB_CONFIG.format(
            title=title, passwords={s.name: s.password for s in self.students.values()},
            public_port=self.public_port, hub_port=self.hub_port, proxy_api_port=self.proxy_api_port,
            proxy_token_file=str(self.proxy_token_file), proxy_pid_file=str(self.state / "proxy.pid"),
            db=self.db, cookie_secret_file=str(self.cookie_secret_file), admin=ADMIN_SERVICE,
            admin_token=self.admin_token) + spawner)
        os.chmod(self.config_file, 0o600)

    def _launch(self, settings: dict[str, str] | None = None) -> None:
        """Start `jupyterhub` with the config file written, `settings` added to its environment, and
        wait until it answers through its proxy."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "JPY_", "OWSANDBOX_"))}
        env.update(settings or {})
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(self.config_file)],
                                            cwd=self.state, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.add_tree(self.process.pid)

        def answering() -> bool:
            assert self.process is not None
            exited = self.process.poll() is not None
            # The hub exits when it cannot bind its own port; when its proxy cannot bind the public
            # one, it goes on without it, so its log is read for that as well.
            if re.search(r"EADDRINUSE|[Aa]ddress already in use", self.log(100_000)):
                raise PortTaken(f"a port of the hub's was taken before it bound it:\n{self.log(3000)}")
            if exited:
                raise AssertionError(f"jupyterhub exited with status {self.process.returncode}:\n{self.hub_log()}")
            try:
                # A poll is short, so that the log is read again soon even when the port does not answer.
                return self.request("GET", "/hub/api/", token=self.admin_token, timeout=patience(5))[0] == 200
            except OSError:
                return False

        try:  # nothing announces it: the port is polled
            wait_until(answering, patience(HUB_START_SECONDS), "the hub to answer through its proxy", interval=0.1)
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}\n{self.log()}") from None
        self.remember_processes()

    def log(self, tail: int = 8000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-tail:]

    def hub_log(self, tail: int = 8000) -> str:
        """The log without its proxy's lines: while the hub starts, the proxy logs an error of several
        lines for every poll of the test, and they hid why a hub that exited did."""
        kept: list[str] = []
        proxy = False
        for line in (self.log_path.read_text(errors="replace") if self.log_path.exists() else "").splitlines():
            if "[ConfigProxy]" in line:
                proxy = True
            elif not (proxy and (line[:1].isspace() or line.startswith("}"))):
                proxy = False
                kept.append(line)
        return "\n".join(kept)[-tail:]

    def remember_processes(self) -> None:
        """Pin (by pidfd) the hub's process tree and every process of a student, as they are now."""
        if self.process is not None and self.process.poll() is None:  # a reaped pid may be someone else's now
            self.processes.add_tree(self.process.pid)
        self.remember_proxy()
        for student in self.students.values():
            for pid in processes_of(student.account.pw_uid):
                self.processes.add_tree(pid)

    def remember_proxy(self) -> None:
        """Pin the proxy the hub wrote it started, if it runs with this hub's API port: a hub that
        exits at its start leaves its proxy behind, no longer in its tree."""
        try:
            pid = int((self.state / "proxy.pid").read_text())
        except (OSError, ValueError):
            return
        self.processes.add(pid, lambda p: f"--api-port {self.proxy_api_port}" in command_line(p))

    def stop(self) -> dict[int, str]:
        """Stop the hub (it stops every student's server, then its proxy); then whatever was seen still
        running STOP_SECONDS later, or run by a student, is killed. What was left, by pid."""
        started = time.monotonic()
        try:
            left = stop_watched(self.process, self.processes, self.remember_processes,
                                settle=patience(STOP_SECONDS), grace=patience(STOP_SECONDS))
            print(f"every process seen under the hub had ended, or was killed, {time.monotonic() - started:.1f} s "
                  "after the stop began")
        finally:
            self.final_log = self.log()
            shutil.rmtree(self.folder, ignore_errors=True)
            if self.own_plain:
                shutil.rmtree(self.plain.root, ignore_errors=True)
        return left

    # -- HTTP -------------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, token: str | None = None,
                timeout: float = 60) -> tuple[int, Any]:
        """(status, JSON answer or text) of a request to the hub's URL."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path.lstrip("/"), data=data, method=method)
        if token:
            request.add_header("Authorization", f"token {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                status, text = answer.status, answer.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode(errors="replace")
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text

    def login(self, student: Student, password: str | None = None) -> int:
        """Log in at /hub/login as a browser's form would (its xsrf token and cookie included), following
        the redirects (which start the student's server); the final HTTP status."""
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        with opener.open(self.url + "hub/login", timeout=30) as page:
            form = page.read().decode()
        xsrf = html.unescape(re.search(r'name="_xsrf"\s+value="([^"]+)"', form).group(1))  # type: ignore[union-attr]
        fields = urllib.parse.urlencode({"username": student.name, "_xsrf": xsrf,
                                         "password": student.password if password is None else password})
        try:
            with opener.open(self.url + "hub/login", fields.encode(), timeout=patience(SPAWN_SECONDS)) as answer:
                answer.read()
                return answer.status
        except urllib.error.HTTPError as error:
            return error.code

    def wait_until_ready(self, user: str) -> None:
        """Until the user's server is up: the hub's progress event stream says `ready` (an event)."""
        request = urllib.request.Request(f"{self.url}hub/api/users/{user}/server/progress",
                                         headers={"Authorization": f"token {self.admin_token}"})
        with urllib.request.urlopen(request, timeout=patience(SPAWN_SECONDS)) as stream:
            for line in stream:
                if line.startswith(b"data:"):
                    event = json.loads(line[5:])
                    if event.get("failed"):
                        raise AssertionError(f"{user}'s server failed to start: {event}\n{self.log()}")
                    if event.get("ready"):
                        return
        raise AssertionError(f"{user}'s server is not starting (no progress)\n{self.log()}")

    def log_in_and_run_a_cell(self, student: Student) -> tuple[str, HubKernel, float]:
        """What a student does first: log in (the hub starts their server), open the sandbox kernel, run
        a cell. Their token, the kernel, and the seconds from the login to the cell's result."""
        started = time.monotonic()
        assert self.login(student) == 200
        self.wait_until_ready(student.name)
        token = self.token_for(student.name)
        kernel = HubKernel(self, student.name, token)
        first = kernel.run("echo ready")
        assert first.status == "ok" and first.text() == "ready\n", first.outputs
        return token, kernel, time.monotonic() - started

    def token_for(self, user: str) -> str:
        """An API token of `user`'s, made by the course's admin service (the user's own permissions)."""
        status, answer = self.request("POST", f"/hub/api/users/{user}/tokens",
                                      {"note": "owsandbox tests", "expires_in": 3600}, token=self.admin_token)
        assert status == 201, (status, answer)
        return answer["token"]

    def server_pid(self, user: str) -> int:
        """The pid of `user`'s single-user server (found by its owner and command)."""
        uid = self.students[user].account.pw_uid
        found = [p for p in processes_of(uid) if "jupyterhub.singleuser" in command_line(p)]
        # A child the server has forked and not yet exec'd (a kernel or a terminal starting) still shows
        # its command line: the server is the one whose parent is not one of them.
        roots = [p for p in found if parent_of(p) not in found]
        assert len(roots) == 1, {p: command_line(p) for p in found}
        return roots[0]

    def stop_server(self, user: str) -> None:
        """DELETE the user's server with the admin token; return once the hub says it is stopped."""
        status, answer = self.request("DELETE", f"/hub/api/users/{user}/server", token=self.admin_token)
        assert status in (202, 204), (status, answer)

        def stopped() -> bool:
            model = self.request("GET", f"/hub/api/users/{user}", token=self.admin_token)[1]
            return not model.get("servers") and model.get("pending") is None

        wait_until(stopped, patience(STOP_SECONDS), f"the hub to stop {user}'s server", interval=0.1)


# -- each student's server in a container: DockerSpawner -------------------------------------------

# The part of DockerHub's config after HUB_CONFIG.
DOCKER_CONFIG = '''\
from dockerspawner import DockerSpawner
from jupyterhub.utils import random_port

from owsandbox.kernelspec.gateway_docker import nested_bwrap_seccomp


class HostNetworkSpawner(DockerSpawner):
    """DockerSpawner with the containers in the host's network: the tests' dockerd has no bridge (the
    host's firewall and network stay as they are), so each server listens on a loopback port of its
    own, which the proxy reaches and from which the server reaches the hub (DockerSpawner's own advice
    for network_mode host). A hub on a host with a Docker network uses DockerSpawner as it is."""

    async def start(self):
        self.port = random_port()
        return await super().start()

    async def get_ip_and_port(self):
        return "127.0.0.1", self.port


c.JupyterHub.spawner_class = HostNetworkSpawner
c.DockerSpawner.network_name = "host"
c.DockerSpawner.use_internal_ip = True  # no published port: the server's own port, on the host's loopback
c.DockerSpawner.ip = "127.0.0.1"
c.DockerSpawner.image = {image!r}
c.DockerSpawner.pull_policy = "never"
c.DockerSpawner.prefix = {prefix!r}
c.DockerSpawner.name_template = "{{prefix}}-{{raw_username}}"  # the students' names are container names already
c.DockerSpawner.remove = True  # a stopped server's container goes, with everything the student made in it
c.DockerSpawner.mem_limit = "1G"
# What bubblewrap needs to nest in the container, as owsandbox's Enterprise Gateway Docker launcher
# gives it (owsandbox/kernelspec/gateway_docker.py), and nothing more:
# * seccomp: the engines' default profile (which allows creating user namespaces, bubblewrap's
#   way in) with owsandbox's no-setuid rules and sethostname/setdomainname allowed (the box names its
#   host in the UTS namespace it made; in the container's own namespaces the kernel still refuses).
#   Docker's API takes the profile's text, not a file.
# * no masked or read-only paths in /proc and /sys (`docker run --security-opt systempaths=unconfined`,
#   which Docker's API spells as these two empty lists): without it the kernel refuses the box a fresh
#   /proc while Docker's masks cover the container's. The container's user is not root, so the
#   unmasked /proc is what an unprivileged user of a host sees.
# The rest is the usual hardening: no capabilities, no-new-privileges, a non-root user, a cgroup
# limit on processes and memory for the whole container.
c.DockerSpawner.extra_host_config = {{
    "security_opt": ["seccomp=" + nested_bwrap_seccomp(), "no-new-privileges"],
    "cap_drop": ["ALL"],
    "pids_limit": 512,
}}
# Each student a uid of their own (no name in the image): the box's limits are rlimits, and the process
# limit counts every process of its uid on the machine, so students sharing a uid share that count.
c.DockerSpawner.extra_create_kwargs = lambda spawner: {{
    "user": f"{{{first_uid} + spawner.user.id}}:100",
    "host_config": {{"MaskedPaths": [], "ReadonlyPaths": []}},
}}
c.DockerSpawner.environment = {{"OWSANDBOX_LIMITS": {limits!r}}}  # each box's (the container's own are above)
c.Spawner.default_url = "/api"  # the image has no JupyterLab: its REST API is the landing page
c.Spawner.notebook_dir = "/home/student/work"
c.Spawner.start_timeout = {spawn_seconds}
c.Spawner.http_timeout = {spawn_seconds}
'''


# + the hub's id of the student: a uid of each student's own, used by no one here. Of this run's own
# too: two runs on one machine whose students shared uids would count each other's processes against
# the box's process limit (one run's fork bomb refused the other's cells a process).
FIRST_UID = 200000 + 1000 * secrets.randbelow(100000)
BOX_LIMITS = "memory=1G,pids=256"  # below the container's own pids limit (512)


class DockerHub(Hub):
    """A JupyterHub whose students' servers are containers of `image` on a dockerd (`docker`, its
    DOCKER_HOST in the hub's environment), started by DockerSpawner: the students are the hub's users
    only (no system users), each server a container named `{prefix}-{student}` as the image's user.
    `stop()` ends the hub, which stops (and removes) every server's container; any container of this
    hub still there then is removed and named."""

    def __init__(self, students: list[Student], docker: Any, image: str) -> None:
        self.docker, self.image = docker, image
        self.prefix = f"owsbx-hub-{secrets.token_hex(4)}"
        self.own_plain = False  # no Python of the students' on this machine: theirs is in the image
        self._make_state(students)

    def start(self) -> None:
        self._launch_on_free_ports(
            "JupyterHub with DockerSpawner for owsandbox's tests (DockerHub)", DOCKER_CONFIG.format(
                image=self.image, prefix=self.prefix, spawn_seconds=round(patience(SPAWN_SECONDS)),
                first_uid=FIRST_UID, limits=BOX_LIMITS), self.docker.settings)

    def container(self, user: str) -> str:
        return f"{self.prefix}-{user}"

    def containers(self) -> list[str]:
        """The names of this hub's containers, running or not."""
        listed = self.docker.run("ps", "--all", "--format", "{{.Names}}", "--filter", f"name=^{self.prefix}-")
        return listed.stdout.split()

    def remember_processes(self) -> None:
        """The hub's own process tree (the containers' processes are dockerd's: `containers()`)."""
        if self.process is not None and self.process.poll() is None:
            self.processes.add_tree(self.process.pid)
        self.remember_proxy()

    def stop(self) -> dict[int, str]:
        """Stop the hub (and so every server's container); then remove whatever container of this hub is
        left, and say so: what was left, processes by pid, containers by name (under pid 0)."""
        try:
            left = super().stop()
        finally:
            stray = self.containers()
            for name in stray:
                self.docker.run("rm", "--force", name, check=False)
        if stray:
            left[0] = f"containers left after the hub stopped (now removed): {stray}"
        return left
