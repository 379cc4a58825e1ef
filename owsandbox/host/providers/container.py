"""The `container` provider: a fresh container per kernel from an image (Podman or Docker), made when
the kernel starts and removed when it shuts down.

`OWSANDBOX_IMAGE` names the image, `OWSANDBOX_ENGINE` the engine (`podman` or `docker`; by default
whichever is on PATH, podman first). The engine must run on this machine: the workspace is bound in.

* **The container**: `run -d` named from the kernel's key (`owsandbox-UID-KEY`), the workspace
  bound read-write at `/workspace` (where commands start), no network unless `OWSANDBOX_NETWORK=1`,
  memory (swap included), process and CPU limits from `OWSANDBOX_LIMITS` (the bwrap provider's
  `Limits`), every capability dropped, `no-new-privileges`, a read-only root (unless
  `OWSANDBOX_WRITABLE_ROOT=1`) with private size-limited `/tmp`, `/var/tmp`, `/dev/shm` and the
  runner's own `/run/owsandbox`, an empty home (`/root`, else `/home/sandbox`), the image's user or
  `OWSANDBOX_CONTAINER_USER`, labels naming the key, user, creation time and settings (`owsandbox.*`).
  Podman runs it with `--rm` and keeps its log here (`k8s-file` at a path of ours), which outlives the
  container; Docker's `--rm` would take its log with it, so a Docker container is not run with `--rm`:
  an ended one stays (no process, its log readable) until it is removed here.
* **The runner** goes in and starts as the `exec` provider does it, through `ENGINE exec -i NAME`
  (this class is an `ExecProvider` with that prefix): the box's bootstrap checks the image's
  `python3` (a partial one such as Debian's python3-minimal is named), takes the zipapp in (sent with
  the first call: a new container never has it) and starts the daemon detached in `/run/owsandbox`.
* **Lifetime**, decided on this machine: the kernel touches a lease file here every few seconds
  (`LEASE_SECONDS`), bound read-only into the box; the container's first process (`WAITER`, in the
  image's `python3` with the standard library's core only) reaps orphans and ends the container once
  the lease has not moved for the linger time (and a touch more). So a kernel killed for good leaves
  nothing running after that: podman's `--rm` takes the container away, Docker's ended one is removed
  by this user's next start (below); nothing inside can keep it alive, since
  the box can neither touch the lease nor kill its first process. `release` (a kernel restart) stops
  touching and leaves the container with its daemon lingering; the next kernel with the same key
  finds it by name and reuses it when it runs with the same settings (label `owsandbox.spec`), else
  replaces it. `destroy` removes it (`rm -f`). Each start removes this user's ended containers (found
  by label: Docker's, and any an engine left behind), and the folders here of containers it can prove
  dead: made by the same engine (each folder records which, with its lease limit), not listed by it,
  and whose lease has not moved for that limit and `STATE_SWEEP_SECONDS` more. Another engine's folder
  is never touched: removing it would take the lease away from a box that engine still runs (the box
  would end itself), and this engine cannot see that box.
* **Its door**: each time the runner starts or is found, the folder here records how the box's execd
  endpoint is reached (`container_door`: this engine's `exec -i` of the runner's `forward`, with the
  engine's settings and the daemon's token), so that the Jupyter server's `%preview` proxy reaches the
  box as the kernel does, without a network.
* **Limit events** are read from the container's own cgroup (OOM kills, refused forks), on this
  machine, where the box cannot write: found from its first process's `/proc/PID/cgroup`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ... import settings
from ...settings import Settings, settings_of
from ..isolation.container_seccomp import default_profile_path, extend_profile
from ..isolation.guard import Guard, GuardedWorkspace
from ..isolation.policy import WorkspaceRefused, passed_env_names, refuse_workspace
from ..isolation.resources import CGROUP_ROOT, CgroupEnforcement, LimitReport, Limits, human_size
from ..logpump import BoxLines
from ..privatedir import runtime_root
from ..programs import host_program, mark_box_writable
from . import container_door
from .boxed import BoxError
from .exec import ExecProvider, stdin_program
from .questions import SnapshotSite

IMAGE_ENV = settings.IMAGE
ENGINE_ENV = settings.ENGINE
ENGINES = ("podman", "docker")
WORKSPACE = "/workspace"  # the workspace in the box, and the folder commands start in
RUNTIME = "/run/owsandbox"  # the runner's private runtime folder in the box (a tmpfs of its own)
OTHER_HOME = "/home/sandbox"  # HOME of a container user other than root, when the root is read-only
LEASE = "/run/owsandbox-lease"  # the lease in the box, read-only
LEASE_SECONDS = 5.0  # how often the kernel touches the lease (more often for a short linger)
STATE_SWEEP_SECONDS = 60.0  # a folder here of a dead container goes once its lease is this much older than its limit
ENGINE_RECORD = "engine.json"  # in each folder here: which engine made its container, and the lease's limit

log = logging.getLogger(__name__)
ENGINE_SETTINGS = ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "CONTAINER_HOST",
                   "CONTAINER_CONNECTION", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH",
                   "DOCKER_TLS_VERIFY")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]")

#: The container's first process: it reaps orphans (it is the PID namespace's init) and ends the
#: container once the lease (argv[1]) has not changed for argv[2] seconds, timed by its own monotonic
#: clock. No signal handler: nothing inside can kill it (the engine stops it with SIGKILL). Only `os`,
#: `signal`, `sys` and `time`: python3-minimal has them, so an image with only that starts, and the
#: bootstrap names what it lacks.
WAITER = r"""
import os, signal, sys, time
lease, limit = sys.argv[1], float(sys.argv[2])
def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
signal.signal(signal.SIGCHLD, reap)
print("owsandbox: the container lives while its kernel renews %s" % lease, flush=True)
seen, since = None, time.monotonic()
while True:
    try:
        stamp = os.stat(lease).st_mtime_ns
    except OSError:
        stamp = None
    now = time.monotonic()
    if stamp != seen:
        seen, since = stamp, now
    elif now - since > limit:
        print("owsandbox: no kernel for %g s: the container ends" % limit, flush=True)
        sys.exit(0)
    reap()
    time.sleep(0.5)
