"""`%preview`: a server listening in a sandbox, fetched through a real Jupyter server.

A real `jupyter lab` server (tests/lab_browser.Lab: its own folders, a token) runs the default kernel
through its REST API; the test speaks to the kernel over the server's WebSocket, as a browser does.
Each test runs on a bubblewrap kernel, and on a container kernel with podman and with Docker (the
Debian test image of tests/containers.py, no network): the server reaches a bubblewrap box through the
execd socket in its state folder, a container through the engine's `exec -i` relay recorded there.
The server loads the `owsandbox.preview` extension from the `jupyter_server_config.d` file the package
installs. In the box: `python3 -m http.server`, a server that echoes the headers it got and
tries to set a cookie, and a WebSocket echo (tests/preview_apps, standard library only). A server on
this machine's loopback shows that a port of the host cannot be previewed nor proxied.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import shutil
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from owsandbox.host.providers import container_door
from owsandbox.preview import record
from owsandbox.preview.headers import CSP
from owsandbox.settings import SANDBOX_KIND
from owsandbox.terminal import locate

from .conftest import DEFAULT_KERNEL_NAME, require_bwrap
from .kernel_ws import Cell, KernelWebSocket
from .lab_browser import Lab, needs_linux_processes
from .preview_apps import HEADERS_ECHO, WS_ECHO
from .waiting import patience, wait_until

pytestmark = [pytest.mark.system]

IFRAME_SANDBOX = 'sandbox="allow-scripts allow-forms allow-popups"'


@dataclass
class Previewing:
    lab: Lab
    kernel_id: str
    kernel: KernelWebSocket
    marker: str

    def path(self, port: int, rest: str = "") -> str:
        return f"/owsandbox/preview/{self.kernel_id}/{port}/{rest}"

    def fetch(self, method: str, path: str, headers: dict[str, str] | None = None, token: bool = True,
              body: bytes | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One request to the server (not following redirects): status, headers, body."""
        parts = urllib.parse.urlsplit(self.lab.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=patience(60))
        sent = dict(headers or {})
        if token:
            sent.setdefault("Authorization", f"token {self.lab.token}")
        try:
            conn.request(method, path, body=body, headers=sent)
            answer = conn.getresponse()
            return answer.status, answer.headers, answer.read()
        finally:
            conn.close()

    def capability(self, port: int) -> str:
        """The preview's capability path (…/<port>/~SECRET), where the entry sends someone logged in."""
        status, headers, _ = self.fetch("GET", self.path(port))
        assert status == 302, (status, dict(headers))
        location = headers["Location"]
        assert location.startswith(self.path(port, "~")) and location.endswith("/"), location
        return location.rstrip("/")

    def run(self, code: str) -> Cell:
        cell = self.kernel.run(code, timeout=patience(90))
        return cell

    def restart(self) -> None:
        """Restart the kernel through the server's API (the same key: the box lingers, or is reused)."""
        status, _, body = self.fetch("POST", f"/api/kernels/{self.kernel_id}/restart")
        assert status == 200, body
        self.kernel.wait_for(lambda message: message.get("msg_type") == "status"
                             and message["content"].get("execution_state") == "idle", patience(90),
                             "the restarted kernel")

    def serve(self, command: str, port: int) -> None:
        """Start `command` in the box in the background and wait until `port` accepts there (for 10 s
        on a quiet machine, stretched by its load)."""
        tries = math.ceil(patience(10) / 0.05)
        cell = self.run(f"nohup {command} >/dev/null 2>&1 &\n"
                        f"for i in $(seq {tries}); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; "
                        "sleep 0.05; done; (exec 3<>/dev/tcp/127.0.0.1/" f"{port}) && echo listening")
        assert cell.text().strip() == "listening", cell.outputs


_PORTS = random.sample(range(20000, 30000), 1000)  # drawn without repeats: a module's servers outlive their tests


def _port() -> int:
    """A port for a server in the box, never one an earlier test of this run drew (its server may still run)."""
    return _PORTS.pop()


def _kernel_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The server's (and so its kernels') environment for the sandbox asked for: bubblewrap, the default;
    a container of the Debian test image on podman or on the tests' dockerd."""
    if request.param == "bwrap":
        require_bwrap()
        return {}
    engine = request.getfixturevalue(request.param)  # tests/containers.py: Podman, Docker
    return {**engine.settings, "OWSANDBOX_PROVIDER": "container", "OWSANDBOX_IMAGE": engine.image(),
            "OWSANDBOX_ENGINE": engine.path}


