"""A real sshd on loopback, for tests and benchmarks: its own host key, user key and config.

`shared_connection` puts ssh's own connection sharing (a ControlMaster) in front of it, as a user who
opens many sessions to one host does: every session after the first then skips the key exchange and
the login (about 0.25 CPU-seconds each here, and half a second on a loaded machine).
"""

from __future__ import annotations

import getpass
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .ports import free_port

SSHD = "/usr/sbin/sshd"


def _listening_sshd(folder: Path, tries: int = 5) -> tuple[subprocess.Popen[bytes], int]:
    """sshd listening on a free port of 127.0.0.1, and that port. A port free a moment ago may be taken
    by another process before sshd binds it: then sshd says so and exits, and another port is tried."""
    said = b""
    for _ in range(tries):
        port = free_port()
        (folder / "sshd_config").write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {folder}/host_key\n"
            f"AuthorizedKeysFile {folder}/authorized_keys\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n"
            "MaxSessions 100\n"  # sessions over one shared connection (a box's relays, bridges, terminals)
            f"PidFile {folder}/sshd.pid\n")
        os.makedirs("/run/sshd", exist_ok=True)
        daemon = subprocess.Popen([SSHD, "-D", "-e", "-f", str(folder / "sshd_config")], stderr=subprocess.PIPE)
        assert daemon.stderr is not None
        said = b""
        for line in daemon.stderr:  # an event, not a guess: sshd says when it listens
            if b"Server listening" in line:
                return daemon, port
            said += line
        daemon.wait(10)
        if b"Address already in use" not in said:
            break
    raise RuntimeError(f"sshd did not start: {said.decode(errors='replace').strip()}")


@contextmanager
def loopback_sshd(folder: Path) -> Iterator[list[str]]:
    """Run sshd on 127.0.0.1 with keys made in `folder`; yield the ssh prefix that logs in with them."""
    for name in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
    (folder / "authorized_keys").write_text((folder / "user_key.pub").read_text())
    daemon, port = _listening_sshd(folder)
    try:
        assert daemon.stderr is not None
        threading.Thread(target=daemon.stderr.read, daemon=True).start()
        yield ["ssh", "-F", "/dev/null", "-i", str(folder / "user_key"), "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
               "-p", str(port), f"{getpass.getuser()}@127.0.0.1"]
    finally:
        daemon.terminate()
        daemon.wait(10)


@contextmanager
def shared_connection(prefix: list[str], folder: Path, timeout: float = 30.0) -> Iterator[list[str]]:
    """One master connection through `prefix` (an ssh command line, "ssh" first) for as long as the
    context lasts; yields the prefix whose sessions go over it (and log in anew if it is gone)."""
    socket = folder / "shared-connection"
    ssh, rest = prefix[:1], prefix[1:]
    master = subprocess.Popen([*ssh, "-M", "-N", "-o", f"ControlPath={socket}", "-o", "ControlPersist=no", *rest],
                              stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while not socket.exists():  # nothing announces it: ssh makes the socket once it has logged in
            if master.poll() is not None:
                raise RuntimeError(f"the shared ssh connection ended at once (status {master.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the shared ssh connection made no socket within {timeout:g} s")
            time.sleep(0.01)
        yield [*ssh, "-o", "ControlMaster=no", "-o", f"ControlPath={socket}", *rest]
    finally:
        master.terminate()
        master.wait(10)