"""


def find_engine(name: str | None = None, avoid: Iterable[str] = (),
                settings: Settings | None = None) -> tuple[str, str]:
    """(engine name, its path): `name`, else OWSANDBOX_ENGINE, else podman or docker, whichever is on
    PATH first. BoxError naming what to install when there is none."""
    wanted = name or settings_of(settings).engine
    if wanted and os.path.basename(wanted) not in ENGINES:
        raise ValueError(f"{ENGINE_ENV}={wanted!r}: the container engine must be podman or docker")
    for candidate in ([wanted] if wanted else list(ENGINES)):
        path = host_program(candidate, avoid)
        if path:
            return os.path.basename(candidate), path
    if wanted and os.path.basename(wanted) == "docker":
        raise BoxError("docker is not installed (or not on PATH): install Docker Engine "
                       "(https://docs.docker.com/engine/install/), or podman (apt-get install podman) and "
                       f"set {ENGINE_ENV}=podman")
    if wanted:
        raise BoxError(f"{wanted} is not installed (or not on PATH): install podman (Debian/Ubuntu: "
                       "apt-get install podman)")
    raise BoxError("no container engine: neither podman nor docker is on PATH. Install podman (Debian/Ubuntu: "
                   "apt-get install podman) or Docker Engine, or choose another sandbox provider")


LOG_LIMIT = "1m"  # the most of a container's log its engine keeps (docker's json-file and podman's k8s-file alike)


def box_words(text: str) -> str:
    """What the container wrote (its log), each line marked as the box's, as a bwrap box's log is: an
    error that quotes it shows whose words they are, whatever they imitate."""
    return BoxLines().mark(text.encode()).decode(errors="replace") if text else ""


def container_name(uid: int, key: str) -> str:
    """The container's name: the user and the kernel's key, in the characters engines take."""
    return f"owsandbox-{uid}-{_NAME_CHARS.sub('-', key)}"[:200]


def _state_word(text: str) -> str:
    """`running`, `ended` or `other`, from what `ps` prints as a container's state: docker and podman
    print `running`/`exited`; podman 4 prints `Up 3 seconds`/`Exited (0) ...` from its template."""
    word = text.strip().lower()
    if word.startswith(("up", "running")):
        return "running"
    if word.startswith(("exited", "dead", "stopped")):
        return "ended"
    return "other"


def _limit_in(path: Path) -> int | None:
    """The number in a cgroup's limit file (a memory limit in bytes), or None."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _near(found: int | None, wanted: int) -> bool:
    """Whether a cgroup's limit is the one asked for (the kernel rounds it down to whole pages)."""
    return found is not None and 0 <= wanted - found < 1 << 16


