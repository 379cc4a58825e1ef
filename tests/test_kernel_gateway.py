"""owsandbox behind a Jupyter Kernel Gateway, the way Jupyter Enterprise Gateway puts kernels elsewhere.

Why: with `jupyter lab --gateway-url` the notebook server no longer runs kernels itself; it asks a
gateway over REST and relays the kernel's messages over a WebSocket. Everything owsandbox promises
(live output, Stop, a restart that keeps the sandbox, a shutdown that ends it) must hold across that
extra hop, where the kernel is started by another server (`jupyter kernelgateway`), with another
environment (the gateway passes a kernel only PATH, `KERNEL_*` and its kernelspec's env when the client
sends any env, as JupyterLab always does), in another folder (the gateway's, not the notebook's), and
named by the gateway's own connection files (`kernel-<id>.json`, the key the sandbox is kept by).

One real `jupyter kernelgateway` serves the module (free loopback port, token, its own JUPYTER_* and
HOME folders in tmp, the bubblewrap test kernel `owsandbox-test-default` as its default, kernels
listed), and one real `jupyter lab --gateway-url` with one Chromium page serves the browser test
(tests/lab_browser.py). Two tests:

* through the gateway's REST + WebSocket API with no browser (`websockets`, Jupyter's JSON wire
  format): start a kernel, run a cell (time to its result), Stop a `sleep 600` (its latency), attach
  to a JSON-lines program with `%attach` and see its `display_data` and the `update_display_data`
  messages for the same display id reach the WebSocket client, shut down via REST and see the
  sandbox's processes and state folder go;
* JupyterLab in Chromium (slow): live output while the cell runs, ■ Stop from the toolbar, a restart
  from the toolbar that keeps the sandbox (a file in the box's private /tmp is still there, its
  processes are the same, variables are gone), and Kernel ▸ Shut Down that ends the sandbox.

The page asks JupyterLab's kernel WebSockets for no subprotocol (see NO_KERNEL_SUBPROTOCOL): an upstream
bug in the notebook server's gateway mode, not the kernel's, otherwise leaves a stray gateway connection that
can keep any kernel's notebook "Unknown".

Every process is ended in teardown, even on failure: the gateway shuts its kernels down when it is
terminated; whatever ran under it, or mentions its folder (a sandbox that a restart left reparented),
must be gone 15 s later and is killed otherwise; tests/lab_browser.py does the same for JupyterLab and
closes Chromium.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import DEFAULT_KERNEL_NAME, require_bwrap
from .kernel_ws import KernelWebSocket
from .lab_browser import (
    NOTE,
    STDOUT,
    code_cell,
    lab_in_chromium,
    needs_linux_processes,
    notebook_for_test_kernel,
    stop_from_toolbar,
)
from .ports import free_port
from .processes import PinnedProcesses, command_line, descendants, stop_watched, wait_gone
from .waiting import WaitTimeout, patience, shell_waits_for, wait_until

pytestmark = pytest.mark.system

KERNEL = DEFAULT_KERNEL_NAME  # bubblewrap: a private /tmp, its own pid namespace, a state folder named by the key
ENGINE = Path(__file__).resolve().parents[1] / "notebooks" / "engines" / "echo_engine.py"
GATEWAY_START_SECONDS = 60
KERNEL_IDLE_MS = 60_000
INTERRUPT_MS = 5_000


def processes_mentioning(text: str) -> list[int]:
    """The pids whose command line contains `text` (a folder of this test's own: only what it started)."""
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and text in command_line(int(pid))]


@dataclass
class SandboxSeen:
    """A kernel's bubblewrap sandbox as seen from the host: its processes (pinned) and its state folder."""

    pids: dict[int, str]
    state_folder: Path

    def bwraps(self) -> set[int]:
        """bubblewrap itself and the sandbox's pid-namespace init (bubblewrap too)."""
        return {pid for pid, cmd in self.pids.items() if os.path.basename(cmd.split(" ", 1)[0]) == "bwrap"}

    def daemon(self) -> int:
        """The runner daemon's host pid (it runs `runner.pyz serve` inside bubblewrap)."""
        return next(pid for pid, cmd in self.pids.items() if "runner.pyz serve" in cmd and pid not in self.bwraps())

    def core(self) -> set[int]:
        """bubblewrap and the daemon: what lives as long as the sandbox (shells come and go)."""
        return self.bwraps() | {self.daemon()}


