"""The host decides from its own records, and whatever the box feeds the kernel is data, bounded.

Each test is the attack, through a real kernel on the default sandbox (bubblewrap):

* the `%attach` registry is a file in the box: an entry naming a host address (TCP or a Unix
  socket) must not make the kernel connect there;
* a program's records, however large and nested, keep the kernel's memory bounded;
* a display id given by `owdisplay --id` never reaches the kernel's own displays;
* a display the kernel cannot parse (nested a million deep) is a note, and the command runs on,
  stoppable;
* `%record` writes no terminal control of the box into its `.cast` file;
* lines the box writes to its stderr (the daemon's log pipe) are shown as the box's.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import DEFAULT_KERNEL_NAME, require_bwrap
from ..kernel_session import KernelSession

REGISTRY = "/run/owsandbox/run/attach.json"  # the attach registry, as the box sees it (box/daemon.py)


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[KernelSession]:
    require_bwrap()
    session = KernelSession(tmp_path, kernel_name=DEFAULT_KERNEL_NAME)
    try:
        yield session
    finally:
        session.close()


class Listener:
    """A host endpoint that counts who connects: TCP on 127.0.0.1 or a Unix socket in a host folder."""

    def __init__(self, family: int, address: object) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def host_endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Listener, Listener]]:
    tcp = Listener(socket.AF_INET, ("127.0.0.1", 0))
    folder = tmp_path_factory.mktemp("host-socket")
    unix = Listener(socket.AF_UNIX, str(folder / "host.sock"))
    try:
        yield tcp, unix
    finally:
        tcp.close()
        unix.close()


def forge_registry(kernel: KernelSession, url: str) -> None:
    """A cell rewrites the box's attach registry: every entry now names `url` as its endpoint."""
    forged = kernel.run(f"""python3 - <<'EOF'
import json
entries = json.load(open("{REGISTRY}"))["sessions"]
for entry in entries:
    entry["url"] = {json.dumps(url)}
json.dump({{"sessions": entries}}, open("{REGISTRY}", "w"))
EOF""")
    assert forged.status == "ok", forged.outputs


def test_a_registry_entry_naming_a_host_address_is_never_connected_to(kernel: KernelSession, host_endpoints) -> None:
    tcp, unix = host_endpoints
    urls = [f"http://127.0.0.1:{tcp.sock.getsockname()[1]}", f"unix:{unix.sock.getsockname()}"]
    started = kernel.run("%attach --name victim -- sleep 120")
    assert started.status == "ok", started.outputs
    assert kernel.run("%detach").status == "ok"
    forge_registry(kernel, urls[0])
    again = kernel.run("%attach --last")  # this kernel attached it at the box's endpoint: it goes there again
    assert again.status == "ok" and "attached again to #1" in again.text(), again.outputs
    assert kernel.run("%detach").status == "ok"
    # A new kernel knows nothing of its own: only the box's file names an address.
    kernel.km.restart_kernel(now=False)
    kernel.kc.wait_for_ready(timeout=60)
    kernel.drain()
    session = kernel.run("%attach --list").of_type("display_data")[0]["data"]["text/plain"].splitlines()[1].split()[1]
    for url in urls:
        forge_registry(kernel, url)
        for how in ("%attach --last", f"%attach --session {session}"):
            refused = kernel.run(how)
            assert refused.status == "error", refused.outputs
            assert "does not connect to an address read from the sandbox" in refused.error["evalue"]
    time.sleep(0.5)
    assert tcp.connections == 0 and unix.connections == 0
    given = kernel.run(f"%attach --last --url {urls[0]}")  # the user's own --url is the user's decision
    assert given.status == "error" and tcp.connections > 0, given.outputs
