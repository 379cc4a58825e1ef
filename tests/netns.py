"""Two network namespaces of the test's own, for a box's outbound network to reach: nothing else is touched.

`client` is where the kernel (or the attacker's host process) runs, so its pasta is there and carries
the box's connections out from there; `server` holds an HTTP server. A veth pair joins them with
addresses of TEST-NET-2 (198.51.100.0/24, never routed anywhere) on the pair's two ends only, and the
client's default route goes to the server: the box can reach nothing but the server, and no address
of this machine's own network changes. The client's loopback has a server of its own, standing in for
the host's loopback services (Jupyter, databases), which the box must never reach.

Made with `ip netns` as root; every namespace and server goes away when the context ends, however it ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from .waiting import patience

CLIENT_ADDRESS = "198.51.100.1"
SERVER_ADDRESS = "198.51.100.2"
CLIENT_ADDRESS_6 = "2001:db8:51::1"
SERVER_ADDRESS_6 = "2001:db8:51::2"
# The client's other addresses, on an interface of their own (TEST-NET-3 and a documentation prefix): a
# host's second interface, a container bridge. A server there listens on every address, as a service
# bound to 0.0.0.0 does.
OTHER_ADDRESS = "203.0.113.1"
OTHER_ADDRESS_6 = "2001:db8:88::1"
SERVER_PORT = 8080
LOOPBACK_PORT = 8081
EVERY_ADDRESS_PORT = 8082
GREETING = "hello from the test's own server\n"

#: An HTTP server of the standard library that says on stdout when it listens (argv: address, port, folder).
SERVER = r"""
import functools, http.server, sys
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[3])
server = http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), handler)
print("listening", flush=True)
server.serve_forever()
"""

#: The same, on every address of both families (argv: port, folder).
SERVER_EVERY_ADDRESS = r"""
import functools, http.server, socket, sys
class Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])
server = Server(("::", int(sys.argv[1])), handler)
print("listening", flush=True)
server.serve_forever()
"""


@dataclass
class OwnNetwork:
    client: str  # the namespace the kernel runs in
    server: str
    served: Path  # the server's folder: what it serves at /
    loopback_served: Path

    @property
    def url(self) -> str:
        return f"http://{SERVER_ADDRESS}:{SERVER_PORT}/"

    @property
    def url6(self) -> str:
        return f"http://[{SERVER_ADDRESS_6}]:{SERVER_PORT}/"

    @property
    def host_urls(self) -> list[str]:
        """The client's own services on its other addresses, which a box must never reach."""
        return [f"http://{OTHER_ADDRESS}:{EVERY_ADDRESS_PORT}/hello.txt",
                f"http://[{OTHER_ADDRESS_6}]:{EVERY_ADDRESS_PORT}/hello.txt",
                f"http://{CLIENT_ADDRESS}:{EVERY_ADDRESS_PORT}/hello.txt"]

    def in_client(self, argv: list[str]) -> list[str]:
        """`argv` run in the client namespace (as root)."""
        return ["ip", "netns", "exec", self.client, *argv]

    def processes_in_client(self, name: str) -> list[int]:
        """The pids of the processes run as `name` (their argv[0]: pasta's comm is `passt.avx2`) whose network
        namespace is the client's."""
        inode = os.stat(f"/run/netns/{self.client}").st_ino
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                program = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                if os.path.basename(program) == name and os.stat(entry / "ns" / "net").st_ino == inode:
                    found.append(int(entry.name))
            except OSError:
                continue
        return found


def require_network_namespaces() -> None:
    """Skip where the tests cannot make network namespaces (not root, or no `ip`); in CI that is a failure."""
    problem = None
    if os.getuid() != 0:
        problem = "network namespaces of the test's own need root"
    elif shutil.which("ip") is None:
        problem = "ip (iproute2) is not installed"
    elif shutil.which("pasta") is None:
        problem = "pasta (Debian package passt) is not installed"
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the network tests: {problem}")
        pytest.skip(problem)


