"""The `bwrap` provider: the daemon and every shell inside a bubblewrap sandbox.

One rule shapes it: nothing the box can write is trusted by the host, and the box sees nothing of
the host it does not need.

* **Host state outside the box.** The state folder (the daemon's log, the host's record of the
  sandbox, the two listening sockets) is never mounted in the box. The host makes the sockets and the
  daemon inherits them, so the files the relay and `%attach` connect to cannot be swapped from
  inside. The host ends the sandbox by killing the PID namespace's init, whose host pid bubblewrap
  reports on `--info-fd`; it never reads a pid the box wrote.
* **No privileges inside.** Always a user namespace with every capability dropped and no further
  user namespaces, so even a kernel run as root gives the box nothing to remount or unmount.
* **Only what is needed is mounted.** Programs and libraries read-only (`/usr`, `/lib*`, `/etc`
  without the files only their owner may read, `/opt`, the interpreter's prefix), the workspace
  read-write, and private, size-limited `/tmp`, `/var/tmp`, `/run`, `/dev/shm` and home. A workspace
  that is (or holds) the home folder still hides its secrets; a workspace of `/` is refused.
* **A clean environment**: an allowlist, plus the names in `OWSANDBOX_ENV`.
* **Network off means off** (its own network namespace; host sockets are not mounted). On means out,
  not in: `pasta` gives the box its own stack with no way to the host's loopback; without it the
  box stays offline and `%sandbox` says why.
* **Limits** (memory, processes, tmpfs sizes, CPUs) from `OWSANDBOX_LIMITS`, by cgroup or rlimits.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from ... import settings
from ...box.daemonctl import listen_unix, serving
from ...box.procstat import descendants, namespace_pids, pid_alive, start_time
from ...logs import log_level_args
from ...protocol.paths import inside
from ..isolation.guard import BoxUser, Guard, GuardedWorkspace
from ..isolation.network import NetworkError, Pasta, attach
from ..isolation.policy import (
    ALLOWED_ENV,
    passed_env_names,
    refuse_workspace,
)
from ..isolation.resources import (
    CgroupEnforcement,
    Enforcement,
    LimitReport,
    Limits,
    check_room,
    enforce,
    human_size,
    out_of_processes,
    refused_a_process,
    starved,
    too_small,
)
from ..isolation.seccomp import UnsupportedArchitecture, box_policy, compile_filter, native_arch, refused_syscalls
from ..logpump import LogPump
from ..privatedir import runtime_root
from ..programs import host_program, mark_box_writable
from .local import _LAUNCHER, LocalProvider
from .questions import SnapshotSite

BOX_RUN = "/run/owsandbox"  # where the daemon keeps its own files, inside the box
BOX_RUNNER = f"{BOX_RUN}/runner.pyz"
# /proc files that write to the whole machine, or tell of it, for a process the host counts as root:
# read-only or masked, as container engines do.
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
PROC_MASKED = ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats",
               "/proc/acpi", "/proc/scsi", "/proc/asound")
PROGRAM_FOLDERS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
# Indexes of what /usr holds, read-only: man-db's, for `whatis`, `man -f` and `apropos` (and Shift-Tab
# inspection, which shows `man -f`); nothing in them is not in /usr already.
SYSTEM_INDEXES = ("/var/cache/man",)


def bwrap_options() -> frozenset[str]:
    """The options this bubblewrap knows (`--disable-userns` came in 0.8, `--size` in 0.6)."""
    return _options_of(host_program("bwrap"))


@lru_cache(maxsize=4)
def _options_of(binary: str | None) -> frozenset[str]:
    if binary is None:
        return frozenset()
    try:
        done = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(word for word in (done.stdout + done.stderr).split() if word.startswith("--"))


def supported(args: list[str]) -> list[str]:
    """`args` without what an older bubblewrap lacks: no further-user-namespace guard, no tmpfs sizes
    (the box is still unprivileged; `%sandbox` says what is missing)."""
    known = bwrap_options()
    kept: list[str] = []
    skip = 0
    for arg in args:
        if skip:
            skip -= 1
        elif arg == "--disable-userns" and arg not in known:
            pass
        elif arg == "--size" and arg not in known:
            skip = 1
        else:
            kept.append(arg)
    return kept


def bwrap_problem() -> str | None:
    """None when bubblewrap can make a sandbox here (with the options this provider needs), else why not.
    The bubblewrap is found on PATH outside every folder a box may write (programs.py)."""
    return _problem_of(host_program("bwrap"))


@lru_cache(maxsize=4)
def _problem_of(binary: str | None) -> str | None:
    if binary is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        # the namespaces and the host name of bwrap_args(): in a container, naming the box's host is a
        # call of its own that a seccomp profile may refuse while the rest works
        done = subprocess.run(supported([binary, "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--ro-bind",
                                         "/usr", "/usr", *_program_links(), "--dev", "/dev", "--proc", "/proc",
                                         "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox",
                                         "--unshare-net", "--die-with-parent", "true"]),
                              capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not run: {exc}"
    if done.returncode != 0:
        return f"bwrap cannot make a sandbox here: {done.stderr.decode(errors='replace').strip()}"
    return None


@lru_cache(maxsize=1)
def _program_links() -> tuple[str, ...]:
    """`/bin`, `/lib`, ... as they are here: links into /usr recreated, real folders bound read-only."""
    args: list[str] = []
    for folder in PROGRAM_FOLDERS:
        if os.path.islink(folder):
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    return tuple(args)


@lru_cache(maxsize=1)
def private_system_files() -> tuple[str, ...]:
    """Files under /etc that only their owner may read and that we can read (so: as root, /etc/shadow,
    ssh host keys, ...). The box gets an empty file or folder in their place."""
    found = []
    for root, folders, files in os.walk("/etc"):
        for name in folders + files:
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISLNK(info.st_mode) and not info.st_mode & 0o004 and os.access(path, os.R_OK):
                found.append(path)
        folders[:] = [f for f in folders if os.path.join(root, f) not in found]
    return tuple(found)


def _masked(path: str) -> list[str]:
    """bwrap options that put an empty, read-only folder or file over `path`."""
    return ["--tmpfs", path, "--remount-ro", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]


def _same_process(pid: int | None, started: str | None) -> bool:
    """Whether `pid` is still the process recorded with start time `started` (not a reused pid)."""
    return isinstance(pid, int) and pid_alive(pid) and start_time(pid) == started


def _listening_socket(path: str) -> socket.socket:
    """A listening socket at `path` in the host's private folder, made by the host for the daemon. What
    is there is replaced, even a socket still served (a daemon of an older layout, lingering)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = listen_unix(path)
    listener.set_inheritable(True)
    return listener


