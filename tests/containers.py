"""Real containers for tests: Debian 12 images made here and run with podman, and with Docker, as root.

Images cannot be pulled, so the first use builds one with debootstrap from the mirror apt already
uses (about half a minute) and imports it; later runs find it in podman's store. The image's recipe
has a number in its tag: change the recipe, change the number. Podman runs with a containers.conf of
our own (`CONTAINERS_CONF`), which picks the `runc` runtime and clears podman's default ulimits
(crun, and those ulimits, fail on some hosts); nothing in /etc is changed.

* `Podman.image()`: Debian bookworm (minbase) with python3, and a marker file at `MARKER` that the
  host does not have, so a test can tell the box's files from the host's.
* `Podman.minimal_image()`: the same with only python3-minimal (python3 and its standard library
  purged with dpkg): a real Python without json, as Debian installs it.
* `Podman.no_python_image()`: the same with no python3 at all (its programs removed).
* `Podman.container(image)`: a running container (`sleep infinity`, no network), removed afterwards
  however the test ends; `exec_prefix(name)` is the `exec` provider's command for it.
* `Docker.started(podman)`: a dockerd of the tests' own, for a session (Debian's docker.io): its data,
  exec root, socket (reached through `DOCKER_HOST`), config file and pidfile in a folder of its own,
  with no bridge, no iptables rules and no IP forwarding, so the host's firewall and network are left
  alone; stopped by its pid (and what it started, if it could not stop them), its mounts and folder
  removed, however the session ends. The same images, loaded from podman's store (`podman save |
  docker load`) when first asked for. `Podman` and `Docker` are used alike: `name`, `path` (the
  engine's program), `settings` (the environment the engine needs), `run()` and the images.
* `Docker.started(podman, bridge="203.0.113.1/24")`: the same dockerd, but in a network namespace of
  its own (made and removed with it), with a bridge of that address: containers get addresses on it
  that a program in the namespace reaches (`netns`), as Enterprise Gateway's DockerProcessProxy needs.
  Still no iptables rules and no forwarding, and nothing of this machine's own network changes.
* `Docker.started(podman, bridge=..., publish=True)`: the same, with `docker run -p` working: each
  published port is Docker's userland proxy (`docker-proxy`, a process in that namespace listening on
  its ports and relaying to the container's address on the bridge), still with no iptables rule; a
  program in the namespace reaches a container's port at `127.0.0.1:PUBLISHED`.
* `Podman.owsandbox_image()`: `image()` with bubblewrap (Debian's package, the one apt kept when it
  installed bubblewrap here or else downloaded by apt, installed with dpkg), owsandbox's dependencies
  (with its gateway extra) staged here by pip, a user `student` (uid 1000, gid 100, Enterprise
  Gateway's defaults) whose home is the image's working folder, and
  owsandbox itself from this source tree on top, as its own layer: the dependencies' image is kept
  while pyproject.toml stays the same, the top one while owsandbox's files do.
* `Podman.singleuser_image()`: a student's Jupyter server for JupyterHub's DockerSpawner, built from
  share/containers/singleuser.Containerfile on `image()`: JupyterHub's single-user server (the version
  of the hub here), owsandbox with its kernelspec (`--provider bwrap`) and bubblewrap. Its context's
  `site/` is staged by pip once per pyproject.toml and JupyterHub version (kept in the cache beside
  the project), with owsandbox's own files put in fresh; the image is named by a hash of all of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .netns import ip
from .processes import terminate
from .waiting import patience

RECIPE = "1"
IMAGE = f"localhost/owsandbox-test-bookworm:{RECIPE}"
MINIMAL_IMAGE = f"localhost/owsandbox-test-bookworm-python3-minimal:{RECIPE}"
NO_PYTHON_IMAGE = f"localhost/owsandbox-test-bookworm-no-python:{RECIPE}"
MARKER = "/etc/owsandbox-test-image"
OWSANDBOX_RECIPE = "1"  # of the two images below (their own, on top of the base image's)
OWSANDBOX_DEPS_IMAGE = "localhost/owsandbox-test-eg-deps"  # :<recipes>-<hash of pyproject.toml>
OWSANDBOX_IMAGE = "localhost/owsandbox-test-eg-kernel"  # :<recipes>-<hash of owsandbox/>
SINGLEUSER_IMAGE = "localhost/owsandbox-test-singleuser"  # :<recipe>-<hash of the context>
IMAGE_USER = ("student", 1000, 100)
PROJECT = Path(__file__).resolve().parents[1]
SINGLEUSER_FILES = (PROJECT / "share" / "containers" / "singleuser.Containerfile",
                    PROJECT / "share" / "containers" / "singleuser_server_config.py")
SITE_CACHE = PROJECT / ".cache" / "tests"  # the single-user image's staged dependencies, one folder per recipe
MIRROR_ENV = "OWSANDBOX_TEST_DEBIAN_MIRROR"  # a Debian mirror, when apt's sources here name none
_CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'


def _digest(paths: list[Path]) -> str:
    """A short hash of files' names and contents: an image built from them is named by it."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path.relative_to(PROJECT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _bubblewrap_deb(folder: Path) -> list[Path]:
    """Debian's bubblewrap package in `folder`: the one apt kept when it installed bubblewrap here, else
    downloaded by apt (its lists may be older than the mirror after a while: the kept one goes first)."""
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "bubblewrap"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    kept = sorted(Path("/var/cache/apt/archives").glob(f"bubblewrap_{version.replace(':', '%3a')}_*.deb"))
    if version and kept:
        shutil.copy(kept[0], folder)
    else:
        done = subprocess.run(["apt-get", "download", "bubblewrap"], cwd=folder, capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"apt-get download bubblewrap failed: {done.stderr.strip()}")
    debs = list(folder.glob("bubblewrap_*.deb"))
    if not debs:
        raise RuntimeError("no bubblewrap package for the image")
    return debs