def ip(*args: str) -> None:
    """`ip ARGS...`, failing with what it said."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _serve(namespace: str, address: str | None, port: int, folder: Path) -> subprocess.Popen[str]:
    """A server in `namespace` on `address` (None: every address of both families)."""
    python = shutil.which("python3") or sys.executable
    program = [SERVER, address, str(port), str(folder)] if address else [SERVER_EVERY_ADDRESS, str(port), str(folder)]
    server = subprocess.Popen(["ip", "netns", "exec", namespace, python, "-c", *program], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert server.stdout is not None
    line = server.stdout.readline()  # the server's own word that it listens (or nothing: it died)
    if line.strip() != "listening":
        server.kill()
        server.wait()
        raise RuntimeError(f"the test's HTTP server in {namespace} did not start (exit {server.poll()})")
    return server


@contextmanager
def own_network() -> Iterator[OwnNetwork]:
    require_network_namespaces()
    tag = str(os.getpid())
    client, server = f"owsbx-cl-{tag}", f"owsbx-sv-{tag}"
    client_end, server_end, other = f"owsbxc{tag}"[:15], f"owsbxs{tag}"[:15], f"owsbxo{tag}"[:14]
    folder = Path(tempfile.mkdtemp(prefix="owsbx-net-"))
    os.chmod(folder, 0o755)
    served, loopback_served = folder / "served", folder / "loopback"
    for place, words in ((served, GREETING), (loopback_served, "the host's loopback service\n")):
        place.mkdir()
        (place / "hello.txt").write_text(words)
        for path in (place, place / "hello.txt"):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    servers: list[subprocess.Popen[str]] = []
    made: list[str] = []
    try:
        for name in (client, server):
            ip("netns", "add", name)
            made.append(name)
        ip("link", "add", client_end, "type", "veth", "peer", "name", server_end)
        ip("link", "set", client_end, "netns", client)
        ip("link", "set", server_end, "netns", server)
        for name, end, address, address6 in ((client, client_end, CLIENT_ADDRESS, CLIENT_ADDRESS_6),
                                             (server, server_end, SERVER_ADDRESS, SERVER_ADDRESS_6)):
            ip("-n", name, "link", "set", "lo", "up")
            ip("-n", name, "addr", "add", f"{address}/24", "dev", end)
            ip("-n", name, "addr", "add", f"{address6}/64", "dev", end, "nodad")
            ip("-n", name, "link", "set", end, "up")
        ip("-n", client, "route", "add", "default", "via", SERVER_ADDRESS)
        ip("-n", client, "-6", "route", "add", "default", "via", SERVER_ADDRESS_6)
        ip("-n", client, "link", "add", other, "type", "veth", "peer", "name", f"{other}p")  # a dummy where
        ip("-n", client, "link", "set", f"{other}p", "up")  # the kernel has no dummy module
        ip("-n", client, "addr", "add", f"{OTHER_ADDRESS}/24", "dev", other)
        ip("-n", client, "addr", "add", f"{OTHER_ADDRESS_6}/64", "dev", other, "nodad")
        ip("-n", client, "link", "set", other, "up")
        servers.append(_serve(server, None, SERVER_PORT, served))
        servers.append(_serve(client, "127.0.0.1", LOOPBACK_PORT, loopback_served))
        servers.append(_serve(client, None, EVERY_ADDRESS_PORT, loopback_served))
        yield OwnNetwork(client, server, served, loopback_served)
    finally:
        for running in servers:
            with suppress(ProcessLookupError):
                os.killpg(running.pid, signal.SIGKILL)
            running.wait()
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)  # the veth pair goes too
        shutil.rmtree(folder, ignore_errors=True)


def fetch(url: str, timeout: float | None = None) -> str:
    """A bash line for the box: print what `url` answers, or the error, and fail when it cannot be had.
    `timeout`: seconds to wait for an answer; by default 5 on a quiet machine, stretched by its load (one
    beside a CPU hog on each core took more than 5 s to answer through pasta over IPv6)."""
    wait = patience(5) if timeout is None else timeout
    return (f"python3 -c \"import sys, urllib.request\ntry:\n    print(urllib.request.urlopen('{url}', "
            f"timeout={wait:g}).read().decode(), end='')\nexcept OSError as e:\n    sys.exit(f'unreachable: {{e}}')\"")
