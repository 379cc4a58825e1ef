"""Two "remote hosts" and a gateway's own network, for Jupyter Enterprise Gateway over ssh, made as root.

Three network namespaces of the test's own: `gw`, where the gateway runs (listening on its loopback
only), and two hosts, each joined to `gw` by a veth pair with TEST-NET-2 addresses (198.51.100.0/24,
never routed anywhere) on the pair's two ends, each running its own sshd on its address. The hosts
reach the gateway's end of their own pair (the gateway's response address is there) and nothing else:
no forwarding in `gw`, so not each other, and no address of this machine's own network changes.

The namespaces share this machine's file system: the hosts find owsandbox at the same path, as a
cluster with a shared install would. Each host's sshd gives its logins a runtime folder of that host's
own (XDG_RUNTIME_DIR, JUPYTER_RUNTIME_DIR through sshd's SetEnv), so a sandbox's state folder on one
host is not seen from the other, as on two machines.

The test itself stays in this machine's namespace; `socket_in(gw, ...)` opens a connection from inside
`gw` (setns on the calling thread only, then back), which is how it reaches the gateway's loopback.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from .netns import ip, require_network_namespaces
from .processes import terminate
from .sshd_server import SSHD

CLONE_NEWNET = 0x40000000
GATEWAY_ADDRESSES = ("198.51.100.1", "198.51.100.5")  # the gateway's end of each host's pair
HOST_ADDRESSES = ("198.51.100.2", "198.51.100.6")
# The first host's second address, which the gateway reaches through the first: a host whose `--hosts`
# address is not the source of its route back to the gateway (that source is its pair's address).
SECOND_ADDRESS = "198.51.100.9"


@dataclass
class Host:
    name: str  # its network namespace
    address: str
    runtime: Path  # XDG_RUNTIME_DIR and JUPYTER_RUNTIME_DIR of logins on it
    sshd: subprocess.Popen[bytes] | None = None
    more_addresses: tuple[str, ...] = ()  # addresses of its own besides its pair's, reached through it

    def processes(self) -> list[int]:
        """The pids whose network namespace is this host's."""
        return processes_in(self.name)


@dataclass
class GatewayNetwork:
    gateway: str  # the namespace the gateway runs in
    hosts: list[Host]
    folder: Path
    home: Path  # the gateway's HOME: .ssh/ with the user key and the hosts' keys
    sshds: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def in_gateway(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.gateway, *argv]

    def host_at(self, address: str) -> Host:
        return next(host for host in self.hosts if host.address == address)


def processes_in(namespace: str) -> list[int]:
    inode = os.stat(f"/run/netns/{namespace}").st_ino
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with suppress(OSError):
                if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                    found.append(int(entry))
    return found


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


@contextmanager
def in_namespace(namespace: str) -> Iterator[None]:
    """This thread in the network namespace `namespace` (what it starts too: threads, children, sockets),
    then back in its own."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)


def socket_in(namespace: str, address: tuple[str, int], timeout: float = 30) -> socket.socket:
    """A TCP connection to `address` made from inside `namespace` (the socket stays there)."""
    with in_namespace(namespace):
        return socket.create_connection(address, timeout=timeout)


def _start_sshd(host: Host, folder: Path) -> subprocess.Popen[bytes]:
    config = folder / f"sshd_config-{host.name}"
    listen = "".join(f"ListenAddress {address}\n" for address in (host.address, *host.more_addresses))
    config.write_text(
        f"Port 22\n{listen}HostKey {folder}/host_key\n"
        f"AuthorizedKeysFile {folder}/authorized_keys\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n"
        "MaxStartups 100\n"  # a class whose kernels start at once logs in at once
        f"SetEnv XDG_RUNTIME_DIR={host.runtime} JUPYTER_RUNTIME_DIR={host.runtime}/jupyter\n"
        f"PidFile {folder}/sshd-{host.name}.pid\n")
    os.makedirs("/run/sshd", exist_ok=True)
    daemon = subprocess.Popen(["ip", "netns", "exec", host.name, SSHD, "-D", "-e", "-f", str(config)],
                              stderr=subprocess.PIPE)
    assert daemon.stderr is not None
    for line in daemon.stderr:  # sshd says when it listens
        if b"Server listening" in line:
            break
    else:
        daemon.wait()
        raise RuntimeError(f"sshd on {host.name} did not start (exit {daemon.returncode})")
    threading.Thread(target=daemon.stderr.read, daemon=True).start()
    return daemon


@contextmanager
def gateway_network() -> Iterator[GatewayNetwork]:
    """The gateway's namespace and two hosts with sshd; all of it gone when the context ends."""
    require_network_namespaces()
    if not os.path.exists(SSHD):
        raise RuntimeError(f"{SSHD} is missing (Debian package openssh-server)")
    tag = str(os.getpid())
    folder = Path(tempfile.mkdtemp(prefix="owsbx-eg-"))
    os.chmod(folder, 0o755)
    home = folder / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    gw = f"owsbx-gw-{tag}"
    hosts = [Host(f"owsbx-h{i + 1}-{tag}", address, folder / f"runtime-h{i + 1}")
             for i, address in enumerate(HOST_ADDRESSES)]
    made: list[str] = []
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        for name in (gw, *(host.name for host in hosts)):
            ip("netns", "add", name)
            made.append(name)
        ip("-n", gw, "link", "set", "lo", "up")
        for i, host in enumerate(hosts):
            host.runtime.mkdir(mode=0o700)
            near, far = f"owsbxg{i}{tag}"[:15], f"owsbxh{i}{tag}"[:15]
            ip("link", "add", near, "type", "veth", "peer", "name", far)
            ip("link", "set", near, "netns", gw)
            ip("link", "set", far, "netns", host.name)
            ip("-n", gw, "addr", "add", f"{GATEWAY_ADDRESSES[i]}/30", "dev", near)
            ip("-n", gw, "link", "set", near, "up")
            ip("-n", host.name, "link", "set", "lo", "up")
            ip("-n", host.name, "addr", "add", f"{host.address}/30", "dev", far)
            ip("-n", host.name, "link", "set", far, "up")
            ip("-n", host.name, "route", "add", "default", "via", GATEWAY_ADDRESSES[i])
        first = hosts[0]
        first.more_addresses = (SECOND_ADDRESS,)
        ip("-n", first.name, "addr", "add", f"{SECOND_ADDRESS}/32", "dev", "lo")
        ip("-n", gw, "route", "add", f"{SECOND_ADDRESS}/32", "via", first.address)
        for name in ("host_key", "user_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
        (folder / "authorized_keys").write_text((folder / "user_key.pub").read_text())
        shutil.copyfile(folder / "user_key", home / ".ssh" / "id_ed25519")
        os.chmod(home / ".ssh" / "id_ed25519", 0o600)
        host_key = (folder / "host_key.pub").read_text().split()[:2]
        (home / ".ssh" / "known_hosts").write_text(
            "".join(f"{address} {' '.join(host_key)}\n" for host in hosts
                    for address in (host.address, *host.more_addresses)))
        for host in hosts:
            host.sshd = _start_sshd(host, folder)
            daemons.append(host.sshd)
        yield GatewayNetwork(gw, hosts, folder, home, daemons)
    finally:
        for daemon in daemons:
            terminate(daemon, grace=10)
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)  # the veths go too
        shutil.rmtree(folder, ignore_errors=True)