def _hub_version() -> str:
    """The JupyterHub version of this environment (the single-user image gets the same)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jupyterhub")
    except PackageNotFoundError:
        raise RuntimeError("the single-user image needs JupyterHub here, to match its version: "
                           "pip install -e '.[test]'") from None


def _tool(name: str) -> str | None:
    """A program's path, also in /usr/sbin when that is not on PATH (runc and debootstrap live there)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def require_podman() -> None:
    """Skip where podman or debootstrap is missing, or without root; in CI that is a failure."""
    missing = [tool for tool in ("podman", "runc", "debootstrap") if _tool(tool) is None]
    problem = f"{' and '.join(missing)} not installed" if missing else None
    if problem is None and os.geteuid() != 0:
        problem = "building the test image with debootstrap needs root"
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the container tests: {problem} (apt-get install podman runc debootstrap)")
        pytest.skip(problem)


def apt_mirror() -> str:
    """The Debian mirror that apt uses here (not its security archive), or $OWSANDBOX_TEST_DEBIAN_MIRROR."""
    if os.environ.get(MIRROR_ENV):
        return os.environ[MIRROR_ENV]
    uris: list[str] = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text(errors="replace").splitlines():
            if line.lower().startswith("uris:"):
                uris += line.split()[1:]
    sources_list = Path("/etc/apt/sources.list")
    if sources_list.exists():
        for line in sources_list.read_text(errors="replace").splitlines():
            words = line.split()
            if words[:1] == ["deb"]:
                words = words[1:]
                if words and words[0].startswith("["):  # options: [arch=amd64 signed-by=...]
                    while words and not words[0].endswith("]"):
                        words = words[1:]
                    words = words[1:]
                uris += words[:1]
    for uri in uris:
        if uri.rstrip("/").endswith("/debian"):  # the main archive, not debian-security
            return uri
    raise RuntimeError(f"no Debian mirror in apt's sources here; set {MIRROR_ENV}")


