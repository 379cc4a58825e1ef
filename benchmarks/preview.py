"""`%preview`'s figures: first-byte latency and throughput of a box's web server through the Jupyter server.

A `jupyter server` of its own (a token, its own runtime folder, port chosen by the OS) runs a kernel
(default: the installed `owsandbox` kernelspec, bubblewrap); a cell starts `python3 -m http.server` in
the box and `%preview` records its port. Then, through `/owsandbox/preview/<kernel>/<port>/`:
first byte of a small page (the time from sending the request to the status line: a new connection
each time, so each includes the tunnel's set-up through the execd socket; under the capability path the entry's
login redirect gives), and MB/s of a 50 MB file
read to the end. The server's peak resident memory (VmHWM) before and after the downloads shows that
the answer is streamed, not held. For comparison, the same through the tunnel alone (the execd
relay, no Jupyter server), the floor the proxy adds to.

With `--provider container --image IMAGE [--engine podman|docker]` the kernel runs in a container
(the server, and so its kernels, get OWSANDBOX_PROVIDER, OWSANDBOX_IMAGE and OWSANDBOX_ENGINE; the
engine's own settings, such as CONTAINERS_CONF or DOCKER_HOST, come from this environment): the proxy
and the relay alone then reach the box through the engine's `exec -i` relay, one per connection.

Run: `python benchmarks/preview.py [--rounds N] [--size-mb 50] [--kernel NAME] [--provider bwrap|container
--image IMAGE --engine podman|docker]`. Prints one line a figure.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.processes import terminate  # noqa: E402

PORT = 8765


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


class Server:
    def __init__(self, folder: Path, kernel_env: dict[str, str]) -> None:
        self.folder = folder
        self.token = secrets.token_hex(16)
        runtime = folder / "runtime"
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_CONFIG_DIR": str(folder / "config"),
               **kernel_env}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={folder / 'root'}", "--ServerApp.allow_root=True"],
            cwd=folder / "root", env=env, stdout=subprocess.DEVNULL, stderr=(folder / "server.log").open("wb"))
        info = runtime / f"jpserver-{self.process.pid}.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"jupyter server exited: {(folder / 'server.log').read_text()[-2000:]}")
            try:
                self.port = json.loads(info.read_text())["port"]
                break
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)
        else:
            raise SystemExit("jupyter server did not start in 60 s")
        while time.monotonic() < deadline:  # the info file may come before the port answers
            try:
                self.request("GET", "/api/status")
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("jupyter server did not answer in 60 s")

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Authorization": f"token {self.token}"})
        answer = conn.getresponse()
        raw = answer.read()
        conn.close()
        return answer.status, json.loads(raw) if raw.startswith(b"{") else raw

    def stop(self) -> None:
        terminate(self.process)


def run_cell(ws: Any, code: str) -> list[dict[str, Any]]:
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "bench",
                                   "session": "bench", "version": "5.3"}, "parent_header": {}, "metadata": {},
                        "channel": "shell", "buffers": [],
                        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                                    "allow_stdin": False, "stop_on_error": False}}))
    seen = []
    while True:
        msg = json.loads(ws.recv(timeout=120))
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        seen.append(msg)
        if msg["msg_type"] == "execute_reply":
            if msg["content"]["status"] != "ok":
                raise SystemExit(f"cell failed: {code!r}: {seen}")
            return seen


def first_byte(port: int, path: str, token: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    started = time.perf_counter()
    conn.request("GET", path, headers={"Authorization": f"token {token}"})
    answer = conn.getresponse()
    took = time.perf_counter() - started
    answer.read()
    conn.close()
    if answer.status != 200:
        raise SystemExit(f"GET {path}: {answer.status}")
    return took


def download(port: int, path: str, token: str) -> tuple[int, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    started = time.perf_counter()
    conn.request("GET", path, headers={"Authorization": f"token {token}"})
    answer = conn.getresponse()
    total = 0
    while chunk := answer.read(1 << 20):
        total += len(chunk)
    took = time.perf_counter() - started
    conn.close()
    return total, took


class _Relayed:
    """A tunnel through a container's recorded relay command: the socket and the command, ended together."""

    def __init__(self, door: Any, port: int) -> None:
        from owsandbox.preview.tunnel import read_answer, upgrade_request

        self.sock, theirs = socket.socketpair()
        self.process = subprocess.Popen(door.argv(), stdin=theirs, stdout=theirs, stderr=subprocess.DEVNULL,
                                        env=door.env(), start_new_session=True)
        theirs.close()
        self.sock.sendall(upgrade_request(port, door.headers))
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            chunk = self.sock.recv(1)
            if not chunk:
                raise SystemExit("the container's relay closed without answering")
            head += chunk
        read_answer(head[:-4])

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, size: int) -> bytes:
        return self.sock.recv(size)

    def close(self) -> None:
        self.sock.close()
        self.process.kill()
        self.process.wait()