class _Exited(Exception):
    """The gateway process ended while it was awaited."""


class Gateway:
    """One `jupyter kernelgateway` with its own folders, its kernels working in `root`; remembers (by
    pidfd) every process seen under it, or mentioning its folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.root = folder / "root"  # the gateway's working folder: where its kernels run, their workspace
        self.token = secrets.token_hex(16)
        self.url = ""
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = folder / "kernelgateway.log"
        self.processes = PinnedProcesses()

    def start(self) -> None:
        for folder in ("root", "home", "config", "data", "runtime"):
            (self.folder / folder).mkdir(exist_ok=True)
        env = {
            **os.environ,  # JUPYTER_PATH finds the test kernelspecs (tests/conftest.py)
            "HOME": str(self.folder / "home"),
            "JUPYTER_CONFIG_DIR": str(self.folder / "config"),
            "JUPYTER_DATA_DIR": str(self.folder / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.folder / "runtime"),
            "IPYTHONDIR": str(self.folder / "ipython"),
            "KG_AUTH_TOKEN": self.token,  # in the environment, not on a command line anyone can read
            "PYTHONUNBUFFERED": "1",
        }
        for _attempt in range(3):  # the port is picked before the gateway binds it: another may take it first
            logged = len(self.log())
            port = free_port()
            args = [sys.executable, "-m", "kernel_gateway", "--KernelGatewayApp.ip=127.0.0.1",
                    f"--KernelGatewayApp.port={port}", "--KernelGatewayApp.port_retries=0",
                    f"--KernelGatewayApp.default_kernel_name={KERNEL}",
                    "--JupyterWebsocketPersonality.list_kernels=True"]
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(args, cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT)
            self.url = f"http://127.0.0.1:{port}"
            bound = patience(GATEWAY_START_SECONDS)  # stretched by the machine's load
            try:  # no event to wait on: the port is polled
                wait_until(self._answering, bound, "the kernel gateway to answer", interval=0.1)
                return
            except WaitTimeout:
                pytest.fail(f"the kernel gateway did not answer within {bound:.0f} s:\n{self.log()}")
            except _Exited:
                if "already in use" not in self.log()[logged:]:
                    pytest.fail(f"the kernel gateway exited with status {self.process.returncode}:\n{self.log()}")
        pytest.fail(f"the kernel gateway found no free port:\n{self.log()}")

    def _answering(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise _Exited
        try:
            return self.request("GET", "/api/kernelspecs")[0] == 200
        except OSError:
            return False

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                token: str | None = None) -> tuple[int, Any]:
        """(status, decoded JSON body or None) of a REST call, with the gateway's token unless given another."""
        data = None if body is None else json.dumps(body).encode()
        call = urllib.request.Request(self.url + path, data=data, method=method,
                                      headers={"Authorization": f"token {token or self.token}",
                                               "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(call, timeout=60) as answer:
                text = answer.read()
                return answer.status, json.loads(text) if text else None
        except urllib.error.HTTPError as refused:
            return refused.code, None

    def kernels(self) -> list[dict[str, Any]]:
        status, kernels = self.request("GET", "/api/kernels")
        assert status == 200, status
        return kernels

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def remember_processes(self) -> dict[int, str]:
        """Pin the gateway, everything under it, and whatever mentions its folder (a sandbox left by a
        restarted kernel is no longer under it); every process pinned so far."""
        if self.process is not None and self.process.poll() is None:
            self.processes.add_tree(self.process.pid)
        for pid in processes_mentioning(str(self.folder)):
            self.processes.add_tree(pid)
        return dict(self.processes.seen)

    def kernel_process(self, kernel_id: str) -> int | None:
        """The running kernel process with this id (its connection file is `kernel-<id>.json`)."""
        return next((pid for pid in processes_mentioning(f"kernel-{kernel_id}.json")
                     if "owsandbox.kernel" in command_line(pid)), None)

    def sandbox_of(self, kernel_id: str) -> SandboxSeen:
        """The bubblewrap sandbox of a kernel, found by its key: the kernel's relay names the state folder
        `<runtime>/owsandbox-UID/kernel-<id>` (the key is the gateway's kernel id), and the host's record
        there names the box's init, whose parent is bubblewrap itself."""
        self.remember_processes()
        relays = [re.search(rf"--socket (\S+/kernel-{kernel_id})/run/runner.sock", cmd)
                  for cmd in self.processes.seen.values()]
        state = next((found.group(1) for found in relays if found), None)
        assert state, f"no sandbox keyed kernel-{kernel_id}: {self.processes.seen}"
        init = json.loads(Path(state, "daemon.json").read_text())["init_pid"]
        bwraps = [init, int(Path(f"/proc/{init}/stat").read_text().rsplit(")", 1)[1].split()[1])]
        for pid in bwraps:
            self.processes.add_tree(pid)  # the daemon and the shells, in the box's pid namespace
        inside = {p for pid in bwraps for p in [pid, *descendants(pid)]}
        return SandboxSeen({pid: self.processes.seen[pid] for pid in inside if pid in self.processes.seen},
                           Path(state))

    def stop(self) -> dict[int, str]:
        """Terminate the gateway (it shuts its kernels down), kill it if it lingers; the processes seen
        under it that were still running 15 s later (they are killed)."""
        return stop_watched(self.process, self.processes, self.remember_processes)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    require_bwrap()
    server = Gateway(tmp_path_factory.mktemp("gateway"))
    try:
        server.start()
        yield server
    finally:
        left = server.stop()
        print("processes seen under the kernel gateway:",
              *(f"{pid} {cmd[:300]}" for pid, cmd in sorted(server.processes.seen.items())), sep="\n  ")
        print(f"kernel gateway log ({server.log_path}):\n{server.log()[-6000:]}")
    assert not left, f"still running 15 s after the kernel gateway ended (now killed): {left}"


# JupyterLab 4 opens a kernel's WebSocket offering the `v1.kernel.websocket.jupyter.org` subprotocol; a
# notebook server in gateway mode selects none, so Chromium fails that handshake and JupyterLab connects again
# without one. The server had already started its own WebSocket to the gateway for the failed one, and
# jupyter_server 2.21's GatewayWebSocketConnection never closes a gateway connection that completes after its
# client left: it stays open with the same session id, whose ZMQ identity then competes with the live
# connection's at the kernel, and the notebook may stay "Unknown" (at open, and typically after a restart).
# Any kernel: ipykernel's python3 does the same, with no browser (two gateway WebSockets with one session id,
# then a restart). So the page asks for no subprotocol on kernel channels from the start: the protocol
# JupyterLab falls back to anyway, every message still through JupyterLab, the notebook server and the gateway.
NO_KERNEL_SUBPROTOCOL = r"""(() => {
    const Native = window.WebSocket;
    window.WebSocket = class extends Native {
        constructor(url, protocols) {
            super(url, /\/api\/kernels\/[^/]+\/channels/.test(String(url)) ? [] : protocols);
        }
    };
})();"""


@pytest.fixture(scope="module")
def lab_page(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """One `jupyter lab --gateway-url` (the gateway's token in its environment) and one Chromium page on it."""
    folder = tmp_path_factory.mktemp("lab")
    (folder / "home").mkdir()
    with lab_in_chromium(folder, "jupyterlab-gateway.png", lab_args=[f"--gateway-url={gateway.url}"],
                         lab_env={"JUPYTER_GATEWAY_AUTH_TOKEN": gateway.token, "HOME": str(folder / "home")}) as pair:
        pair[1].add_init_script(NO_KERNEL_SUBPROTOCOL)
        yield pair


def wait_ended(sandbox: SandboxSeen, timeout: float = 15) -> None:
    """Assert that every process of `sandbox` ends within `timeout` s and its state folder goes."""
    running = wait_gone(list(sandbox.pids), timeout)
    assert not running, f"still running after the kernel was shut down: {[sandbox.pids[p] for p in running]}"
    wait_until(lambda: not sandbox.state_folder.exists(), timeout, f"{sandbox.state_folder} to be removed")


@needs_linux_processes
def test_rest_and_websocket_clients_get_cells_stop_and_attach_updates(gateway: Gateway) -> None:
    """No browser: the gateway's own API, as any remote client (a notebook server, an agent) uses it."""
    assert gateway.request("GET", "/api/kernels", token="wrong")[0] == 401  # the token is required
    shutil.copy(ENGINE, gateway.root / ENGINE.name)  # the kernels' workspace is the gateway's folder

    asked = time.monotonic()
    status, kernel = gateway.request("POST", "/api/kernels", {})  # no name: the gateway's default kernel
    assert status == 201 and kernel["name"] == KERNEL, (status, kernel)
    channels = KernelWebSocket(f"ws://{gateway.url.removeprefix('http://')}/api/kernels/{kernel['id']}/channels",
                               gateway.token)
    try:
        first = channels.run("echo first-result from $(hostname)")
        answered = time.monotonic() - asked
        assert first.status == "ok" and first.text() == "first-result from sandbox\n"
        print(f"gateway kernel start request → first cell's result: {answered:.2f} s")
        sandbox = gateway.sandbox_of(kernel["id"])  # keyed by the gateway's kernel id
        assert sandbox.daemon()

        # Stop through the gateway's REST interrupt (the kernelspec's interrupt_mode is `message`).
        msg_id = channels.send("echo started; sleep 600")
        channels.wait_for(lambda m: m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream",
                          30, "the long cell to start")
        pressed = time.monotonic()
        assert gateway.request("POST", f"/api/kernels/{kernel['id']}/interrupt")[0] == 204
        stopped = channels.collect(msg_id, timeout=patience(INTERRUPT_MS / 1000))
        print(f"REST interrupt → execute_reply through the gateway: {(time.monotonic() - pressed) * 1000:.0f} ms")
        assert stopped.status == "error" and stopped.reply["ename"] == "Interrupted"
        assert channels.run("echo after-stop").text() == "after-stop\n"

        # %attach: its display, then updates of that same display, reach the WebSocket client.
        python = shlex.quote(os.path.realpath(sys.executable))  # the daemon's own Python, mounted in the box
        attached = channels.run(f"%attach --name echo -- {python} {ENGINE.name}")
        assert attached.status == "ok", attached.outputs
        assert "attached to #1 echo" in attached.text()
        [shown] = attached.of_type("display_data")
        display_id = shown["transient"]["display_id"]
        answer = channels.run('%send {"id": "gw-1", "type": "echo", "text": "through the gateway"}')
        assert answer.of_type("display_data")[0]["data"]["application/json"] == {
            "id": "gw-1", "type": "response", "ok": True, "text": "through the gateway"}

        def answered(msg: dict[str, Any]) -> bool:
            return (msg["msg_type"] == "update_display_data" and msg["content"]["transient"]["display_id"] == display_id
                    and '"text": "through the gateway"' in msg["content"]["data"]["text/plain"])

        if not any(answered(msg) for msg in channels.seen):  # it may have come before %send's reply
            channels.wait_for(answered, 20, "the attach display to be updated with the answer")
        of_display = [m for m in channels.seen if m["msg_type"] in ("display_data", "update_display_data")
                      and m["content"].get("transient", {}).get("display_id") == display_id]
        # the view may batch records into one update
        assert of_display[0]["msg_type"] == "display_data" and len(of_display) >= 2, of_display
        assert all(m["msg_type"] == "update_display_data" for m in of_display[1:])
        assert '"type": "ready"' in of_display[-1]["content"]["data"]["text/plain"]  # every record, in place
    finally:
        channels.close()

    assert gateway.request("DELETE", f"/api/kernels/{kernel['id']}")[0] == 204
    assert gateway.kernels() == []
    wait_ended(sandbox)


@pytest.fixture
def open_gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway without a token, for jupyter_server's gateway client: it sends the token on REST calls but
    not on its kernel WebSocket (jupyter_server 2.21, `GatewayKernelClient.start_channels`), which a
    gateway with a token refuses (401)."""
    require_bwrap()
    server = Gateway(tmp_path)
    server.token = ""
    try:
        server.start()
        yield server
    finally:
        left = server.stop()
    assert not left, f"still running 15 s after the kernel gateway ended (now killed): {left}"


@needs_linux_processes
def test_a_jupyter_client_kernel_client_through_the_gateway_gets_attach_updates(open_gateway: Gateway) -> None:
    """jupyter_client's AsyncKernelClient API (jupyter_server's GatewayKernelManager and GatewayKernelClient,
    the gateway's REST and WebSocket underneath): cells, `%attach`'s display and its updates, interrupt,
    shutdown."""
    from jupyter_server.gateway.gateway_client import GatewayClient
    from jupyter_server.gateway.managers import GatewayKernelManager

    shutil.copy(ENGINE, open_gateway.root / ENGINE.name)
    python = shlex.quote(os.path.realpath(sys.executable))
    client_config = GatewayClient.instance()
    client_config.url = open_gateway.url

    async def converse() -> tuple[SandboxSeen, list[dict[str, Any]], dict[str, Any]]:
        manager = GatewayKernelManager()
        await manager.start_kernel(kernel_name=KERNEL)
        client = manager.client()
        await client.start_channels()
        seen: list[dict[str, Any]] = []

        async def run(code: str) -> dict[str, Any]:
            msg_id = client.execute(code)
            reply = await client.get_shell_msg(timeout=60)
            assert reply["parent_header"]["msg_id"] == msg_id
            while True:  # its output, up to its idle status
                msg = await client.get_iopub_msg(timeout=30)
                seen.append(msg)
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle" \
                        and msg["parent_header"].get("msg_id") == msg_id:
                    return reply

        try:
            assert (await run("echo $(hostname)"))["content"]["status"] == "ok"
            sandbox = open_gateway.sandbox_of(str(manager.kernel_id))
            assert (await run(f"%attach --name echo -- {python} {ENGINE.name}"))["content"]["status"] == "ok"
            assert (await run('%send {"id": "jc-1", "type": "echo", "text": "via jupyter_client"}'))[
                "content"]["status"] == "ok"
            while not any(m["msg_type"] == "update_display_data" and "via jupyter_client" in str(m["content"])
                          for m in seen):  # the display is redrawn soon after the record came
                seen.append(await client.get_iopub_msg(timeout=20))
            msg_id = client.execute("sleep 600")
            while not any(m["msg_type"] == "execute_input" and m["parent_header"].get("msg_id") == msg_id
                          for m in seen):
                seen.append(await client.get_iopub_msg(timeout=30))
            await manager.interrupt_kernel()
            stopped = await client.get_shell_msg(timeout=30)
        finally:
            client.stop_channels()
            await manager.shutdown_kernel()
        return sandbox, seen, stopped

    try:
        sandbox, seen, stopped = asyncio.run(converse())
    finally:
        GatewayClient.clear_instance()
    texts = [m["content"]["text"] for m in seen if m["msg_type"] == "stream"]
    assert texts[0] == "sandbox\n"
    [shown] = [m for m in seen if m["msg_type"] == "display_data" and "display_id" in m["content"].get("transient", {})]
    display_id = shown["content"]["transient"]["display_id"]
    updates = [m for m in seen if m["msg_type"] == "update_display_data"
               and m["content"]["transient"]["display_id"] == display_id]
    assert any('"text": "via jupyter_client"' in m["content"]["data"]["text/plain"] for m in updates), updates
    assert stopped["content"]["status"] == "error" and stopped["content"]["ename"] == "Interrupted"
    assert open_gateway.kernels() == []
    wait_ended(sandbox)


@pytest.mark.slow
@needs_linux_processes
@pytest.mark.timeout(600)  # a hang guard (155 s with two test runs at once); its waits scale with the load
def test_jupyterlab_through_the_gateway_streams_stops_restarts_and_shuts_down(gateway: Gateway, lab_page) -> None:
    from playwright.sync_api import expect

    lab, page = lab_page
    marker = f"gw-{secrets.token_hex(6)}"
    go = gateway.root.resolve() / f"go-{marker}"  # the first cell prints its second line once this exists
    sources = [f"echo line-1; {shell_waits_for(go)}; echo line-2",
               "export KEPT=yes; echo started; sleep 600",
               'echo "after-stop: $KEPT"',
               f"echo {marker} > /tmp/{marker}; echo written",
               f'cat /tmp/{marker}; echo "[$KEPT]"']
    notebook = notebook_for_test_kernel(lab.root, "gateway.ipynb", {
        "cells": [code_cell(source) for source in sources], "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
        kernel_name=KERNEL)
    display_name = notebook["metadata"]["kernelspec"]["display_name"]
    opened = time.monotonic()
    lab.open(page, "gateway.ipynb")
    idle = page.locator("#jp-main-statusbar").get_by_text(f"{display_name} | Idle")
    expect(idle).to_be_visible(timeout=KERNEL_IDLE_MS)
    print(f"page opened → kernel idle through the gateway: {time.monotonic() - opened:.2f} s")
    [kernel] = gateway.kernels()  # the notebook's kernel runs at the gateway, not under JupyterLab
    assert kernel["name"] == KERNEL
    assert not any("owsandbox.kernel" in cmd for cmd in lab.remember_processes().values())
    cells = page.locator(".jp-NotebookPanel .jp-Notebook .jp-CodeCell")

    def run(index: int) -> Any:
        cells.nth(index).locator(".jp-InputPrompt").click()
        page.keyboard.press("Shift+Enter")
        return cells.nth(index)

    # Live output: the first line shows while the cell still runs ([*]); the cell goes on to its second
    # line only once the test has seen that (up to 60 s), so a slow machine cannot make it miss the moment.
    started = time.monotonic()
    cell = run(0)
    try:
        page.wait_for_function(
            """([cell, stdout]) => {
                const out = cell.querySelector(stdout), prompt = cell.querySelector('.jp-InputPrompt');
                return out !== null && out.textContent.includes('line-1') && prompt.textContent.trim() === '[*]:';
            }""", arg=[cell.element_handle(), STDOUT], timeout=KERNEL_IDLE_MS)
    except Exception:
        print(f"the first cell as shown: {cell.inner_text(timeout=5000)!r}")  # ran? printed? still [*]?
        raise
    finally:
        go.touch()
    live = time.monotonic() - started
    expect(cell.locator(STDOUT)).to_have_text(re.compile(r"^line-1\nline-2\n?$"))
    expect(cell.locator(".jp-InputPrompt")).to_have_text("[1]:")
    print(f"first line shown while running after {live:.2f} s; cell done after {time.monotonic() - started:.2f} s")
    # The first cell says where commands run: bubblewrap, in the gateway's folder (not the notebook's).
    expect(cell.locator(NOTE)).to_contain_text(f"[sandbox: bubblewrap · writes to {gateway.root.resolve()} ·")

    # Stop: ■ in the toolbar ends `sleep 600`; the next cell answers on the same shell.
    cell = run(1)
    expect(cell.locator(STDOUT)).to_have_text("started")
    expect(cell.locator(".jp-InputPrompt")).to_have_text("[*]:")
    stopped = stop_from_toolbar(page, cell, INTERRUPT_MS)
    print(f"Stop (toolbar) → Interrupted rendered through the gateway: {stopped:.2f} s")
    cell = run(2)
    expect(cell.locator(STDOUT)).to_have_text("after-stop: yes")
    expect(cell.locator(".jp-InputPrompt")).to_have_text("[3]:")

    # Restart from the toolbar: fresh shells in the same sandbox (its /tmp is its own, and kept).
    cell = run(3)
    expect(cell.locator(STDOUT)).to_have_text("written")
    assert not Path("/tmp", marker).exists()  # the box's /tmp is its own
    sandbox = gateway.sandbox_of(kernel["id"])
    core = sandbox.core()
    old_kernel = gateway.kernel_process(kernel["id"])
    assert old_kernel is not None
    page.locator('.jp-NotebookPanel-toolbar [data-command="notebook:restart-kernel"]').click()
    page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").filter(has_text="Restart").click()
    wait_until(lambda: gateway.kernel_process(kernel["id"]) not in (None, old_kernel), 60,
               "a new kernel process with the same id at the gateway")
    expect(idle).to_be_visible(timeout=KERNEL_IDLE_MS)
    cell = run(4)
    expect(cell.locator(STDOUT)).to_have_text(re.compile(rf"^{marker}\n\[\]\n?$"))
    expect(cell.locator(".jp-InputPrompt")).to_have_text("[1]:")  # a new kernel counts from 1
    assert [k["id"] for k in gateway.kernels()] == [kernel["id"]]
    assert gateway.processes.still_running_after(0) >= core, "the sandbox did not outlive the restart"

    # Kernel ▸ Shut Down: the gateway's kernel goes, and with it the sandbox.
    page.get_by_role("menuitem", name="Kernel", exact=True).click()
    page.locator('li[data-command="kernelmenu:shutdown"]').click()
    wait_until(lambda: gateway.kernels() == [], 30, "the gateway to have no kernel")
    wait_ended(sandbox)