class Podman:
    name = "podman"
    path = "podman"

    def __init__(self, folder: Path) -> None:
        conf = folder / "containers.conf"
        conf.write_text(_CONTAINERS_CONF)
        self.settings = {"CONTAINERS_CONF": str(conf)}
        self.env = {**os.environ, **self.settings}

    def run(self, *args: str, check: bool = True, timeout: float = 120,
            stdin: int | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=stdin)
        if check and done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed (status {done.returncode}): {done.stderr.strip()}")
        return done

    def has_image(self, name: str) -> bool:
        return self.run("image", "exists", name, check=False).returncode == 0

    @contextlib.contextmanager
    def _build_lock(self) -> Iterator[None]:
        """Two test runs on one machine build an image once."""
        with open(os.path.join(tempfile.gettempdir(), "owsandbox-test-images.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def image(self) -> str:
        """The Debian image with python3, built the first time."""
        with self._build_lock():
            if not self.has_image(IMAGE):
                self._build(IMAGE)
        return IMAGE

    def minimal_image(self) -> str:
        """The Debian image with only python3-minimal, made from `image()` the first time."""
        return self._derived(MINIMAL_IMAGE, "dpkg", "--purge", "python3", "python3.11", "libpython3-stdlib",
                             "libpython3.11-stdlib")

    def no_python_image(self) -> str:
        """The Debian image without any python3, made from `image()` the first time."""
        return self._derived(NO_PYTHON_IMAGE, "sh", "-c", "rm -f /usr/bin/python3*")

    def _derived(self, image: str, *argv: str) -> str:
        """`image`, made from `image()` by running `argv` in it, the first time."""
        base = self.image()
        with self._build_lock():
            if not self.has_image(image):
                name = f"owsbx-build-{uuid.uuid4().hex[:8]}"
                try:
                    self.run("run", "--network", "none", "--name", name, base, *argv)
                    self.run("commit", "--quiet", name, image)
                finally:
                    self.run("rm", "--force", name, check=False)
        return image

    def has_images(self, owsandbox: bool = False, singleuser: bool = False) -> bool:
        """Whether `image()` (and `owsandbox_image()`, `singleuser_image()`) are built already."""
        try:
            singleuser_name = self._singleuser_name() if singleuser else ""
        except RuntimeError:  # it cannot be named here: building it says why
            return False
        return (self.has_image(IMAGE) and (not owsandbox or all(map(self.has_image, self._owsandbox_names())))
                and (not singleuser or self.has_image(singleuser_name)))

    @staticmethod
    def _owsandbox_names() -> tuple[str, str]:
        """The names of the owsandbox image's two layers: its dependencies, and itself."""
        deps = f"{OWSANDBOX_DEPS_IMAGE}:{RECIPE}.{OWSANDBOX_RECIPE}-{_digest([PROJECT / 'pyproject.toml'])}"
        files = sorted(path for path in (PROJECT / "owsandbox").rglob("*")
                       if path.is_file() and "__pycache__" not in path.parts)
        return deps, f"{OWSANDBOX_IMAGE}:{RECIPE}.{OWSANDBOX_RECIPE}-{_digest(files)}"

    def owsandbox_image(self) -> str:
        """The Debian image with bubblewrap and owsandbox installed (see the module's docstring)."""
        deps, name = self._owsandbox_names()
        base = self.image()
        with self._build_lock():
            if not self.has_image(deps):
                self._build_deps(base, deps)
        with self._build_lock():
            if not self.has_image(name):
                with tempfile.TemporaryDirectory(prefix="owsandbox-image-") as temp:
                    shutil.copytree(PROJECT / "owsandbox", Path(temp) / "owsandbox",
                                    ignore=shutil.ignore_patterns("__pycache__"))
                    (Path(temp) / "Containerfile").write_text(
                        f"FROM {deps}\nCOPY owsandbox /usr/local/lib/python3.11/dist-packages/owsandbox\n")
                    self.run("build", "--quiet", "--network", "none", "--tag", name, temp, timeout=600)
                self._drop_other_tags(OWSANDBOX_IMAGE, name)
                self._drop_other_tags(OWSANDBOX_DEPS_IMAGE, deps)  # after their children
        return name

    def _drop_other_tags(self, repository: str, kept: str) -> None:
        """Each change of owsandbox's files makes a new image: the ones of `repository` made over a day ago
        go (one a container still uses stays: podman refuses to remove it without --force). Newer ones
        stay: another test run on the machine, from a clone at another commit, may be using its own."""
        listed = self.run("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", f"reference={repository}",
                          "--filter", "until=24h", check=False)
        for image in listed.stdout.split():
            if image != kept:
                self.run("rmi", image, check=False)

    def singleuser_image(self) -> str:
        """The single-user server's image for DockerSpawner (see the module's docstring)."""
        base = self.image()
        with self._build_lock():
            name = self._singleuser_name()
            if not self.has_image(name):  # another run on the machine may have built it: then nothing is staged
                site = self._singleuser_site()
                with tempfile.TemporaryDirectory(prefix="owsandbox-image-") as temp:
                    context = Path(temp)
                    shutil.copytree(site, context / "site", symlinks=True)
                    shutil.copytree(PROJECT / "owsandbox", context / "site" / "owsandbox",
                                    ignore=shutil.ignore_patterns("__pycache__"))
                    (context / "debs").mkdir()
                    _bubblewrap_deb(context / "debs")
                    for path in SINGLEUSER_FILES:
                        shutil.copy(path, context)
                    self.run("build", "--quiet", "--network", "none", "--build-arg", f"BASE={base}", "--tag", name,
                             "--file", str(context / SINGLEUSER_FILES[0].name), str(context), timeout=900)
                self._drop_other_tags(SINGLEUSER_IMAGE, name)
        return name

    @staticmethod
    def _singleuser_name() -> str:
        """The single-user image's name: its recipe, its packages' and owsandbox's files."""
        files = sorted(path for path in (PROJECT / "owsandbox").rglob("*")
                       if path.is_file() and "__pycache__" not in path.parts)
        return f"{SINGLEUSER_IMAGE}:{RECIPE}-{Podman._singleuser_site_path().name.split('-', 2)[2]}-" \
               f"{_digest([*SINGLEUSER_FILES, *files])}"

    @staticmethod
    def _singleuser_site_path() -> Path:
        return SITE_CACHE / f"singleuser-site-{_hub_version()}.{_digest([PROJECT / 'pyproject.toml'])}"

    @staticmethod
    def _singleuser_site() -> Path:
        """The single-user image's dependencies, staged by pip (`--target`) once per pyproject.toml and
        JupyterHub version: the hub's own version, so that hub and server speak alike; owsandbox's own
        files are not in it (each build puts today's in)."""
        hub = _hub_version()
        site = Podman._singleuser_site_path()
        if site.is_dir():
            return site
        partial = site.with_name(site.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target",
               str(partial), f"jupyterhub=={hub}", "jupyter_server", f"{PROJECT}[gateway]"]
        done = subprocess.run(pip, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"pip could not stage the single-user image's packages: {done.stderr[-2000:]}")
        for own in [partial / "owsandbox", *partial.glob("owsandbox-*.dist-info"), partial / "bin"]:
            shutil.rmtree(own, ignore_errors=True)  # owsandbox comes fresh each build; scripts name this venv
        for old in SITE_CACHE.glob("singleuser-site-*"):
            if old != partial:
                shutil.rmtree(old, ignore_errors=True)
        partial.rename(site)
        return site

    def _build_deps(self, base: str, name: str) -> None:
        """owsandbox's dependencies (pip, into a folder here) and bubblewrap (apt's .deb) on `base`."""
        with tempfile.TemporaryDirectory(prefix="owsandbox-image-") as temp:
            context = Path(temp)
            stage = context / "site"
            pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target",
                   str(stage), f"{PROJECT}[gateway]"]
            done = subprocess.run(pip, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"pip could not stage owsandbox's dependencies: {done.stderr[-2000:]}")
            for own in [stage / "owsandbox", *stage.glob("owsandbox-*.dist-info"), stage / "bin"]:
                shutil.rmtree(own, ignore_errors=True)  # owsandbox comes as its own layer; scripts name this venv
            debs = _bubblewrap_deb(context)
            user, uid, gid = IMAGE_USER
            (context / "owsandbox-command").write_text(
                "#!/usr/bin/python3\nimport sys\nfrom owsandbox.cli import main\nsys.exit(main())\n")
            (context / "Containerfile").write_text(
                f"FROM {base}\n"
                "COPY site /usr/local/lib/python3.11/dist-packages\n"
                f"COPY {debs[0].name} /tmp/bubblewrap.deb\n"
                "COPY owsandbox-command /usr/local/bin/owsandbox\n"
                "RUN dpkg -i /tmp/bubblewrap.deb && rm /tmp/bubblewrap.deb && chmod 755 /usr/local/bin/owsandbox"
                f" && useradd --uid {uid} --gid {gid} --create-home --shell /bin/bash {user}\n"
                f"WORKDIR /home/{user}\n")
            self.run("build", "--quiet", "--network", "none", "--tag", name, str(context), timeout=900)

    def _build(self, name: str) -> None:
        with tempfile.TemporaryDirectory(prefix="owsandbox-debootstrap-") as temp:
            root = Path(temp) / "root"
            argv = [_tool("debootstrap") or "debootstrap", "--variant=minbase", "--include=python3", "bookworm",
                    str(root), apt_mirror()]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"debootstrap failed (status {done.returncode}): "
                                   f"{(done.stdout + done.stderr)[-2000:]}")
            (root / MARKER.lstrip("/")).write_text(f"{name}\n")
            tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
            try:
                self.run("import", "--quiet", "-", name, stdin=tar.stdout.fileno() if tar.stdout else None,
                         timeout=600)
            finally:
                if tar.stdout is not None:
                    tar.stdout.close()
                tar.wait()

    @contextlib.contextmanager
    def container(self, image: str) -> Iterator[str]:
        """A running container of `image` (no network), removed afterwards; yields its name."""
        name = f"owsbx-test-{uuid.uuid4().hex[:10]}"
        try:
            self.run("run", "--detach", "--network", "none", "--name", name, image, "sleep", "infinity")
            yield name
        finally:
            self.run("rm", "--force", "--time", "0", name, check=False)

    def exec(self, name: str, *argv: str) -> str:
        """Run a command in the container (as setup, not through the code under test); its stdout."""
        return self.run("exec", name, *argv).stdout

    @staticmethod
    def exec_prefix(name: str) -> list[str]:
        return ["podman", "exec", "-i", name]


