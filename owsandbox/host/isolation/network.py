"""Outbound network for a running bubblewrap box: `pasta` attached to the box's network namespace, and ended.

Why at run time: a newcomer who needs a package in the box (`pip install` in a venv of the workspace)
should not have to restart the kernel with `OWSANDBOX_NETWORK=1` and lose the shells' state; and the
network should be on only for as long as it is needed. bubblewrap makes the box's network namespace
(loopback only); `pasta` joins it from this machine, gives it a tap device with the host's addresses
and routes, and carries its connections out as its own sockets, with no port forwarded either way and
the gateway not mapped to the host's loopback. When pasta ends, its tap device goes with it: the box
is back to loopback only.

* **Joining.** As root pasta may enter the namespace outright. A plain user must first enter the user
  namespace that owns it (`--userns`): that is not the box's own (bubblewrap nests one more to forbid
  further user namespaces, where no capability reaches the network), so it is asked of the network
  namespace itself (`NS_GET_USERNS`). Both are handed to pasta as descriptors opened here, after the
  box's init was checked by its start time, so a reused pid cannot stand in for the box.
* **Out, never to this machine.** pasta carries the box's connections out as this machine's own sockets,
  so an address of this machine other than the one pasta copies into the box (a second interface, a
  container bridge, a service bound to every address) would be reached as from this machine. Before
  pasta gives the box a network, the box's namespace gets a refusing route (`unreachable`) to every
  address this machine has, IPv4 and IPv6, and to the link-local ranges (a cloud's metadata service
  among them); the box has no capability over its namespace, so it cannot take them away. Addresses
  this machine gains later are not covered until `%network on` runs again.
* **Ending.** By the pid pasta wrote into the host's private folder (never one the box wrote), checked
  by its start time, through a pidfd, and waited for.
* **Ending with the box.** pasta holds the namespace open and would outlive a box that ends on its own
  (a kernel killed for good, its box done lingering). A small watcher on this machine (`WATCHER`),
  in a session of its own, waits on both processes and ends pasta when the box's init is gone.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from ...box.procstat import start_time
from ..programs import host_program

NS_GET_USERNS = 0xB701  # ioctl on a namespace file: the user namespace that owns it (linux/nsfs.h)
STOP_SECONDS = 5.0


class NetworkNotChanged(RuntimeError):
    """`%network on|off` could not change the box's network; the message says why, and what to do instead."""


#: Watches the box's init (argv 1, its start time argv 2) and pasta (argv 3, 4); ends pasta once the
#: init has ended. Run by this machine's Python without site (`-S`): only `os`, `select`, `signal`, `sys`.
WATCHER = r"""
import os, select, signal, sys
def started(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[19].decode()
    except (OSError, IndexError):
        return None
box, box_start, pasta, pasta_start = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
try:
    pasta_fd = os.pidfd_open(pasta)
except OSError:
    sys.exit(0)
if started(pasta) != pasta_start:
    sys.exit(0)
try:
    box_fd = os.pidfd_open(box)
    alive = started(box) == box_start
except OSError:
    alive = False
if alive:
    ready, _, _ = select.select([box_fd, pasta_fd], [], [])
    alive = box_fd not in ready
if not alive:
    try:
        signal.pidfd_send_signal(pasta_fd, signal.SIGKILL)
    except OSError:
        pass
"""


class NetworkError(NetworkNotChanged):
    """pasta could not give the box a network, or could not be ended; the message says why."""


#: Ranges refused whole besides this machine's own addresses: link-local, where a cloud's metadata
#: service answers (the box's own link-local network, a longer prefix on its tap device, still works).
REFUSED_RANGES = ("169.254.0.0/16", "fe80::/10")


def host_addresses(ip_json: str) -> list[str]:
    """This machine's addresses, each as a one-address prefix, from `ip -json address show`; loopback
    addresses are the box's own there and are left out."""
    found: list[str] = []
    try:
        links = json.loads(ip_json)
    except ValueError as exc:
        raise NetworkError(f"this machine's addresses could not be read (ip -json address show: {exc})") from None
    for link in links if isinstance(links, list) else []:
        for info in link.get("addr_info", []) if isinstance(link, dict) else []:
            try:
                address = ipaddress.ip_address(str(info.get("local", "")).split("%")[0])
            except ValueError:
                continue
            if not address.is_loopback:
                found.append(f"{address}/{address.max_prefixlen}")
    return list(dict.fromkeys(found))


def refusing_routes(addresses: list[str], ipv6: bool = True) -> str:
    """`ip -batch` lines giving each address (and the refused ranges) a route that refuses at once; `replace`,
    so that a network turned on again finds them in place. Without IPv6 (`ipv6` false) its lines are left
    out: such a namespace has no IPv6 to reach anything with."""
    prefixes = [p for p in [*addresses, *REFUSED_RANGES] if ipv6 or ":" not in p]
    return "".join(f"route replace unreachable {prefix}\n" for prefix in prefixes)


