"""Real containers for tests: Debian 12 images made here and run with podman, as root.

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
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

RECIPE = "1"
IMAGE = f"localhost/owsandbox-test-bookworm:{RECIPE}"
MINIMAL_IMAGE = f"localhost/owsandbox-test-bookworm-python3-minimal:{RECIPE}"
NO_PYTHON_IMAGE = f"localhost/owsandbox-test-bookworm-no-python:{RECIPE}"
MARKER = "/etc/owsandbox-test-image"
MIRROR_ENV = "OWSANDBOX_TEST_DEBIAN_MIRROR"  # a Debian mirror, when apt's sources here name none
_CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'


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
    def __init__(self, folder: Path) -> None:
        conf = folder / "containers.conf"
        conf.write_text(_CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

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