# -- Docker ---------------------------------------------------------------------------------------

def docker_tools() -> tuple[str, str] | None:
    """(dockerd, the docker client installed beside it), or None. Debian's docker.io puts dockerd in
    /usr/sbin and its client in /usr/bin; another `docker` earlier on PATH (a newer static client, say)
    is not the one the daemon came with."""
    dockerd = _tool("dockerd")
    if dockerd is None:
        return None
    beside = Path(dockerd).resolve().parent.parent / "bin" / "docker"
    client = str(beside) if os.access(beside, os.X_OK) else shutil.which("docker")
    return (dockerd, client) if client else None


def require_docker() -> None:
    """Skip where Docker's daemon is missing, or without root; in CI that is a failure."""
    problem = None
    if docker_tools() is None:
        problem = "Docker (dockerd and its client) is not installed"
    elif os.geteuid() != 0:
        problem = "a dockerd of the tests' own needs root"
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Docker tests: {problem} (apt-get install --no-install-recommends docker.io)")
        pytest.skip(problem)


class Docker:
    name = "docker"
    START_SECONDS = 60.0

    def __init__(self, podman: Podman, bridge: str | None = None, publish: bool = False) -> None:
        tools = docker_tools()
        if tools is None:
            raise RuntimeError("Docker is not installed: no dockerd (apt-get install docker.io)")
        self.dockerd, self.path = tools
        self.podman = podman
        self.folder = Path(tempfile.mkdtemp(prefix="owsbx-docker-"))  # short: containerd's socket goes in it
        self.socket = self.folder / "docker.sock"
        self.settings = {"DOCKER_HOST": f"unix://{self.socket}"}
        self.env = {**os.environ, **self.settings}
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0  # dockerd's start to its first answer
        self.load_seconds: dict[str, float] = {}  # podman save | docker load, per image
        self.bridge = bridge  # ADDRESS/PREFIX of the bridge, in a network namespace of its own; None: no bridge
        self.netns = f"owsbx-dk-{uuid.uuid4().hex[:8]}" if bridge else None
        if publish and bridge is None:
            raise ValueError("publishing ports needs the bridge (and its network namespace)")
        self.publish = publish  # published ports through docker-proxy, in the namespace
        self._made_netns = False

    @classmethod
    @contextlib.contextmanager
    def started(cls, podman: Podman, bridge: str | None = None, publish: bool = False) -> Iterator[Docker]:
        docker = cls(podman, bridge, publish)
        try:
            docker.start()
            yield docker
        finally:
            docker.stop()

    def _version(self) -> int:
        done = subprocess.run([self.dockerd, "--version"], capture_output=True, text=True, timeout=30)
        found = re.search(r"version (\d+)\.", done.stdout)
        if found is None:
            raise RuntimeError(f"{self.dockerd} --version said {done.stdout.strip() or done.stderr.strip()!r}")
        return int(found.group(1))

    def start(self) -> None:
        config: dict[str, str] = {}
        if self._version() < 23:  # dockerd 20.10 writes an identity key to /etc/docker unless told where
            config["deprecated-key-path"] = str(self.folder / "key.json")
        (self.folder / "daemon.json").write_text(json.dumps(config))  # and reads no /etc/docker/daemon.json
        namespace = f"owsbx-test-{uuid.uuid4().hex[:8]}"  # apart from any other dockerd's, should containerd be shared
        argv = [self.dockerd, "--data-root", str(self.folder / "data"), "--exec-root", str(self.folder / "exec"),
                "--host", self.settings["DOCKER_HOST"], "--pidfile", str(self.folder / "dockerd.pid"),
                "--config-file", str(self.folder / "daemon.json"), "--containerd-namespace", namespace,
                "--containerd-plugins-namespace", f"{namespace}-plugins",
                # the host's firewall and network stay as they are: no rules, no forwarding, no bridge
                "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false"]
        proxy = _tool("docker-proxy") if self.publish else None
        if self.publish and proxy is None:
            raise RuntimeError("publishing ports needs Docker's docker-proxy, which is not installed beside dockerd")
        # without iptables a published port is docker-proxy or nothing (it listens in the namespace only)
        argv += ["--userland-proxy=true", f"--userland-proxy-path={proxy}"] if proxy else ["--userland-proxy=false"]
        if self.netns is None:
            argv.append("--bridge=none")
        else:  # its bridge is in the namespace only; nsenter, not `ip netns exec`, which hides the cgroups
            ip("netns", "add", self.netns)
            self._made_netns = True
            ip("-n", self.netns, "link", "set", "lo", "up")
            argv = [_tool("nsenter") or "nsenter", f"--net=/run/netns/{self.netns}", *argv, f"--bip={self.bridge}"]
        setpriv = _tool("setpriv")
        if setpriv is not None:  # dockerd ends with the tests even when they are killed
            argv = [setpriv, "--pdeathsig", "TERM", "--", *argv]
        started = time.monotonic()
        with open(self.folder / "dockerd.log", "wb") as log:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            cwd=self.folder, start_new_session=True)
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"dockerd ended at its start (status {self.process.returncode}): {self._log()}")
            answer = self.run("version", "--format", "{{.Server.Version}}", check=False, timeout=10)
            if answer.returncode == 0:
                break
            if time.monotonic() - started > patience(self.START_SECONDS):  # stretched by the machine's load
                raise RuntimeError(f"dockerd did not answer on {self.socket} within "
                                   f"{time.monotonic() - started:.0f} s: "
                                   f"{answer.stderr.strip()}; its log: {self._log()}")
            time.sleep(0.1)
        self.start_seconds = time.monotonic() - started

    def _log(self) -> str:
        try:
            return (self.folder / "dockerd.log").read_text(errors="replace")[-2000:]
        except OSError as exc:
            return f"(no log: {exc})"

    def stop(self) -> None:
        """End this dockerd (SIGTERM stops its containers and its containerd), by its pid; what it left
        running, its mounts and its folder go too."""
        if self.process is not None:
            terminate(self.process, grace=60)
        self._end_leftovers()
        self._unmount()
        if self._made_netns:  # its bridge and the containers' veths go with it
            subprocess.run(["ip", "netns", "del", str(self.netns)], capture_output=True, timeout=20)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _end_leftovers(self) -> None:
        """After a dockerd that could not stop cleanly: its containers' processes (by their cgroups), and
        its containerd and shims (their command lines name this folder, which no one else's do)."""
        pids: set[int] = set()
        containers = self.folder / "data" / "containers"
        for container in containers.iterdir() if containers.is_dir() else []:
            for cgroup in (f"pids/docker/{container.name}", f"docker/{container.name}",
                           f"system.slice/docker-{container.name}.scope"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(pid) for pid in Path(f"/sys/fs/cgroup/{cgroup}/cgroup.procs").read_text().split())
        mine = str(self.folder).encode()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if mine in (entry / "cmdline").read_bytes():
                        pids.add(int(entry.name))
        pids.discard(os.getpid())
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def _unmount(self) -> None:
        """What dockerd mounted under its folder (overlays, network namespaces), deepest first."""
        mine = str(self.folder) + "/"
        points = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if point.startswith(mine):
                points.append(point)
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "--lazy", point], capture_output=True, timeout=30)

    def run(self, *args: str, check: bool = True, timeout: float = 120,
            stdin: int | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.path, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=stdin)
        if check and done.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} failed (status {done.returncode}): {done.stderr.strip()}")
        return done

    def has_image(self, name: str) -> bool:
        return self.run("image", "inspect", name, check=False).returncode == 0

    def _loaded(self, name: str) -> str:
        """`name` from podman's store, loaded the first time it is asked for."""
        if self.has_image(name):
            return name
        started = time.monotonic()
        save = subprocess.Popen([self.podman.path, "save", "--quiet", name], env=self.podman.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            loaded = self.run("load", "--quiet", stdin=save.stdout.fileno() if save.stdout else None, check=False,
                              timeout=600)
        finally:
            if save.stdout is not None:
                save.stdout.close()
            said = save.stderr.read().decode(errors="replace") if save.stderr else ""
            save.wait(600)
        if save.returncode != 0:
            raise RuntimeError(f"podman save {name} failed (status {save.returncode}): {said.strip()}")
        if loaded.returncode != 0:
            raise RuntimeError(f"docker load of {name} failed (status {loaded.returncode}): {loaded.stderr.strip()}")
        self.load_seconds[name] = time.monotonic() - started
        return name

    def image(self) -> str:
        return self._loaded(self.podman.image())

    def minimal_image(self) -> str:
        return self._loaded(self.podman.minimal_image())

    def no_python_image(self) -> str:
        return self._loaded(self.podman.no_python_image())

    def owsandbox_image(self) -> str:
        return self._loaded(self.podman.owsandbox_image())

    def singleuser_image(self) -> str:
        return self._loaded(self.podman.singleuser_image())


def engine_of(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The engine fixture named by `request.param` ("podman" or "docker"), with this process's
    environment holding its settings and none of the container provider's own."""
    for name in ("OWSANDBOX_ENGINE", "OWSANDBOX_IMAGE", "OWSANDBOX_LIMITS", "OWSANDBOX_NETWORK", "OWSANDBOX_ENV",
                 "OWSANDBOX_CONTAINER_OPTIONS", "OWSANDBOX_CONTAINER_USER", "OWSANDBOX_WRITABLE_ROOT"):
        monkeypatch.delenv(name, raising=False)
    found = request.getfixturevalue(request.param)
    for name, value in found.settings.items():
        monkeypatch.setenv(name, value)
    return found
