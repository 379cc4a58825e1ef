"""A Jupyter server of the tests' (Enterprise Gateway, or a plain `jupyter server` with a provisioner) in
the gateway namespace of tests/gateway_hosts.py: started, said ready, spoken to, stopped, cleaned up.

tests/enterprise_gateway.py's `EnterpriseGateway` and tests/provisioned_server.py's `ProvisionedServer`
differ in their command line, their environment and the words that say they are ready; the rest is
this one class. `served` is the end of a test module's fixture around one: what the kernels left
running after the server has ended is killed, named, and fails the module.
"""

from __future__ import annotations

import http.client
import json
import secrets
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .gateway_hosts import GatewayNetwork, Host, socket_in
from .kernel_ws import KernelWebSocket
from .processes import PinnedProcesses, command_line, terminate
from .waiting import patience, wait_until

START_SECONDS = 90
LEFT_SECONDS = 15  # after the server ends, how long its kernels' processes may take to end too


class NamespaceServer:
    """One Jupyter server process on `port` of the gateway namespace's loopback (or published there),
    its output in `log_path`, its REST API and kernel WebSockets reached through that namespace."""

    what = "the Jupyter server"  # for messages
    ready_words = b"is running at"  # in its output once it listens
    request_seconds: float = 240

    def __init__(self, network: GatewayNetwork, log_path: Path, port: int, kernel_name: str, user: str) -> None:
        self.network = network
        self.port = port
        self.kernel_name = kernel_name
        self.user = user
        self.token = secrets.token_hex(16)
        self.log_path = log_path

    def _start(self, argv: list[str], env: dict[str, str]) -> None:
        """Run `argv` and wait until its output says `ready_words` and `_answers()`; if not, stop it and
        fail with its log's tail."""
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.PIPE)
        self._ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()
        if not self._ready.wait(patience(START_SECONDS)) or self.process.poll() is not None or not self._answers():
            self.stop()
            raise RuntimeError(f"{self.what} did not start: {self.log()[-3000:]}")

    def _answers(self) -> bool:
        """Whether it answers once it says it is ready (a server that says so first checks more)."""
        return True

    def _pump(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._log.write(line)
            self._log.flush()
            if self.ready_words in line:
                self._ready.set()
        self._ready.set()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                timeout: float | None = None) -> tuple[int, Any]:
        """(status, JSON answer, or the text of an answer that is not JSON)."""
        seconds = self.request_seconds if timeout is None else timeout
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=seconds)
        conn.sock = socket_in(self.network.gateway, ("127.0.0.1", self.port), seconds)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
            answer = conn.getresponse()
            data = answer.read()
            try:
                return answer.status, json.loads(data) if data else None
            except ValueError:
                return answer.status, data.decode(errors="replace")
        finally:
            conn.close()

    def websocket(self, kernel_id: str, user: str | None = None) -> KernelWebSocket:
        sock = socket_in(self.network.gateway, ("127.0.0.1", self.port))
        return KernelWebSocket(f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels", self.token,
                               user or self.user, sock=sock)

    def stop(self) -> None:
        terminate(self.process)
        self._log.close()


@contextmanager
def served(server: NamespaceServer, network: GatewayNetwork, name: str) -> Iterator[PinnedProcesses]:
    """Around a module's use of `server` (called `name` in messages): the processes the tests pin; at the
    end the server is stopped, whatever of them still runs LEFT_SECONDS later is killed, the server's
    and the kernels' logs are printed, and what was killed fails the module."""
    processes = PinnedProcesses()
    try:
        yield processes
    finally:
        server.stop()
        left = processes.still_running_after(LEFT_SECONDS)
        processes.kill(left)
        processes.close()
        print(f"{name} log:\n{server.log()[-5000:]}")
        for log in network.folder.glob("kernel-*.log"):
            print(f"{log.name}:\n{log.read_text(errors='replace')[-2000:]}")
        assert not left, f"still running {LEFT_SECONDS} s after the {name} ended (now killed): {left}"


def kernel_process(network: GatewayNetwork, kernel_id: str) -> tuple[Host, int] | None:
    """The host a kernel runs on and its pid there (found by the network namespace of its process), or
    None while there is none."""
    for host in network.hosts:
        for pid in host.processes():
            line = command_line(pid)
            if "gateway-kernel" in line and f"kernel-id {kernel_id}" in line:
                return host, pid
    return None


def kernel_on(network: GatewayNetwork, kernel_id: str) -> tuple[Host, int]:
    """`kernel_process`, once there is one."""
    return wait_until(lambda: kernel_process(network, kernel_id), 30, f"the process of kernel {kernel_id} on a host")
