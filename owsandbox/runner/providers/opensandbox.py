"""The `opensandbox` provider: a sandbox that an OpenSandbox server already runs, reached only
through its execd endpoint (a URL and the headers that came with it, e.g. X-EXECD-ACCESS-TOKEN).

execd gives no shell and no `exec -i`, but its pipe sessions are a command with stdin and stdout,
which is all a provider needs (see `wstransport`). Everything goes through them:

* a short box program (`python3 -S -c ...`) makes the private runtime folder, receives the zipapp
  when that version is not in the box yet (named by its content, as the `exec` provider does),
  starts the daemon detached — or finds it serving — and prints one JSON line. execd has no "close
  stdin", so the zipapp goes in length-prefixed: the program asks for it with a line and reads
  exactly that many bytes. (OpenSandbox's execd also has `/files/upload`; the runner box's own
  execd-compatible endpoint does not, and the pipe route works with both.)
* each pipe to the daemon is a relay (`attach`) in a pipe session of its own.
* `%attach` talks to this same execd directly (`execd_endpoint`), not to the daemon's endpoint.

The daemon lingers after its last client, so a dropped connection or a restarting kernel finds it
again; `destroy()` stops it and removes its folder. The box is the OpenSandbox sandbox itself: this
provider never creates or deletes sandboxes, it only runs in one.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import shlex
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

from ...channel.endpoint import ENV_TOKEN, ENV_URL, TOKEN_HEADER, ExecdEndpoint
from ..bundle import zipapp_bytes
from ..wstransport import ExecdPipeTransport, ExecdTransportError
from .base import Provider
from .exec import BoxError

_KEY = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")

# Runs in the box as `python3 -S -c PROGRAM ARGS_JSON`, in an execd pipe session. Standard library only.
_BOX_PROGRAM = r'''
import json, os, sys
args = json.loads(sys.argv[1])
base = args.get("runtime_dir") or os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
root = os.path.join(base, "owsandbox-%d" % os.getuid())
folder = os.path.join(root, args["key"])
runner = os.path.join(root, args["runner_name"])
out = {"python": sys.version.split()[0], "runner": runner, "folder": folder,
       "socket": os.path.join(folder, "run", "runner.sock")}

def say(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()

def fail(message):
    say({"error": message})
    sys.exit(0)

def upload():
    import base64, hashlib
    say({"need_runner": True})  # the host answers with "<length>\n" and that many bytes of base64
    size = int(sys.stdin.buffer.readline())
    data = sys.stdin.buffer.read(size)
    if len(data) != size:
        fail("the runner's upload was cut short (%d of %d bytes)" % (len(data), size))
    blob = base64.b64decode(data)
    if hashlib.sha256(blob).hexdigest() != args["sha256"]:
        fail("the uploaded runner does not match its hash")
    temp = runner + ".%d.tmp" % os.getpid()
    with open(temp, "wb") as f:
        f.write(blob)
    os.replace(temp, runner)
    out["uploaded"] = True

def daemonctl():
    sys.path.insert(0, runner)  # the daemon is started and stopped as the runner itself does it
    from owbox import daemonctl
    return daemonctl

def start():
    if not os.path.exists(runner):
        upload()
    cwd = args["cwd"] or os.path.expanduser("~")
    if not os.path.isdir(cwd):
        fail("no such folder in the box: %s" % cwd)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    out["cwd"] = cwd
    ctl = daemonctl()
    try:
        out.update(ctl.start(folder, ["--cwd", cwd, "--linger", str(args["linger"])], runner, args["start_timeout"]))
    except ctl.DaemonError as exc:
        fail(str(exc))

if args["action"] == "start":
    os.makedirs(root, mode=0o700, exist_ok=True)
    os.chmod(root, 0o700)
    start()
elif args["action"] == "stop" and os.path.isdir(folder):
    if os.path.exists(runner):
        daemonctl().stop(folder, remove=args.get("remove"))
    elif args.get("remove"):
        import shutil
        shutil.rmtree(folder, ignore_errors=True)
say(out)
'''


def _endpoint(url: str | None, headers: Mapping[str, str] | None) -> ExecdEndpoint:
    """The endpoint from the arguments, else from OWSANDBOX_EXECD_URL / OWSANDBOX_EXECD_TOKEN."""
    if url is None:
        endpoint = ExecdEndpoint.from_env()
    else:
        endpoint = ExecdEndpoint.from_env({ENV_URL: url})
        if headers is None:
            token = os.environ.get(ENV_TOKEN, "")
            headers = {TOKEN_HEADER: token} if token else {}
    if headers is not None:
        endpoint = dataclasses.replace(endpoint, headers=dict(headers))
    return endpoint


class OpenSandboxProvider(Provider):
    name = "opensandbox"
    enforcement = "the OpenSandbox sandbox"

    def __init__(self, cwd: str | os.PathLike[str] | None = None, url: str | None = None,
                 headers: Mapping[str, str] | None = None, python: str = "python3", key: str | None = None,
                 linger_seconds: float = 300.0, box_cwd: str | None = None, *,
                 relay_silence_seconds: float = 60.0, runtime_dir: str | None = None, timeout: float = 60.0) -> None:
        self.endpoint = _endpoint(url, headers)
        self.python = python
        self.key = key or f"k-{uuid.uuid4().hex[:16]}"
        if not _KEY.match(self.key):
            raise ValueError(f"'{self.key}' cannot name a folder in the box: use letters, digits, '.', '_', '-'")
        self.linger_seconds = linger_seconds
        self.relay_silence_seconds = relay_silence_seconds
        # The folder in the box: OWSANDBOX_BOX_CWD, else the given one ("" = the box user's home).
        self.cwd = box_cwd if box_cwd is not None else os.environ.get("OWSANDBOX_BOX_CWD", "")
        self.local_cwd = str(cwd or os.getcwd())
        self.runtime_dir = runtime_dir  # None: the box's $XDG_RUNTIME_DIR, else /tmp
        self.timeout = timeout
        self.socket_path = ""
        self.runner_path = ""
        self.daemon_info: dict[str, Any] = {}
        self.reused = False  # create() found this key's daemon serving
        self.box_folder = ""  # where the daemon started; a relay starts it there again if it died
        self.uploads = 0  # how many times this provider copied the zipapp into the box
        self._zipapp_cache: tuple[str, bytes] | None = None
        self._transports: weakref.WeakSet[ExecdPipeTransport] = weakref.WeakSet()
        self._lifecycle = threading.RLock()

    # -- talking to the box -----------------------------------------------------------------

    def _zipapp(self) -> tuple[str, bytes]:
        if self._zipapp_cache is None:
            self._zipapp_cache = zipapp_bytes()
        return self._zipapp_cache

    def _args(self, action: str, **extra: Any) -> dict[str, Any]:
        name, data = self._zipapp()
        return {"action": action, "key": self.key, "runner_name": name, "sha256": hashlib.sha256(data).hexdigest(),
                "cwd": self.cwd, "linger": self.linger_seconds, "runtime_dir": self.runtime_dir,
                "start_timeout": 20, **extra}

    def _box_program(self, args: dict[str, Any]) -> dict[str, Any]:
        """Run the box program in a pipe session: feed it the zipapp if it asks, return its answer."""
        command = (f"exec {shlex.quote(self.python)} -S -c {shlex.quote(_BOX_PROGRAM)} "
                   f"{shlex.quote(json.dumps(args))}")
        where = f"the OpenSandbox execd at {self.endpoint.describe()}"
        try:
            transport = ExecdPipeTransport(self.endpoint, command, open_timeout=min(self.timeout, 15.0))
        except ExecdTransportError as exc:
            raise BoxError(f"cannot use {where}: {exc}") from exc
        answer: dict[str, Any] | None = None
        deadline = time.monotonic() + self.timeout
        buffer = b""
        try:
            while True:
                chunk = transport.read(max(0.0, deadline - time.monotonic()))
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    message = _json_object(line)
                    if message is None:
                        continue
                    if message.get("need_runner"):
                        _, data = self._zipapp()
                        payload = base64.b64encode(data)
                        transport.send(b"%d\n" % len(payload) + payload)
                        self.uploads += 1
                    else:
                        answer = message
        except TimeoutError:
            raise BoxError(f"{self.python} in the box (through {where}) did not answer within "
                           f"{self.timeout:g} s") from None
        except OSError as exc:
            raise BoxError(f"the pipe session to {where} failed: {exc}") from exc
        finally:
            transport.close()
        if answer is None:
            tail = transport.stderr_tail()
            status = transport.exit_code
            if status == 127 or ("not found" in tail and self.python in tail):
                raise BoxError(f"the box has no {self.python}: it was not found through {where} "
                               f"(status {status}): {tail[-1000:]}")
            raise BoxError(f"{self.python} in the box (through {where}) failed (status {status}): "
                           f"{tail[-1000:] or 'no message'}")
        if answer.get("error"):
            raise BoxError(f"{answer['error']} (in the box, through {where})")
        return answer

    # -- the provider -----------------------------------------------------------------------

    def create(self) -> None:
        with self._lifecycle:
            self._start()

    def _start(self) -> None:
        started = self._box_program(self._args("start"))
        self.socket_path, self.runner_path = started["socket"], started["runner"]
        self.daemon_info = started.get("daemon", {})
        self.reused = bool(started.get("reused"))
        self.box_folder = started.get("cwd") or ""

    def open_runner(self) -> ExecdPipeTransport:
        assert self.runner_path, "create() first"
        # A daemon that died meanwhile (nobody else in the box would notice) is started again by the relay.
        start = ["--start", "--cwd", self.box_folder, "--linger", f"{self.linger_seconds:g}"] if self.box_folder else []
        command = shlex.join([self.python, "-S", self.runner_path, "attach", "--socket", self.socket_path,
                              "--silence-seconds", f"{self.relay_silence_seconds:g}", *start])
        with self._lifecycle:  # not while the daemon is being restarted: wait for the new one
            transport = ExecdPipeTransport(self.endpoint, f"exec {command}")
            self._transports.add(transport)
        return transport

    def execd_endpoint(self, hello: dict[str, Any]) -> ExecdEndpoint:
        """%attach uses the sandbox's own execd, the one this provider already talks to."""
        return self.endpoint

    def execd_socket(self, hello: dict[str, Any]) -> str:
        raise BoxError("an OpenSandbox box is reached through its execd URL, not a socket here: "
                       "use execd_endpoint()")

    def restart_daemon(self) -> None:
        with self._lifecycle:
            self._box_program(self._args("stop", remove=False))
            self._start()

    def _close_transports(self) -> None:
        for transport in list(self._transports):
            transport.close()

    def release(self) -> None:
        """Leave the daemon lingering in the box for a kernel that restarts."""
        self._close_transports()

    def destroy(self) -> None:
        self._close_transports()
        with self._lifecycle:
            try:
                self._box_program(self._args("stop", remove=True))
            except BoxError:
                pass  # an unreachable box cannot be tidied; its daemon leaves after lingering

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "endpoint": self.endpoint.describe(), "socket": self.socket_path,
                "runner": self.runner_path, "box cwd": self.cwd or "~"}


def _json_object(line: bytes) -> dict[str, Any] | None:
    if not line.startswith(b"{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