def _arguments_from_fd(argv: list[str]) -> tuple[list[str], int | None]:
    """bubblewrap's own arguments read from a file descriptor (`--args FD`) instead of its command line:
    its init is the box's pid 1, and /proc/1/cmdline would show the box every host path it was made of
    (the private state folder, the runner's place, what is hidden). Returns the new argv and the fd."""
    if "--args" not in bwrap_options() or "bwrap" not in argv or "--" not in argv[argv.index("bwrap"):]:
        return argv, None
    at = argv.index("bwrap")  # after a wrapper's own arguments (pasta's, ending in its `--`)
    command = argv.index("--", at)  # bubblewrap's options go in the fd; the command stays where it is
    fd = os.memfd_create("bwrap-args", 0)  # not inheritable: passed on purpose
    os.write(fd, b"".join(arg.encode() + b"\0" for arg in argv[at + 1:command]))
    os.lseek(fd, 0, os.SEEK_SET)
    return [*argv[:at + 1], "--args", str(fd), *argv[command:]], fd


class BwrapProvider(GuardedWorkspace, LocalProvider):
    name = "bwrap"
    enforcement = "bubblewrap"

    def __init__(self, cwd: str | os.PathLike[str] | None = None, network: bool | None = None,
                 limits: Limits | list[str] | str | None = None, **options: Any) -> None:
        super().__init__(cwd, **options)
        mark_box_writable(self.cwd)  # this machine's programs are never looked up in it
        self.network = network if network is not None else self.settings.network
        self.limits = limits if isinstance(limits, Limits) else Limits.parse(
            limits if limits is not None else list(self.settings.limits))
        self.home = os.path.realpath(os.path.expanduser("~"))
        self.env_names = passed_env_names(self.settings)
        self.enforcer: Enforcement | None = None
        self.guard: Guard | None = None
        self.network_mode = "none"
        self.seccomp_state = "not started"
        self._log_pump: LogPump | None = None
        self._last_counters: dict[str, int] = {}  # the limit counters of the sandbox last stopped
        self._init_start: str | None = None
        self._pasta: str | None = None  # the pasta program, when the box is to have a network
        self._pasta_pid: int | None = None
        self._pasta_start: str | None = None
        self._pasta_run: Pasta | None = None  # the pasta this kernel attached, with its watcher

    # -- what the box is made of ---------------------------------------------------------------

    def check_workspace(self) -> None:
        refuse_workspace(self.cwd, lambda: str(runtime_root(avoid=self.cwd)),
                         "the private folder of the sandboxes' sockets, logs and the runner this machine runs for "
                         "them: a sandbox that may write there could make this machine run its code")

    def guarded_folder(self) -> str:
        return self.cwd

    def box_user(self) -> BoxUser:
        return BoxUser.this_process()  # bubblewrap maps only this uid, and keeps no capability

    def box_env(self) -> dict[str, str]:
        env = {name: os.environ[name] for name in ALLOWED_ENV if name in os.environ}
        env.update({name: value for name, value in os.environ.items() if name.startswith("LC_")})
        env.update({name: os.environ[name] for name in self.env_names if name in os.environ})
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.setdefault("USER", os.environ.get("LOGNAME", "user"))
        env["HOME"] = self.home
        env[settings.SANDBOX_KIND] = "bwrap"
        return env

    def mounts(self) -> list[tuple[str, str]]:
        """(path, what the box sees there), in the order they are made: what `%sandbox` shows."""
        found = [("/usr", "read-only")]
        found += [(f, "link into /usr" if os.path.islink(f) else "read-only") for f in PROGRAM_FOLDERS
                  if os.path.lexists(f)]
        found.append(("/etc", "read-only"))
        found += [(f, "hidden (owner-only file)") for f in private_system_files()]
        sized = "--size" in bwrap_options()
        size = f"private, at most {human_size(self.limits.tmp)}"
        size = size if sized else "private (bubblewrap before 0.6: any size)"
        shm = f"private, at most {human_size(self.limits.shm)}" if sized else size
        found += [("/proc", "own (PID namespace)"), ("/dev", "minimal"), ("/dev/shm", shm), ("/tmp", size),
                  ("/var/tmp", size)]
        found += [(f, "read-only (man-db's index: whatis, man -f)") for f in SYSTEM_INDEXES if os.path.isdir(f)]
        found += [("/run", size),
                  (f"{BOX_RUN}/run", "the daemon's logs and %attach cursors (in /run)"),
                  (self.home, "private (empty home)"),
                  (self.cwd, "read-write (the workspace)")]
        prefix = self._python_prefix()
        if prefix:
            found.append((prefix, "read-only (the Python that runs the sandbox's daemon)"))
        guard = self.workspace_guard()
        words = {"top": lambda f: f"top level read-only: nothing new can be made there ({guard.why[f]})",
                 "pinned": lambda f: "pinned: bound onto itself, the box cannot rename or remove it",
                 "read-only": lambda f: f"read-only ({guard.why[f]})", "hidden": lambda f: f"hidden ({guard.why[f]})"}
        found += [(f, words[kind](f)) for f, kind in guard.mounts_in_order() if kind in words]
        return found

    def _python_prefix(self) -> str | None:
        python = os.path.realpath(self.python)
        if python.startswith("/usr/"):
            return None
        prefix = os.path.realpath(sys.base_prefix)
        return prefix if inside(python, prefix) else os.path.dirname(os.path.dirname(python))

    def bwrap_args(self, runner_fd: int) -> list[str]:
        """bubblewrap's arguments for the box; `runner_fd` is the runner file, open for bubblewrap to copy."""
        size = str(self.limits.tmp)
        args = ["bwrap", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--unshare-pid", "--unshare-ipc",
                "--unshare-uts", "--unshare-cgroup-try", "--unshare-net", "--hostname", "sandbox", "--new-session",
                "--ro-bind", "/usr", "/usr", *_program_links(), "--ro-bind", "/etc", "/etc"]
        for path in private_system_files():
            args += _masked(path)
        args += ["--proc", "/proc"]
        for path in PROC_READ_ONLY:
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        for path in PROC_MASKED:
            if os.path.exists(path):
                args += _masked(path)
        args += ["--dev", "/dev", "--size", str(self.limits.shm), "--tmpfs", "/dev/shm",
                 "--size", size, "--tmpfs", "/tmp", "--dir", "/var", "--size", size, "--tmpfs", "/var/tmp",
                 "--size", size, "--tmpfs", "/run", "--dir", BOX_RUN]
        for path in SYSTEM_INDEXES:
            if os.path.isdir(path):
                args += ["--ro-bind", path, path]
        assert self.runner_path
        assert self.state_dir
        # The daemon's own folder (output logs, %attach cursors) is in the box's /run, so it has /run's size;
        # the host reads nothing in it.
        # A copy, not a bind: a bind's source (this user's private runtime folder) shows in the box's
        # /proc/self/mountinfo; a copy shows as bubblewrap's own deleted file.
        args += ["--ro-bind-data", str(runner_fd), BOX_RUNNER, "--dir", f"{BOX_RUN}/run"]
        if not inside(self.home, self.cwd):
            args += ["--size", size, "--tmpfs", self.home]
        args += ["--bind", self.cwd, self.cwd]
        guard = self.workspace_guard()
        hidden_folders = []
        # Parents first: a folder pinned (bound onto itself, so the box cannot rename it) before the read-only
        # path inside it, which a later bind of its parent would cover.
        for path, kind in guard.mounts_in_order():
            if kind == "top":
                args += ["--ro-bind", path, path]
            # A path gone since the scan (a notebook in a busy /tmp, where other programs come and go) is as one
            # that never was: the workspace's scan at the next start sees it if it comes back.
            elif kind == "writable":
                args += ["--bind-try", path, path]
            elif kind == "pinned":  # nothing below it to keep
                args += ["--bind-try", path, path]
            elif kind == "read-only":
                args += ["--ro-bind-try", path, path]
            elif os.path.isdir(path) and not os.path.islink(path):
                args += ["--tmpfs", path]  # made read-only below, once what must show inside it is bound
                hidden_folders.append(path)
            else:
                args += ["--ro-bind", "/dev/null", path]
        prefix = self._python_prefix()
        if prefix:  # after home: a Python installed under the home folder stays visible, read-only
            args += ["--ro-bind", prefix, prefix]
        for path in hidden_folders:
            args += ["--remount-ro", path]
        args += ["--remount-ro", "/", "--chdir", self.cwd, "--clearenv"]
        for name, value in self.box_env().items():
            args += ["--setenv", name, value]
        if not self.key:
            args.append("--die-with-parent")  # with a key, the daemon lingers for a restarting kernel
        return supported(args)

    # -- lifecycle -------------------------------------------------------------------------------

    def create(self) -> None:
        problem = bwrap_problem()
        if problem is not None:
            raise RuntimeError(problem)
        self.check_workspace()
        self.guard = None  # scanned again: the workspace may have changed since the last start
        try:
            super().create()
        except BaseException:
            if not self.key and self.state_dir:  # a one-off folder nobody will sweep (LimitTooSmall, say)
                shutil.rmtree(self.state_dir, ignore_errors=True)
                self.state_dir = None
            raise

    def destroy(self) -> None:
        super().destroy()
        self.note_box_made()

    def _adopt_running_daemon(self) -> bool:
        assert self.state_dir
        info = self._record()
        if info is None:
            return False
        pid, started = info.get("init_pid"), info.get("init_start")
        if not _same_process(pid, started) or not serving(self.state_dir):
            return False
        self.daemon_info, self.daemon_pid, self._init_start = info, pid, started
        self.enforcer = CgroupEnforcement.adopt(self.limits, info.get("limits", {}))
        self.network_mode = info.get("network_mode", "none")
        self.seccomp_state = info.get("seccomp", "unknown (the sandbox was started by an older version)")
        self._pasta_pid, self._pasta_start = info.get("pasta_pid"), info.get("pasta_start")
        return True

    def _start_daemon(self) -> None:
        assert self.state_dir and self.runner_path
        self.enforcer, self._last_counters = enforce(self.limits), {}
        try:
            check_room(self.limits, self.enforcer.kind)
        except BaseException:
            self.enforcer.remove()
            raise
        run = Path(self.state_dir, "run")
        run.mkdir(mode=0o700, exist_ok=True)
        listener = _listening_socket(self.socket_path)
        execd = _listening_socket(str(run / "execd.sock"))
        info_read, info_write = os.pipe()
        # bubblewrap's and the daemon's stderr is a pipe that the host copies into its own log: a host file
        # held by bubblewrap's init (the box's pid 1) would be writable from the box through /proc/1/fd/2.
        log_read, log = os.pipe()
        self._log_pump = LogPump(log_read, os.path.join(self.state_dir, "daemon.log")).start()
        seccomp = self._seccomp_pipe()
        wrapper = self._network_wrapper()
        # With pasta, the daemon's parent can outlive a killed kernel: it leaves when no client is left.
        linger = self.key or self.network_mode == "pasta"
        lifetime = ["--linger", str(self.linger_seconds)] if linger else ["--exit-with-parent"]
        runner = os.open(self.runner_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        box = self.bwrap_args(runner)
        if wrapper:
            box.remove("--unshare-net")
        serve = ["serve", "--socket", f"{BOX_RUN}/run/runner.sock", "--listen-fd", str(listener.fileno()),
                 "--execd-fd", str(execd.fileno()), "--end-namespace", "--cwd", self.cwd, *lifetime, *log_level_args(),
                 *self.daemon_args]
        filtered = ["--seccomp", str(seccomp)] if seccomp is not None else []
        argv = [*wrapper, *box, *filtered, "--info-fd", str(info_write), "--", os.path.realpath(self.python), "-S",
                BOX_RUNNER, *serve]
        argv, arguments = _arguments_from_fd(argv)
        program = host_program("bwrap", avoid=[self.cwd])
        if program is None:
            raise RuntimeError("bubblewrap (bwrap) is not installed outside the workspace's folders (a program there "
                               "is the box's to change, so this machine never runs it)")
        assert argv[0] == "bwrap", argv[:1]  # nothing wraps it: its own name is the box's pid 1's
        try:
            # bwrap's own environment is the box's too: its --clearenv only clears what its child gets, and
            # the box's pid 1 (bwrap's init, never exec'd) would show the kernel's in /proc/1/environ.
            # run from its place on this machine, never a PATH lookup at exec time; named `bwrap` in the box
            self.daemon = _LAUNCHER.spawn(argv, executable=program, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=log,
                                          env=self.box_env(), start_new_session=True,
                                          pass_fds=(listener.fileno(), execd.fileno(), info_write, runner,
                                                    *([seccomp] if seccomp is not None else []),
                                                    *([arguments] if arguments is not None else [])),
                                          preexec_fn=self.enforcer.preexec)
        except BaseException:
            self.enforcer.remove()
            raise
        finally:
            os.close(log)
            os.close(info_write)
            os.close(runner)
            if seccomp is not None:
                os.close(seccomp)
            if arguments is not None:
                os.close(arguments)
            listener.close()  # the daemon holds them now; a dead daemon must not look alive
            execd.close()
        try:
            try:
                self.daemon_pid = self._init_pid(info_read)
            finally:
                os.close(info_read)
            self._init_start = start_time(self.daemon_pid) if self.daemon_pid else None
            self.daemon_info = self._await_ready()
        except RuntimeError as exc:
            # Said by what it left, not guessed from the number: an OOM kill, or a process refused memory.
            if starved(str(exc), self._last_counters or self.enforcer.counters()):
                raise too_small(self.limits, self.enforcer.kind, str(exc)) from exc
            if refused_a_process(str(exc)):
                raise out_of_processes(self.limits, self.enforcer.kind, str(exc)) from exc
            raise
        if self.network_mode == "pasta" and not wrapper:
            self._attach_network()
        record = {**self.daemon_info, "init_pid": self.daemon_pid, "init_start": self._init_start,
                  "pasta_pid": self._pasta_pid, "pasta_start": self._pasta_start,
                  "limits": self.enforcer.record(), "network_mode": self.network_mode, "seccomp": self.seccomp_state}
        Path(self.state_dir, "daemon.json").write_text(json.dumps(record))

    def _seccomp_pipe(self) -> int | None:
        """The read end of a pipe holding the box's system-call filter, for `bwrap --seccomp FD`; None
        (and `%sandbox` says why) where this bubblewrap or this machine's architecture cannot have it."""
        assert self.enforcer is not None
        if "--seccomp" not in bwrap_options():
            self.seccomp_state = "off: this bubblewrap has no --seccomp"
            return None
        try:
            arch = native_arch()
        except UnsupportedArchitecture as exc:
            self.seccomp_state = f"off: {exc}"
            return None
        memory_by_rlimits = self.enforcer.kind == "rlimits"
        rules = box_policy(memory_by_rlimits=memory_by_rlimits)
        program = compile_filter(rules, arch)
        self.seccomp_state = (
            f"on ({len(refused_syscalls(rules, arch))} system calls refused, in whole or for some arguments: the "
            "kernel keyrings, io_uring, bpf, perf events, userfaultfd, modules, the clock, mounts, new user "
            "namespaces, pidfd_getfd and process_vm_*, terminal input injection, and setting a setuid or setgid "
            "mode" + ("; memfd_create and SysV shared memory too, as memory is bounded by rlimits" if memory_by_rlimits
                      else "") + ")")
        read, write = os.pipe()
        try:
            os.write(write, program)  # at most 32 KiB (4096 instructions): always fits a pipe's buffer
        finally:
            os.close(write)
        return read

    def _log_tail(self) -> str:
        if self._log_pump is not None:
            self._log_pump.settle(2.0)  # the box has ended: what it wrote last is on its way to the file
        return super()._log_tail()

    def _init_pid(self, info_fd: int) -> int | None:
        """The host pid of the sandbox's PID-namespace init, from bubblewrap's --info-fd."""
        data = b""
        while True:
            chunk = os.read(info_fd, 4096)
            if not chunk:
                break
            data += chunk
            try:
                reported = int(json.loads(data)["child-pid"])
            except (ValueError, KeyError):
                continue
            return self._host_pid(reported)
        assert self.daemon is not None
        self.daemon.wait(5)
        raise RuntimeError(f"bubblewrap did not start the sandbox: {self._log_tail() or 'no message'}")

    def _host_pid(self, reported: int) -> int:
        """The host's pid of the sandbox's init. bubblewrap reports it as its own PID namespace sees it,
        which is the host's only when nothing wraps bubblewrap: run inside another namespace (pasta around
        it, as a plain user's network once was) it is that namespace's, where the init may be pid 2, and the
        host's pid 2 is someone else.
        So the init is found among what was started here: the process that is pid 1 of its namespace and
        has `reported` one namespace up."""
        assert self.daemon is not None
        found = [(len(levels), pid) for pid in descendants(self.daemon.pid)
                 if len(levels := namespace_pids(pid)) >= 2 and levels[-1] == 1 and levels[-2] == reported]
        if found:
            return min(found)[1]  # the outermost such namespace: the sandbox's own
        try:  # its init gone already: a sandbox that ended as it started (starved, say) says why in its log
            self.daemon.wait(1)
        except subprocess.TimeoutExpired:
            pass
        if self.daemon.poll() is not None:
            raise RuntimeError(f"bubblewrap did not start the sandbox: {self._log_tail() or 'no message'}")
        raise RuntimeError(f"bubblewrap reported its sandbox's init as pid {reported} of its namespace, and no "
                           f"process under pid {self.daemon.pid} is that one")

    def _network_wrapper(self) -> list[str]:
        """The command run around bwrap to give the box a network: [] now, for root and plain users alike.
        bubblewrap makes the network namespace and pasta joins it once it exists (`_attach_network`), as
        `%network on` does later, so that `%network off` can end it without ending the box."""
        pasta = self._pasta = host_program("pasta", avoid=[self.cwd]) if self.network else None
        self.network_mode = "pasta" if pasta else ("unavailable" if self.network else "none")
        return []

    @staticmethod
    def _pasta_argv(pasta: str) -> list[str]:
        # No port forwarded in either direction, and the gateway is not mapped to the host's loopback.
        return [pasta, "--config-net", "--quiet", "--no-map-gw", "-t", "none", "-u", "none", "-T", "none", "-U", "none"]

    def _attach_network(self) -> None:
        """pasta joins the network namespace bubblewrap made (network.py); it returns once the box's network
        is configured, and ends with the box."""
        assert self.state_dir and self.daemon_pid
        assert self.network_mode == "pasta" and self._pasta
        self._pasta_run = attach(self._pasta_argv(self._pasta), self.daemon_pid, self._init_start, self.state_dir,
                                 avoid=[self.cwd])
        self._pasta_pid, self._pasta_start = self._pasta_run.pid, self._pasta_run.started

    def _end_pasta(self) -> None:
        """End the box's pasta, by the pid and start time this machine recorded (never a pid the box wrote)."""
        pid, self._pasta_pid = self._pasta_pid, None
        run, self._pasta_run = self._pasta_run, None
        if pid is not None and self._pasta_start is not None:
            (run if run is not None and run.pid == pid else Pasta(pid, self._pasta_start)).end()

    def set_network(self, on: bool) -> str:
        """Turn the running box's outbound network on (pasta joins its namespace) or off (that pasta ends):
        for `%network`. The host's record of the box says so, for a kernel that restarts."""
        with self._lifecycle:
            if self.daemon_pid is None or not _same_process(self.daemon_pid, self._init_start):
                raise NetworkError("the sandbox is not running: run a cell first, then %network again")
            if on and self.network_mode != "pasta":
                pasta = host_program("pasta", avoid=[self.cwd])
                if pasta is None:
                    raise NetworkError("outbound network needs pasta, which is not installed here (Debian package "
                                       "passt: apt-get install passt)")
                self._pasta, self.network_mode = pasta, "pasta"
                try:
                    self._attach_network()
                except NetworkError:
                    self.network_mode = "none"
                    raise
            elif not on and self.network_mode == "pasta":
                self._end_pasta()
                self.network_mode = "none"
            self.network = on
            self._update_record(network_mode=self.network_mode, pasta_pid=self._pasta_pid,
                                pasta_start=self._pasta_start)
        return " · ".join(self.describe_network())

    def _update_record(self, **facts: Any) -> None:
        """Change the host's record of the running box (daemon.json), written whole in its place."""
        assert self.state_dir
        record = {**(self._record() or {}), **facts}
        path = Path(self.state_dir, "daemon.json")
        fresh = path.with_name("daemon.json.new")
        fresh.write_text(json.dumps(record))
        fresh.replace(path)

    def describe_network(self) -> tuple[str, str]:
        """(what the box has, how): `none` or `outbound`."""
        if self.network_mode == "pasta":
            return "outbound", ("through pasta, out by way of this machine; the host's addresses (its loopback "
                                "services, its other interfaces) are not reachable and no port is forwarded in; "
                                "%network off ends it")
        if self.network_mode == "unavailable":
            return "none", "outbound network was asked for, but pasta (Debian package passt) is not installed"
        return "none", "own network namespace with loopback only; no host socket is mounted; %network on for outbound"

    def _stop_daemon(self) -> None:
        daemon, self.daemon = self.daemon, None
        pid, self.daemon_pid = self.daemon_pid, None
        if _same_process(pid, self._init_start):
            try:
                os.kill(pid, signal.SIGKILL)  # the PID namespace's init: everything in it ends with it
            except OSError:
                pass
        if daemon is not None:
            daemon.wait()
        elif pid is not None:
            deadline = time.monotonic() + 5
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        self._end_pasta()
        if self.enforcer is not None:
            self._last_counters = self.enforcer.counters()
            self.enforcer.remove()

    def open_runner(self):  # type: ignore[no-untyped-def]
        with self._lifecycle:
            if self.daemon_pid is not None and not _same_process(self.daemon_pid, self._init_start):
                self.daemon_pid = None  # gone, and its pid may already be another process's
        return super().open_runner()

    def snapshot_site(self) -> SnapshotSite:
        """Snapshots are taken here: the workspace is this machine's folder, and the box stops whole
        around a restore (its PID namespace's init killed, then a new box)."""
        return SnapshotSite(self.guarded_folder(), self.workspace_guard(), self.stopped)

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """The box ended with everything in it while the caller works on the workspace (a snapshot's
        restore), then a new box: nothing inside writes while the host does, and the new box's /tmp and
        home start empty. A client reconnecting meanwhile waits for the new box and sees a new instance."""
        with self._lifecycle:
            self._stop_daemon()
            try:
                yield
            finally:
                self.note_box_made()
                self.guard = None  # the workspace the caller left is scanned again
                self._start_daemon()

    def execd_socket(self, hello: dict[str, Any]) -> str:
        """The host's own socket, never a path the box names."""
        assert self.state_dir
        return os.path.join(self.state_dir, "run", "execd.sock")

    def limit_counters(self) -> dict[str, int]:
        return self.enforcer.counters() if self.enforcer is not None else {}

    def limit_report(self) -> LimitReport:
        return LimitReport(self.limits.describe())

    def headline(self) -> list[str]:
        network = {"none": "no network", "outbound": "network out (pasta)"}[self.describe_network()[0]]
        limits = self.limits.describe()
        return ["bubblewrap", f"writes to {self.cwd}", network, f"{limits['memory']}, {limits['processes']} processes"]

    def network_state(self) -> str | None:
        return self.describe_network()[0]

    def describe(self) -> dict[str, Any]:
        env = sorted(self.box_env())
        network, how = self.describe_network()
        return {**super().describe(), "network": network, "network note": how, "mounts": dict(self.mounts()),
                "limits": self.limits.describe(),
                "limits enforced by": self.enforcer.describe() if self.enforcer else "not started",
                "seccomp": self.seccomp_state,
                "environment": ", ".join(env), "privileges": "none (user namespace, every capability dropped"
                + ("" if "--disable-userns" in bwrap_options() else
                   "; this bubblewrap (before 0.8) cannot forbid further user namespaces") + ")",
                "pid namespace": "own", "workspace guard": self.workspace_guard().summary(),
                "dies with": "the kernel" if not self.key else "its last client (linger)"}


def auto_provider(cwd: str | os.PathLike[str] | None = None, **options: Any) -> LocalProvider:
    """`bwrap` where it works here; else `local`, saying plainly that nothing is isolated."""
    mark_box_writable(os.fspath(cwd or os.getcwd()))  # before bubblewrap is looked up
    problem = bwrap_problem()
    if problem is None:
        return BwrapProvider(cwd, **options)
    options.pop("network", None)
    options.pop("limits", None)
    provider = LocalProvider(cwd, **options)
    provider.fallback_reason = f"no isolation: {problem}, so the sandbox is the local machine"
    return provider


def auto_enforcement() -> str:
    return BwrapProvider.enforcement if bwrap_problem() is None else LocalProvider.enforcement