def _ip_program(avoid: Iterable[str] = ()) -> str:
    for candidate in (host_program("ip", avoid), "/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise NetworkError("outbound network needs ip (Debian package iproute2) to keep this machine's own addresses "
                       "out of the sandbox's reach: apt-get install iproute2")


def _refuse_host_addresses(net: int, owner: int | None, avoid: Iterable[str] = ()) -> None:
    """Refusing routes to this machine's addresses in the box's network namespace (`net`, entered through
    the user namespace `owner` that holds it, for a plain user), before pasta gives it a way out."""
    program = _ip_program(avoid)
    nsenter = host_program("nsenter", avoid) or "/usr/bin/nsenter"
    try:
        listed = subprocess.run([program, "-json", "address", "show"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NetworkError(f"this machine's addresses could not be listed: {exc}") from None
    if listed.returncode != 0:
        raise NetworkError(f"this machine's addresses could not be listed: {listed.stderr.strip()}")
    enter = [nsenter, f"--net=/proc/self/fd/{net}"]
    if owner is not None:
        enter = [nsenter, f"--user=/proc/self/fd/{owner}", "--preserve-credentials", f"--net=/proc/self/fd/{net}"]
    try:
        done = subprocess.run([*enter, program, "-batch", "-"], input=refusing_routes(host_addresses(listed.stdout),
                                                                                   os.path.exists("/proc/net/if_inet6")),
                              pass_fds=[fd for fd in (net, owner) if fd is not None], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NetworkError(f"the sandbox's routes could not be set: {exc}") from None
    if done.returncode != 0:
        raise NetworkError(f"the sandbox's routes to this machine's own addresses could not be refused: "
                           f"{(done.stderr or done.stdout).strip() or 'no message'}")


class Pasta:
    """One pasta attached to one box: its pid and start time as this machine recorded them, and its watcher."""

    def __init__(self, pid: int, started: str, watcher: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self.started = started
        self.watcher = watcher

    def end(self) -> None:
        """End this pasta (if it is still the process recorded) and wait until it is gone, with its tap device."""
        try:
            handle = os.pidfd_open(self.pid)
        except OSError:
            handle = None  # gone already
        try:
            if handle is not None and start_time(self.pid) == self.started:
                signal.pidfd_send_signal(handle, signal.SIGKILL)
                ready, _, _ = select.select([handle], [], [], STOP_SECONDS)
                if not ready:
                    raise NetworkError(f"pasta (pid {self.pid}) did not end within {STOP_SECONDS:g} s")
        finally:
            if handle is not None:
                os.close(handle)
        if self.watcher is not None:
            try:
                self.watcher.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.watcher.kill()
                self.watcher.wait()


def attach(pasta_argv: list[str], init_pid: int, init_start: str | None, state_dir: str,
           avoid: Iterable[str] = ()) -> Pasta:
    """Give the box whose PID namespace's init is `init_pid` (started at `init_start`) outbound network:
    pasta (`pasta_argv`: the program and its options) joins its network namespace, and returns once the
    namespace is configured. Watched, so that it ends with the box."""
    pid_file = Path(state_dir, "pasta.pid")
    pid_file.unlink(missing_ok=True)
    try:
        net = os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetworkError(f"the sandbox's network namespace cannot be opened: {exc}") from None
    held = [net]
    try:
        if init_start is None or start_time(init_pid) != init_start:
            raise NetworkError(f"the sandbox's init (pid {init_pid}) is not the process this machine recorded")
        argv = [*pasta_argv, "--pid", str(pid_file)]
        owner: int | None = None
        if os.getuid() == 0:
            argv += ["--runas", "0"]  # else pasta drops to nobody, who may not enter the namespace
        else:
            try:
                owner = fcntl.ioctl(net, NS_GET_USERNS)
            except OSError as exc:
                raise NetworkError(f"the user namespace that owns the sandbox's network is not to be had: {exc}") \
                    from None
            held.append(owner)
            argv += ["--userns", f"/proc/self/fd/{owner}"]
        _refuse_host_addresses(net, owner, avoid)
        argv += ["--netns", f"/proc/self/fd/{net}"]
        try:
            done = subprocess.run(argv, pass_fds=held, stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as exc:
            raise NetworkError(f"pasta could not run: {exc}") from None
    finally:
        for fd in held:
            os.close(fd)
    if done.returncode != 0:
        said = " ".join(line for line in done.stderr.decode(errors="replace").splitlines()
                        if not line.startswith("Failed to send"))  # its complaints about a missing syslog
        raise NetworkError(f"pasta could not give the sandbox a network (exit {done.returncode}): "
                           f"{said.strip() or 'no message'}")
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError) as exc:
        raise NetworkError(f"pasta started but left no pid in {pid_file}: {exc}") from None
    started = start_time(pid)
    if started is None:
        raise NetworkError(f"pasta (pid {pid}) ended as soon as it had started")
    watcher = subprocess.Popen([sys.executable, "-S", "-c", WATCHER, str(init_pid), init_start, str(pid), started],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True, close_fds=True)
    return Pasta(pid, started, watcher)