def tunnel_figures(state_dir: Path, port: int, rounds: int, size: int) -> tuple[list[float], float]:
    """First byte and MB/s through the execd relay alone (no Jupyter server): the host's socket of a
    bubblewrap box, or a container's recorded `exec -i` relay, found as the server finds them."""
    from owsandbox.host.providers.container_door import ContainerDoor
    from owsandbox.preview.tunnel import open_tunnel
    from owsandbox.terminal.locate import door_in

    door = door_in(state_dir)

    def tunnel() -> Any:
        if isinstance(door, ContainerDoor):
            return _Relayed(door, port)
        return open_tunnel(door.unix_socket, door.headers, port)

    firsts = []
    for _ in range(rounds):
        started = time.perf_counter()
        sock = tunnel()
        sock.sendall(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
        sock.recv(1)
        firsts.append(time.perf_counter() - started)
        sock.close()
    sock = tunnel()
    started = time.perf_counter()
    sock.sendall(b"GET /big.bin HTTP/1.0\r\nHost: x\r\n\r\n")
    total = 0
    while chunk := sock.recv(1 << 20):
        total += len(chunk)
    took = time.perf_counter() - started
    sock.close()
    if total < size:
        raise SystemExit(f"the tunnel gave {total} bytes of {size}")
    return firsts, size / took / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--size-mb", type=int, default=50)
    parser.add_argument("--kernel", default="owsandbox")
    parser.add_argument("--provider", choices=["kernelspec", "bwrap", "container"], default="kernelspec",
                        help="the kernel's sandbox (default: as the kernelspec says)")
    parser.add_argument("--image", help="the container provider's image")
    parser.add_argument("--engine", help="the container provider's engine: podman or docker (default: either)")
    args = parser.parse_args()
    from websockets.sync.client import connect

    from owsandbox import settings
    from owsandbox.terminal.locate import sandbox_key, state_folder

    kernel_env = {} if args.provider == "kernelspec" else {settings.PROVIDER: args.provider}
    if args.provider == "container":
        if not args.image:
            raise SystemExit("--provider container needs --image")
        kernel_env[settings.IMAGE] = args.image
        if args.engine:
            kernel_env[settings.ENGINE] = args.engine

    size = args.size_mb * 1024 * 1024
    with tempfile.TemporaryDirectory(prefix="owsandbox-preview-bench-") as tmp:
        folder = Path(tmp)
        (folder / "root").mkdir()
        (folder / "root" / "index.html").write_text("<p>hello</p>\n")
        with (folder / "root" / "big.bin").open("wb") as out:
            for _ in range(args.size_mb):
                out.write(os.urandom(1024 * 1024))
        server = Server(folder, kernel_env)
        try:
            status, model = server.request("POST", "/api/kernels", {"name": args.kernel})
            if status != 201:
                raise SystemExit(f"no kernel: {status} {model}")
            kernel_id = model["id"]
            with connect(f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?session_id=bench",
                         additional_headers={"Authorization": f"token {server.token}"}, proxy=None,
                         max_size=None, open_timeout=60) as ws:
                run_cell(ws, f"nohup python3 -m http.server {PORT} --bind 127.0.0.1 >/dev/null 2>&1 &\n"
                             f"for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/{PORT}) 2>/dev/null && break; "
                             "sleep 0.05; done")
                run_cell(ws, f"%preview {PORT}")
                entry = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
                entry.request("GET", f"/owsandbox/preview/{kernel_id}/{PORT}/",
                              headers={"Authorization": f"token {server.token}"})
                answer = entry.getresponse()
                answer.read()
                entry.close()
                base = answer.headers["Location"].rstrip("/")  # the preview's capability path
                first_byte(server.port, f"{base}/index.html", server.token)  # warm up
                firsts = [first_byte(server.port, f"{base}/index.html", server.token) for _ in range(args.rounds)]
                hwm_before = _vm_hwm_kib(server.process.pid)
                speeds = []
                for _ in range(3):
                    total, took = download(server.port, f"{base}/big.bin", server.token)
                    if total != size:
                        raise SystemExit(f"got {total} bytes of {size}")
                    speeds.append(total / took / 1e6)
                hwm_after = _vm_hwm_kib(server.process.pid)
                state_dir = state_folder(sandbox_key(str(folder / "runtime" / f"kernel-{kernel_id}.json")))
                tunnel_firsts, tunnel_speed = tunnel_figures(state_dir, PORT, args.rounds, size)
        finally:
            server.stop()
    print(f"kernel {args.kernel}, provider {args.provider}"
          + (f" ({args.engine or 'podman or docker'}, image {args.image})" if args.provider == "container" else ""))
    ms = sorted(t * 1000 for t in firsts)
    print(f"first byte through the proxy (small page, new connection): median {statistics.median(ms):.1f} ms, "
          f"p90 {ms[int(len(ms) * 0.9) - 1]:.1f} ms, min {ms[0]:.1f} ms ({args.rounds} requests)")
    tms = sorted(t * 1000 for t in tunnel_firsts)
    print(f"first byte through the execd relay alone: median {statistics.median(tms):.1f} ms, min {tms[0]:.1f} ms")
    print(f"throughput of a {args.size_mb} MB file through the proxy: median {statistics.median(speeds):.0f} MB/s "
          f"({', '.join(f'{s:.0f}' for s in speeds)})")
    print(f"throughput through the execd relay alone: {tunnel_speed:.0f} MB/s")
    print(f"jupyter server peak RSS: {hwm_before / 1024:.0f} MiB before the downloads, "
          f"{hwm_after / 1024:.0f} MiB after ({3 * args.size_mb} MB streamed)")


if __name__ == "__main__":
    main()