class ContainerProvider(GuardedWorkspace, ExecProvider):
    name = "container"
    enforcement = "a container"
    network_fixed = ("a container's network is chosen when it is made: start the kernel with OWSANDBOX_NETWORK=1 "
                     "(owsandbox install --env OWSANDBOX_NETWORK=1) for the engine's default network, outbound")

    def __init__(self, cwd: str | os.PathLike[str] | None = None, image: str | None = None,
                 engine: str | None = None, network: bool | None = None,
                 limits: Limits | list[str] | str | None = None, key: str | None = None,
                 linger_seconds: float | None = None, relay_silence_seconds: float = 60.0, python: str = "python3",
                 user: str | None = None, writable_root: bool | None = None, options: list[str] | str | None = None,
                 timeout: float = 120.0, workspace_in_box: str = WORKSPACE, settings: Settings | None = None) -> None:
        settings = settings_of(settings)
        self.image = image or settings.image
        if not self.image:
            raise ValueError(f"the container provider needs an image: set {IMAGE_ENV} (or owsandbox install "
                             "--provider container --image IMAGE)")
        self.uid = os.getuid()
        key = key or f"k-{os.urandom(8).hex()}"
        self.container = container_name(self.uid, key)
        self.engine_name, self.engine = (engine or settings.engine or "auto"), ""
        if linger_seconds is None:
            linger_seconds = 30.0 if settings.linger is None else settings.linger
        # Where the workspace is in the box: /workspace, or (for tests that reuse other providers' checks
        # with the host's paths) the host's own path.
        self.workspace = workspace_in_box
        super().__init__(cwd, prefix=["ENGINE", "exec", "-i", self.container], python=python, key=key,
                         linger_seconds=linger_seconds, relay_silence_seconds=relay_silence_seconds,
                         box_cwd=workspace_in_box, timeout=timeout, settings=settings)
        self.runtime_dir = RUNTIME
        self.host_cwd = os.path.realpath(self.local_cwd)
        mark_box_writable(self.host_cwd)  # this machine's programs (the engine) are never looked up in it
        self.network = network if network is not None else settings.network
        self.limits = limits if isinstance(limits, Limits) else Limits.parse(
            limits if limits is not None else list(settings.limits))
        self.user = user if user is not None else settings.container_user
        self.writable_root = writable_root if writable_root is not None else settings.writable_root
        options = options if options is not None else settings.container_options
        self.options = shlex.split(options) if isinstance(options, str) else list(options)
        self.home = os.path.realpath(os.path.expanduser("~"))
        self.guard: Guard | None = None
        # The engine's own settings, given to the kernel (`install --env CONTAINERS_CONF=...`), are not the box's.
        self.env_names = [name for name in passed_env_names(settings) if name not in ENGINE_SETTINGS]
        self.container_id = ""
        self.image_id = ""
        self.image_user = ""
        self.created_now = False  # this provider made the container (rather than finding it running)
        self.cgroup: CgroupEnforcement | None = None
        self._fresh = False  # a container without the runner yet: the first bootstrap brings it
        self._connections = 0
        self.removal_seconds: float | None = None  # how long the last `rm -f` took (destroy)
        self.state_dir: Path | None = None  # this machine's private folder for the container (its podman log)
        self.limits_confirmed = False  # the container's cgroup was found, with our memory limit in it
        self.limits_ignored = ""  # what the engine said when it ignored the limits
        self._lease_thread: threading.Thread | None = None
        self._lease_stop = threading.Event()

    # -- the engine --------------------------------------------------------------------------

    def _engine_run(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        argv = [self.engine, *args]
        # podman's conmon keeps the caller's folder and writes a file `oom` there when the container
        # meets its memory limit: give it ours, not the notebook's.
        here = self.state_dir if self.state_dir is not None and self.state_dir.is_dir() else None
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout or self.timeout,
                                  stdin=subprocess.DEVNULL, cwd=here)
        except FileNotFoundError as exc:
            raise BoxError(f"cannot run {self.engine_name}: {exc.strerror}") from None
        except subprocess.TimeoutExpired:
            raise BoxError(f"{self.engine_name} {' '.join(args[:2])} did not answer within "
                           f"{timeout or self.timeout:g} s") from None

    def _failed(self, what: str, done: subprocess.CompletedProcess[str]) -> BoxError:
        message = done.stderr.strip() or done.stdout.strip() or "no message"
        return BoxError(f"{self.engine_name} could not {what} (status {done.returncode}): {message[-1500:]}")

    def _use_engine(self) -> None:
        if not self.engine:
            self.engine_name, self.engine = find_engine(None if self.engine_name == "auto" else self.engine_name,
                                                        avoid=[self.host_cwd], settings=self.settings)
            self.prefix = [self.engine, "exec", "-i", self.container]

    # -- what the container is made of -------------------------------------------------------

    def check_workspace(self) -> None:
        if "," in self.host_cwd:  # (no system folder has one: the order of the checks does not matter)
            raise WorkspaceRefused(f"the workspace {self.host_cwd} has a comma, which a container mount cannot name")
        refuse_workspace(self.host_cwd, lambda: str(runtime_root(avoid=self.host_cwd)),
                         "this machine's private folder of the containers' leases and logs: a container that may "
                         "write there could keep itself alive")

    def guarded_folder(self) -> str:
        return self.host_cwd

    def _in_box(self, host_path: str) -> str:
        return self.workspace.rstrip("/") + host_path[len(self.host_cwd.rstrip("/")):]

    def spec(self) -> str:
        """A digest of the settings a container was made with: one made otherwise is not reused."""
        made_with = [self.engine_name, self.image, self.host_cwd, self.limits.describe(), self.network,
                    self.writable_root, self.user, self.options, self.env_names, self.python, self.workspace,
                    "seccomp: no setuid or setgid modes, no keyrings"]  # one made before that profile is not reused
        return hashlib.sha256(json.dumps(made_with, default=str).encode()).hexdigest()[:16]

    def _runs_as_root(self) -> bool:
        user = (self.user or self.image_user).split(":", 1)[0]
        return user in ("", "0", "root")

    def run_args(self) -> list[str]:
        """The engine's `run` arguments, up to and including the image and the first process."""
        tmpfs = f"rw,nosuid,nodev,size={self.limits.tmp}"
        # Docker's --rm would remove the container's log with it: a Docker container that ended is removed
        # here, after its last words were read (destroy, _start_failed, _make_again, the sweep).
        keep = [] if self.engine_name == "docker" else ["--rm"]
        args = ["run", "--detach", *keep, "--name", self.container, "--pull", "never", "--hostname", "sandbox",
                "--label", f"owsandbox.key={self.key}", "--label", f"owsandbox.user={self.uid}",
                "--label", f"owsandbox.created={int(time.time())}", "--label", f"owsandbox.spec={self.spec()}",
                "--label", f"owsandbox.image={self.image}", "--label", f"owsandbox.workspace={self.host_cwd}",
                "--label", f"owsandbox.linger={self.linger_seconds:g}",
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges", *self._seccomp_options(),
                "--stop-signal", "KILL",
                "--memory", str(self.limits.memory), "--memory-swap", str(self.limits.memory),
                "--pids-limit", str(self.limits.pids), "--shm-size", str(self.limits.shm)]
        if self.limits.cpu is not None:
            args += ["--cpus", f"{self.limits.cpu:g}"]
        if not self.network:
            args += ["--network", "none"]
        if not self.writable_root:
            args.append("--read-only")
            if self.engine_name == "podman":
                args.append("--read-only-tmpfs=false")  # podman's own /tmp, /var/tmp, /run: ours instead
        args += ["--tmpfs", f"/tmp:{tmpfs},exec,mode=1777", "--tmpfs", f"/var/tmp:{tmpfs},exec,mode=1777",
                 "--tmpfs", f"{RUNTIME}:{tmpfs},mode=1777"]
        if not self.writable_root and self._runs_as_root():
            args += ["--tmpfs", f"/root:{tmpfs},exec,mode=700"]  # a private home, as bwrap gives
        elif not self.writable_root:  # another user's home may not be there, or is read-only: one of its own
            args += ["--tmpfs", f"{OTHER_HOME}:{tmpfs},exec,mode=1777", "--env", f"HOME={OTHER_HOME}"]
        guard = self.workspace_guard()
        top_read_only = ",readonly" if self.host_cwd in guard.tops else ""  # the home is the workspace, say
        args += ["--mount", f"type=bind,source={self.host_cwd},destination={self.workspace}{top_read_only}",
                 "--workdir", self.workspace]
        # Nested binds: engines mount them after the workspace, parents first (sorted by depth, as here). A
        # pinned folder is bound onto itself so that the box cannot rename it (EBUSY), nor so replace a
        # protected path inside it. Binds, not tmpfs, for what is hidden: engines mount tmpfs first.
        for path, kind in guard.mounts_in_order():
            if path == self.host_cwd:
                continue
            if kind == "hidden":
                source = self._empty_folder() if os.path.isdir(path) else "/dev/null"
                args += ["--mount", f"type=bind,source={source},destination={self._in_box(path)},readonly"]
            else:
                read_only = ",readonly" if kind in ("top", "read-only") else ""
                args += ["--mount", f"type=bind,source={path},destination={self._in_box(path)}{read_only}"]
        if self.user:
            args += ["--user", self.user]
        if self.engine_name == "podman" and self.state_dir is not None:
            # Podman keeps a log at a path of ours after --rm has removed the container: the last words
            # of a container that died are still there to show.
            args += ["--log-driver", "k8s-file", "--log-opt", f"path={self.state_dir / 'container.log'}"]
        # The container's log is what its first process's stdout and stderr receive, and anything in the box
        # that opens /proc/1/fd/1 writes there: the engine keeps at most this much of it on the host's disk.
        args += ["--log-opt", f"max-size={LOG_LIMIT}"]
        args += ["--env", f"{settings.SANDBOX_KIND}=container"]
        for name in self.env_names:
            if name in os.environ:
                args += ["--env", name]  # the value comes from this process's environment
        args += ["--mount", f"type=bind,source={self._lease_path()},destination={LEASE},readonly"]
        args += [*self.options, "--entrypoint", self.python, self.image, "-S", "-c", WAITER, LEASE,
                 f"{self.lease_limit():g}"]
        return args

    def _seccomp_options(self) -> list[str]:
        """The engine's default seccomp profile with no setuid or setgid modes and no keyrings (see container_seccomp),
        written to this machine's folder of the container; [] where there is no default to extend.
        Docker's own default is built into dockerd, not on disk: containers-common's file, in the same
        format, is extended for Docker too."""
        base = default_profile_path()
        if base is None or self.state_dir is None:
            return []
        profile = extend_profile(json.loads(Path(base).read_text()))
        path = self.state_dir / "seccomp.json"
        path.write_text(json.dumps(profile))
        return ["--security-opt", f"seccomp={path}"]

    def _seccomp_words(self) -> str:
        """The container's seccomp profile, in words (its file here is written when the container is made)."""
        if self.state_dir is not None and (self.state_dir / "seccomp.json").is_file():
            return (f"seccomp: {default_profile_path() or 'the default profile'} and no setuid or setgid modes, no "
                    "kernel keyrings")
        return (f"seccomp: {self.engine_name}'s built-in default, setuid modes NOT refused (no profile file to "
                "extend: install containers-common)")

    def _empty_folder(self) -> str:
        """An empty folder here, to put over a folder of the workspace that must stay hidden."""
        assert self.state_dir is not None
        folder = self.state_dir / "empty"
        folder.mkdir(mode=0o555, exist_ok=True)
        return str(folder)

    # -- the lease -----------------------------------------------------------------------------

    def lease_interval(self) -> float:
        return max(0.5, min(LEASE_SECONDS, self.linger_seconds / 4))

    def lease_limit(self) -> float:
        """How long the container outlives the last touch of its lease."""
        return self.linger_seconds + self.lease_interval() + 1

    def _lease_path(self) -> Path:
        assert self.state_dir is not None
        return self.state_dir / "lease"

    def _renew_lease(self) -> None:
        """Touch the lease now, and from a thread every `lease_interval` until released or destroyed. A
        failure to touch it is said in the kernel's log and tried again at the next interval: the thread
        ends only when told to (a lease left alone would end the box after the linger time)."""
        path = self._lease_path()
        path.touch(mode=0o644)
        os.utime(path)
        if self._lease_thread is None:
            stop = self._lease_stop = threading.Event()

            def renew() -> None:
                failing = False
                while not stop.wait(self.lease_interval()):
                    try:
                        os.utime(path)
                    except OSError as exc:
                        if not failing:
                            log.warning("the lease of container %s could not be renewed (%s): it ends itself %g s "
                                        "after the last renewal unless this passes", self.container, exc,
                                        self.lease_limit())
                        failing = True
                        continue
                    if failing:
                        log.warning("the lease of container %s is renewed again", self.container)
                        failing = False
            self._lease_thread = threading.Thread(target=renew, name="container-lease", daemon=True)
            self._lease_thread.start()

    def engine_identity(self) -> str:
        """Which engine this is: its program and the settings that point it at a daemon or a store (two
        dockerds differ by DOCKER_HOST, two podman stores by their configuration)."""
        assert self.engine
        chosen = {name: os.environ[name] for name in ENGINE_SETTINGS if name in os.environ}
        return json.dumps([self.engine_name, os.path.realpath(self.engine), chosen], sort_keys=True)

    def engine_folder_name(self) -> str:
        """The folder of this engine's boxes in the runtime folder: one per engine, so that a podman and a
        Docker kernel (or two dockerds) with the same key never share a state folder, and a sweep only
        ever looks at its own engine's."""
        digest = hashlib.sha256(self.engine_identity().encode()).hexdigest()[:12]
        return f"{self.engine_name}-{digest}"

    def _record_engine(self) -> None:
        assert self.state_dir is not None
        record = self.state_dir / ENGINE_RECORD
        fresh = record.with_suffix(".new")
        fresh.write_text(json.dumps({"engine": self.engine_identity(), "lease_limit": self.lease_limit()}))
        fresh.replace(record)

    def _provably_dead(self, folder: Path) -> bool:
        """Whether the folder here of a container this engine does not list belongs to a box that is over:
        its record names this engine, and its lease has not moved for its limit and STATE_SWEEP_SECONDS more.
        A folder without a record (or with another engine's) is never said to be dead."""
        try:
            record = json.loads((folder / ENGINE_RECORD).read_text())
            renewed = (folder / "lease").stat().st_mtime
        except (OSError, ValueError, RecursionError):
            return False
        if not isinstance(record, dict) or record.get("engine") != self.engine_identity():
            return False
        limit = record.get("lease_limit")
        limit = float(limit) if isinstance(limit, (int, float)) and limit >= 0 else self.lease_limit()
        return time.time() - renewed > limit + STATE_SWEEP_SECONDS

    def _stop_lease(self) -> None:
        thread, self._lease_thread = self._lease_thread, None
        self._lease_stop.set()
        if thread is not None:
            thread.join(5)

    # -- containers of this user -------------------------------------------------------------

    def _ours(self) -> dict[str, tuple[str, str, str]]:
        """This user's owsandbox containers: name → (state word, id, spec label)."""
        done = self._engine_run("ps", "--all", "--filter", f"label=owsandbox.user={self.uid}", "--format",
                                "{{.Names}}\t{{.State}}\t{{.ID}}\t{{.Labels}}")
        if done.returncode != 0:
            raise self._failed("list its containers", done)
        found = {}
        for line in done.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) < 4:
                continue
            spec = re.search(r"owsandbox\.spec[:=]([0-9a-f]+)", parts[3])
            found[parts[0].strip()] = (_state_word(parts[1]), parts[2].strip(), spec.group(1) if spec else "")
        return found

    def _remove(self, name: str) -> float:
        """Remove a container, whatever it runs (its first process ignores signals from inside; the
        engine's SIGKILL ends it); the seconds it took."""
        started = time.monotonic()
        wait = ["--time", "0"] if self.engine_name == "podman" else []
        self._engine_run("rm", "--force", *wait, name)
        return time.monotonic() - started

    def _sweep(self, found: dict[str, tuple[str, str, str]]) -> None:
        """Remove this user's ended containers (Docker's, run without `--rm`; podman's that `--rm` did not
        take, after a reboot say), and the folders here of containers long gone (a kernel killed for good
        leaves its folder). Only this engine's folder is looked in, and even there a folder goes only when
        its record proves it dead."""
        for name, (state, _, _) in found.items():
            if state == "ended" and name != self.container:
                self._remove(name)
        assert self.state_dir is not None
        for folder in self.state_dir.parent.glob(f"owsandbox-{self.uid}-*"):
            if folder.name not in found and folder.name != self.container and self._provably_dead(folder):
                shutil.rmtree(folder, ignore_errors=True)

    def _check_image(self) -> None:
        done = self._engine_run("image", "inspect", "--format", "{{.Id}}\t{{.Config.User}}", self.image)
        if done.returncode != 0:
            text = (done.stderr + done.stdout).lower()
            if any(word in text for word in ("no such image", "image not known", "not found", "unable to find")):
                raise BoxError(f"the image {self.image} is not here: get it with: {self.engine_name} pull "
                               f"{self.image}; or build it: {self.engine_name} build -t {self.image} ... "
                               "(share/containers/teaching.Containerfile is an example)")
            raise self._failed(f"find the image {self.image}", done)
        image_id, _, user = done.stdout.strip().partition("\t")
        self.image_id, self.image_user = image_id.strip(), user.strip()

    def _run_container(self) -> None:
        done = self._engine_run("run", *self.run_args()[1:])
        if done.returncode != 0:
            text = done.stderr + done.stdout
            if re.search(rf"{re.escape(self.python)}.*(not found|no such file)", text, re.IGNORECASE | re.DOTALL):
                error = BoxError(f"the image {self.image} has no {self.python}, which the runner needs: add "
                                 f"python3 to it (Debian/Ubuntu: apt-get install python3) ({self.engine_name} said: "
                                 f"{text.strip()[-600:]})")
            else:
                error = self._failed(f"start a container of {self.image}", done)
            self._remove(self.container)  # Docker (no --rm) keeps a container that was made but never started
            raise error
        self.container_id = done.stdout.strip().splitlines()[-1][:12] if done.stdout.strip() else ""
        self.created_now = self._fresh = True
        # Podman says so when it cannot limit (rootless on cgroup v1): "Resource limits are not supported
        # and ignored on cgroups V1 rootless systems".
        warnings = [line.strip() for line in done.stderr.splitlines() if "ignored" in line.lower()]
        self.limits_ignored = " ".join(warnings) if any("limit" in w.lower() for w in warnings) else ""
        if self.state_dir is not None:  # for a kernel that restarts and reuses the container
            (self.state_dir / "limits-ignored").write_text(self.limits_ignored)

    def _running(self) -> bool:
        done = self._engine_run("inspect", "--format", "{{.State.Running}}", self.container)
        return done.returncode == 0 and done.stdout.strip() == "true"

    def _death_note(self) -> str:
        """Why the container is not running, with the end of its log, as far as the engine still knows."""
        state = self._engine_run("inspect", "--format", "{{.State.Status}} (exit status {{.State.ExitCode}}, "
                                 "OOM-killed: {{.State.OOMKilled}})", self.container)
        if state.returncode != 0:
            note = f"the container {self.container} is gone (it ended, and the engine removed it: it runs with --rm)"
            tail = self._log_tail()
            return note + (f"; the last lines of its log:\n{tail}" if tail else "")
        logs = self._engine_run("logs", "--tail", "20", self.container)
        tail = box_words((logs.stdout + logs.stderr).strip())
        note = f"the container {self.container} is {state.stdout.strip()}"
        return note + (f"; the last lines of its log:\n{tail}" if tail else "; its log is empty")

    def _log_tail(self, lines: int = 20) -> str:
        """The end of the log podman kept here (k8s-file lines: time, stream, tag, text)."""
        if self.state_dir is None:
            return ""
        try:
            # Lines end at \n only (bytes, not text mode, which reads a \r as a line's end): a carriage return
            # the box wrote is inside its record, which BoxLines then shows as a line of its own, marked.
            data = (self.state_dir / "container.log").read_bytes().decode(errors="replace")
            kept = data.rstrip("\n").split("\n")[-lines:]
        except OSError:
            return ""
        return box_words("\n".join(line.split(" ", 3)[-1] for line in kept))

    def _find_cgroup(self) -> None:
        """The container's own cgroup, for counting limit events: from its first process on this machine."""
        self.cgroup = None
        done = self._engine_run("inspect", "--format", "{{.Id}}\t{{.State.Pid}}\t{{.Image}}", self.container)
        if done.returncode != 0:
            return
        parts = done.stdout.strip().split("\t")
        if len(parts) == 3:
            self.container_id = parts[0][:12]
            self.image_id = self.image_id or parts[2]
        try:
            lines = Path(f"/proc/{int(parts[1])}/cgroup").read_text().splitlines()
        except (OSError, ValueError, IndexError):
            return
        paths = {}
        for line in lines:
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path.lstrip("/")
        # Counted only where the cgroup holds our memory limit: a container an engine could not limit
        # (rootless podman on cgroup v1) runs in a cgroup shared with other processes.
        if (CGROUP_ROOT / "cgroup.controllers").exists() and "" in paths:
            folder = CGROUP_ROOT / paths[""]
            if _near(_limit_in(folder / "memory.max"), self.limits.memory):
                self.cgroup = CgroupEnforcement(self.limits, {"unified": folder}, 2)
        elif "memory" in paths:
            folders = {c: CGROUP_ROOT / c / paths[c] for c in ("memory", "pids") if c in paths}
            if _near(_limit_in(folders["memory"] / "memory.limit_in_bytes"), self.limits.memory):
                self.cgroup = CgroupEnforcement(self.limits, folders, 1)
        self.limits_confirmed = self.cgroup is not None

    # -- the provider -----------------------------------------------------------------------

    def create(self) -> None:
        with self._lifecycle:
            self._use_engine()
            self.check_workspace()
            self.guard = None  # scanned again: the workspace may have changed since the last start
            engine_folder = runtime_root(avoid=self.host_cwd) / self.engine_folder_name()
            engine_folder.mkdir(mode=0o700, exist_ok=True)
            self.state_dir = engine_folder / self.container
            self.state_dir.mkdir(mode=0o700, exist_ok=True)
            try:
                self._renew_lease()
                self._record_engine()
                self._make_or_find()
                try:
                    self._start()
                except BoxError as exc:
                    raise BoxError(self._start_failed(str(exc))) from None
            except BaseException:
                self._stop_lease()
                shutil.rmtree(self.state_dir, ignore_errors=True)
                raise
            self._find_cgroup()

    def _start_failed(self, message: str) -> str:
        """The error of a container whose runner did not start, with what to do; the container goes."""
        if "python3-minimal" in message:
            message += (f". Add python3 to the image {self.image} (in its Containerfile: RUN apt-get install -y "
                        "python3; see share/containers/teaching.Containerfile)")
        elif not self._running():
            message += f"; {self._death_note()}"
        self._remove(self.container)
        return message

    def _make_or_find(self) -> None:
        found = self._ours()
        self._sweep(found)
        state, container_id, spec = found.get(self.container, ("", "", ""))
        if state == "running" and spec == self.spec():
            self.container_id, self.created_now, self._fresh = container_id, False, False
            try:
                self.limits_ignored = (self.state_dir / "limits-ignored").read_text()
            except OSError:
                self.limits_ignored = ""
            return
        if state:
            self._remove(self.container)  # ended, starting, or made with other settings
        self._check_image()
        self._run_container()

    def _run_bootstrap(self, args: dict[str, Any]) -> dict[str, Any]:
        if self._fresh and args["action"] == "start":
            self._fresh = False  # a new container never has the runner: send it with the first call
            return self._run_program(stdin_program(args, self._upload()))
        return super()._run_bootstrap(args)

    def _started(self, answer: dict[str, Any]) -> None:
        """Take in the bootstrap's answer, and record in this machine's folder of the container how its
        execd endpoint is reached (container_door), for the Jupyter server's `%preview` proxy."""
        super()._started(answer)
        token = self.daemon_info.get("execd_token") if isinstance(self.daemon_info, dict) else None
        if self.state_dir is None or not isinstance(token, str):
            return  # a daemon of an older owsandbox: the record says nothing, and the proxy says so
        chosen = {name: os.environ[name] for name in ENGINE_SETTINGS if name in os.environ}
        execd_socket = os.path.join(os.path.dirname(self.socket_path), "execd.sock")  # beside the runner's
        container_door.write(self.state_dir, container_door.ContainerDoor(
            self.engine, self.container, self.box_python, self.runner_path, execd_socket, token, chosen))

    def open_runner(self):  # type: ignore[no-untyped-def]
        """A relay through `exec -i`; a container found gone on a reconnection is made again (the client
        then sees a new instance, as after a sandbox restart)."""
        with self._lifecycle:
            try:  # the client retries what fails with OSError, and says why when it gives up
                if self._connections and not self._running():
                    self._make_again()
            except BoxError as exc:
                raise OSError(str(exc)) from None
            self._connections += 1
        return super().open_runner()

    def _make_again(self) -> None:
        note = self._death_note()
        try:
            self._remove(self.container)
            self._check_image()
            self._run_container()
            self._start()
        except BoxError as exc:
            raise BoxError(f"{note}; it could not be made again: {exc}") from None
        self._find_cgroup()

    def snapshot_site(self) -> SnapshotSite:
        """Snapshots are taken here: the workspace is this machine's folder, and the box stops whole
        around a restore (the container removed, then a new one)."""
        return SnapshotSite(self.guarded_folder(), self.workspace_guard(), self.stopped)

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """The container removed (everything in it ends) while the caller works on the workspace (a
        snapshot's restore), then a new one from the image: nothing inside writes while the host does, and
        its /tmp and home start empty. A client reconnecting meanwhile waits, and sees a new instance."""
        with self._lifecycle:
            self._remove(self.container)
            try:
                yield
            finally:
                self.note_box_made()
                self.guard = None  # the workspace the caller left is scanned again
                self._check_image()
                self._run_container()
                self._start()
                self._find_cgroup()

    def release(self) -> None:
        """Leave the container and its lingering daemon for a kernel that restarts with the same key
        (within the linger time: the lease is no longer renewed)."""
        self._stop_lease()
        self._disconnect()

    def destroy(self) -> None:
        self._stop_lease()
        self._disconnect()
        with self._lifecycle:
            if self.engine:
                self.removal_seconds = self._remove(self.container)
            if self.state_dir is not None:
                shutil.rmtree(self.state_dir, ignore_errors=True)
        self.note_box_made()

    def limit_counters(self) -> dict[str, int]:
        return self.cgroup.counters() if self.cgroup is not None else {}

    def limit_report(self) -> LimitReport | None:
        if self.limits_ignored:
            return None
        # Without the container's cgroup counters, the engine's OOM killer shows only as a SIGKILL.
        return LimitReport(self.limits.describe(), oom_counted=self.cgroup is not None)

    def network_state(self) -> str:
        return "outbound" if self.network else "none"

    def headline(self) -> list[str]:
        limits = self.limits.describe()
        return [f"{self.engine_name} container", f"image {self.image}",
                f"writes to {self.host_cwd} (as {self.workspace})", "network out" if self.network else "no network",
                "no limits (the engine ignored them)" if self.limits_ignored
                else f"{limits['memory']}, {limits['processes']} processes"]

    def _enforced_by(self) -> str:
        if self.limits_ignored:
            return f"nothing: {self.engine_name} said \"{self.limits_ignored}\""
        flags = f"the engine (--memory, --pids-limit{', --cpus' if self.limits.cpu else ''})"
        if self.cgroup is not None:
            return f"{flags}; confirmed, and events read from {self.cgroup.describe()}"
        return (f"{flags}; not confirmed: no cgroup of the container with this memory limit was found here, and "
                "limit events are not counted")

    def describe(self) -> dict[str, Any]:
        if not self.image_id and self.engine:
            done = self._engine_run("inspect", "--format", "{{.Image}}", self.container)
            self.image_id = done.stdout.strip() if done.returncode == 0 else ""
        mounts = {self.workspace: f"read-write: {self.host_cwd} of this machine",
                  "/": "read-write" if self.writable_root else "read-only (the image)",
                  "/tmp": f"private, at most {human_size(self.limits.tmp)}",
                  "/var/tmp": f"private, at most {human_size(self.limits.tmp)}",
                  "/dev/shm": f"private, at most {human_size(self.limits.shm)}",
                  RUNTIME: f"private, at most {human_size(self.limits.tmp)} (the runner's files)"}
        if not self.writable_root:
            home = "/root" if self._runs_as_root() else OTHER_HOME
            mounts[home] = f"private (empty home), at most {human_size(self.limits.tmp)}"
        guard = self.workspace_guard()
        mounts.update({self._in_box(path): f"top level read-only: nothing new can be made there ({guard.why[path]})"
                       for path in guard.tops if path != self.host_cwd})
        mounts.update({self._in_box(path): "pinned: bound onto itself, the box cannot rename or remove it"
                       for path in guard.pinned})
        mounts.update({self._in_box(path): f"read-only ({guard.why[path]})" for path in guard.read_only})
        mounts.update({self._in_box(path): f"hidden ({guard.why[path]})" for path in guard.hidden})
        return {"provider": self.name, "enforcement": self.enforcement, "engine": f"{self.engine_name} ({self.engine})",
                "image": self.image, "image id": self.image_id, "container": self.container,
                "container id": self.container_id, "made by": "this kernel" if self.created_now else
                "an earlier kernel with this key (reused)",
                "network": "outbound (the engine's default network)" if self.network else "none (--network none)",
                "mounts": mounts, "workspace guard": guard.summary(), "limits": self.limits.describe(),
                "limits enforced by": self._enforced_by(),
                "privileges": "every capability dropped, no-new-privileges, " + self._seccomp_words()
                + (f", user {self.user}" if self.user else ""),
                "environment": ", ".join([settings.SANDBOX_KIND, *[n for n in self.env_names if n in os.environ]])
                + " (and the image's own)",
                "dies with": f"its kernel: removed at shutdown; after a restart or a crash it lingers "
                             f"{self.lease_limit():g} s for the next kernel", **self._box_rows()}