@pytest.fixture(scope="module", params=["bwrap", "podman", "docker"])
def previewing(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Previewing]:
    env = _kernel_env(request)
    folder = tmp_path_factory.mktemp("preview")
    lab = Lab(folder, env=env)
    lab.root.mkdir()
    for script in (HEADERS_ECHO, WS_ECHO):
        shutil.copy(script, lab.root / script.name)
    marker = uuid.uuid4().hex
    (lab.root / "site").mkdir()
    (lab.root / "site" / "index.html").write_text(f"<p>{marker}</p>")
    try:
        lab.start()
        parts = urllib.parse.urlsplit(lab.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        conn.request("POST", "/api/kernels", body=json.dumps({"name": DEFAULT_KERNEL_NAME}),
                     headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"})
        answer = conn.getresponse()
        model = json.loads(answer.read())
        conn.close()
        assert answer.status == 201, model
        kernel = KernelWebSocket(f"ws://{parts.hostname}:{parts.port}/api/kernels/{model['id']}/channels", lab.token)
        try:
            previewing = Previewing(lab, model["id"], kernel, marker)
            kind = previewing.run(f"echo ${SANDBOX_KIND}")
            assert kind.text().strip() == ("container" if env else "bwrap"), kind.outputs
            yield previewing
        finally:
            kernel.close()
    finally:
        left = lab.stop()
        print(f"jupyter lab log:\n{lab.log()[-4000:]}")
        assert not left, f"still running after the server ended: {left}"


def _html(cell: Cell) -> str:
    return "".join(c["data"].get("text/html", "") for t, c in cell.outputs if t == "display_data")


@needs_linux_processes
def test_http_server_in_the_box_is_served_with_the_servers_login_and_the_sandbox_policy(previewing: Previewing):
    port = _port()
    previewing.serve(f"python3 -m http.server {port} --bind 127.0.0.1 --directory site", port)
    cell = previewing.run(f"%preview {port}")
    assert cell.status == "ok", cell.outputs
    page = _html(cell)
    url = previewing.path(port)
    assert f'href="{url}"' in page and f'<iframe src="{url}" {IFRAME_SANDBOX}' in page, page
    assert "allow-same-origin" not in page
    assert url in cell.plain()

    status, headers, _ = previewing.fetch("GET", previewing.path(port, f"index.html?a=1&token={previewing.lab.token}"),
                                          token=False)
    cap = previewing.capability(port)
    assert (status, headers["Location"]) == (302, f"{cap}/index.html?a=1")  # the entry: on to the capability
    # The capability path is what the page's own requests (images, scripts, fetch) carry: no login needed.
    status, headers, body = previewing.fetch("GET", f"{cap}/index.html", token=False)
    assert (status, body.decode()) == (200, f"<p>{previewing.marker}</p>")
    assert headers.get_all("Content-Security-Policy") == [CSP]
    assert CSP.startswith("sandbox allow-scripts allow-forms allow-popups;")
    assert headers["Referrer-Policy"] == "no-referrer"
    # A folder without its slash: the box's redirect comes back under the capability path.
    (previewing.lab.root / "site" / "sub").mkdir()
    status, headers, _ = previewing.fetch("GET", f"{cap}/sub", token=False)
    assert (status, headers["Location"]) == (301, f"{cap}/sub/")
    # A wrong secret is refused, even with the server's login; a new %preview ends the old secret.
    status, _, body = previewing.fetch("GET", previewing.path(port, "~" + "A" * 32 + "/index.html"))
    assert status == 403 and previewing.marker.encode() not in body
    again = previewing.run(f"%preview {port}")
    assert again.status == "ok", again.outputs
    status, _, body = previewing.fetch("GET", f"{cap}/index.html", token=False)
    assert status == 403 and b"has ended or was started again" in body

    # Without the server's token: its login page for a page, a refusal for anything else; never the box's.
    status, headers, body = previewing.fetch("GET", previewing.path(port, "index.html"), token=False)
    assert status == 302 and "/login" in headers["Location"], (status, dict(headers))
    for method in ("POST", "PUT", "DELETE"):
        status, _, body = previewing.fetch(method, previewing.path(port, "index.html"), token=False, body=b"x")
        assert status == 403 and previewing.marker.encode() not in body
    status, _, _ = previewing.fetch("GET", previewing.path(port, "index.html"),
                                    {"Authorization": "token not-the-token"}, token=False)
    assert status == 302


def test_the_servers_credentials_never_reach_the_box_and_its_cookies_never_reach_the_browser(previewing: Previewing):
    port = _port()
    previewing.serve(f"python3 {HEADERS_ECHO.name} {port}", port)
    again = previewing.run(f"%preview {port}")
    assert again.status == "ok", again.outputs
    secret_cookie = "username-127-0-0-1-8888=secret-login; _xsrf=secret-xsrf"
    for how in ("header", "query"):
        headers = {"Cookie": secret_cookie, "X-XSRFToken": "secret-xsrf", "X-Custom": "kept"}
        path = previewing.capability(port) + "/echo?keep=1"
        if how == "query":
            path += f"&token={previewing.lab.token}"
        status, answer_headers, body = previewing.fetch("POST", path, headers, token=how == "header", body=b"form=1")
        assert status == 200, body
        got = json.loads(body)
        names = {name.lower(): value for name, value in got["headers"]}
        assert "cookie" not in names and "authorization" not in names and "x-xsrftoken" not in names, names
        assert previewing.lab.token not in body.decode() and "secret" not in body.decode()
        assert names["x-custom"] == "kept" and names["host"] == f"127.0.0.1:{port}"
        assert (got["method"], got["path"], got["body"]) == ("POST", "/echo?keep=1", "form=1")
        cookies = answer_headers.get_all("Set-Cookie") or []
        # The server's own login cookie may come (a token logs in, here as on any page of it); the box's never.
        assert not any("boxcookie" in cookie for cookie in cookies), cookies
        assert answer_headers["Content-Security-Policy"] == CSP


@needs_linux_processes
def test_a_websocket_in_the_box_is_relayed_and_stop_cuts_it(previewing: Previewing):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    port = _port()
    previewing.serve(f"python3 {WS_ECHO.name} {port}", port)
    again = previewing.run(f"%preview {port}")
    assert again.status == "ok", again.outputs
    cap = previewing.capability(port)
    ws_url = previewing.lab.url.replace("http://", "ws://").rstrip("/") + cap + "/socket"
    handshake = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                 "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    status, headers, _ = previewing.fetch("GET", previewing.path(port, "socket"), handshake, token=False)
    assert status == 302 and "/login" in headers["Location"]  # no token: refused before the box is reached
    with connect(ws_url, proxy=None, open_timeout=30, max_size=None) as ws:  # the capability path, as the page
        assert ws.response.headers.get_all("Set-Cookie") == []
        assert ws.response.headers["Content-Security-Policy"] == CSP
        for message in ("hello " + previewing.marker, b"\x00\x01" * 40000):
            ws.send(message)
            assert ws.recv(timeout=30) == message
        listed = previewing.run("%preview --list")
        assert str(port) in listed.plain() and previewing.path(port) in listed.plain()
        stopped = previewing.run(f"%preview stop {port}")
        assert stopped.status == "ok", stopped.outputs
        assert f"port {port} is no longer previewed (1 open connection(s) cut)" in stopped.text()
        assert "still runs" in stopped.text()
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
    assert str(port) not in previewing.run("%preview --list").plain()
    for path in (previewing.path(port, "socket"), cap + "/socket"):
        status, _, body = previewing.fetch("GET", path)
        assert status == 404 and f"run %preview {port}".encode() in body
    # The box's server still runs (stop does not kill it): previewing it again works.
    again = previewing.run(f"%preview {port}")
    assert again.status == "ok", again.outputs
    again = previewing.run(f"%preview stop {port}")
    assert "(0 open connection(s) cut)" in again.text()
    assert previewing.run(f"%preview stop {port}").error["evalue"].startswith(f"port {port} is not previewed")


class _HostPage(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"a page of the host")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def host_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HostPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_a_port_of_the_host_is_refused_by_the_magic_and_by_the_proxy(previewing: Previewing, host_port: int):
    with socket.create_connection(("127.0.0.1", host_port), timeout=5):
        pass  # it does listen, here
    cell = previewing.run(f"%preview {host_port}")
    assert cell.status == "error" and cell.error["ename"] == "NoPreview"
    assert f"nothing listens on port {host_port} in the sandbox" in cell.error["evalue"]
    status, _, body = previewing.fetch("GET", previewing.path(host_port))
    assert status == 404 and b"is not previewed" in body
    # Even with the port in the host's record (as if it had been previewed), the box's loopback is not this one.
    connection_file = previewing.lab.runtime / f"kernel-{previewing.kernel_id}.json"
    state_dir = locate.state_folder(locate.sandbox_key(str(connection_file)))
    record.add(state_dir, host_port, "")
    try:
        status, _, body = previewing.fetch("GET", previewing.capability(host_port) + "/")
    finally:
        record.remove(state_dir, host_port)
    assert status == 502 and f"nothing listens on port {host_port} in the sandbox".encode() in body
    assert b"a page of the host" not in body


@needs_linux_processes
def test_a_restarted_kernel_keeps_its_previews_and_previews_again(previewing: Previewing):
    port = _port()
    serve = f"python3 -m http.server {port} --bind 127.0.0.1 --directory site"
    previewing.serve(serve, port)
    again = previewing.run(f"%preview {port}")
    assert again.status == "ok", again.outputs
    cap = previewing.capability(port)
    previewing.restart()
    # The same box, with its record of previews; a restart gives fresh shells, so the server started
    # from a cell has ended with them.
    assert previewing.path(port) in previewing.run("%preview --list").plain()
    gone = f"nothing listens on port {port} in the sandbox".encode()
    wait_until(lambda: gone in previewing.fetch("GET", f"{cap}/index.html", token=False)[2], patience(30),
               "the server started from the old kernel's shell to end with it", interval=0.1)
    # Started again, it is previewed again by the new kernel (whose own way into the box is new).
    previewing.serve(serve, port)
    again = previewing.run(f"%preview {port}")
    assert again.status == "ok", again.outputs
    status, _, _ = previewing.fetch("GET", f"{cap}/index.html", token=False)
    assert status == 403
    status, _, body = previewing.fetch("GET", f"{previewing.capability(port)}/index.html", token=False)
    assert (status, body.decode()) == (200, f"<p>{previewing.marker}</p>")
    stopped = previewing.run(f"%preview stop {port}")
    assert "is no longer previewed" in stopped.text(), stopped.outputs


@pytest.mark.parametrize("line, error", [
    ("%preview", "give a PORT"), ("%preview 0", "'0' is not a port"), ("%preview 70000", "'70000' is not a port"),
    ("%preview http", "'http' is not a port"), ("%preview stop", "give the PORT"),
    ("%preview --list 80", "takes no port"), ("%preview 8000 http://elsewhere/", "is not a path"),
])
def test_bad_uses_are_refused_with_words(previewing: Previewing, line: str, error: str):
    cell = previewing.run(line)
    assert cell.status == "error" and error in cell.error["evalue"], cell.outputs


def test_the_server_reaches_a_container_only_as_the_hosts_record_says(previewing: Previewing):
    connection_file = previewing.lab.runtime / f"kernel-{previewing.kernel_id}.json"
    state_dir = locate.state_folder(locate.sandbox_key(str(connection_file)))
    if not isinstance(locate.door_in(state_dir), container_door.ContainerDoor):
        pytest.skip("a bubblewrap box is reached through the host's socket (the tests above)")
    port = _port()
    previewing.serve(f"python3 -m http.server {port} --bind 127.0.0.1 --directory site", port)
    again = previewing.run(f"%preview {port}")
    assert again.status == "ok", again.outputs
    cap = previewing.capability(port)
    # The record is the host's, in a folder the box never sees (only the lease is bound in, read-only).
    looked = previewing.run(f"ls {state_dir} {state_dir.parent} 2>&1")
    assert looked.text().count("No such file or directory") == 2, looked.outputs
    kept = (state_dir / container_door.RECORD).read_text()
    try:
        # A relay that ends without the box's answer: a 502 with what it said (here the box's python3).
        # Podman's exec sometimes loses the stderr of a program that ends at once (about one in three
        # here; containers/podman#9096): then the 502 has only the exit status, and a next try says it.
        changed = {**json.loads(kept), "runner": "/run/owsandbox/not-the-runner.pyz"}
        (state_dir / container_door.RECORD).write_text(json.dumps(changed))
        for _ in range(8):
            status, _, body = previewing.fetch("GET", f"{cap}/index.html", token=False)
            assert status == 502 and b"the relay into the container ended without the box's answer" in body, body
            assert previewing.marker.encode() not in body
            if b"not-the-runner.pyz" in body:
                break
        assert b"not-the-runner.pyz" in body
        # A record that would have the engine run with more than its own settings is never used.
        changed = {**json.loads(kept), "engine_env": {"LD_PRELOAD": "/tmp/x.so"}}
        (state_dir / container_door.RECORD).write_text(json.dumps(changed))
        status, _, body = previewing.fetch("GET", f"{cap}/index.html", token=False)
        assert status == 404 and b"has engine settings other than the engine's own" in body, body
    finally:
        (state_dir / container_door.RECORD).write_text(kept)
    status, _, body = previewing.fetch("GET", f"{cap}/index.html", token=False)
    assert (status, body.decode()) == (200, f"<p>{previewing.marker}</p>")
    assert previewing.run(f"%preview stop {port}").status == "ok"
