"""The `exec` provider: any box you can run a command in with pipes — `ssh HOST`, `docker exec -i C`,
`podman exec -i C`, `kubectl exec -i POD --`.

Everything goes through that one command prefix. Every word passed after it is a plain word (no
spaces, quotes or shell syntax), so a prefix that hands its arguments to a remote shell (ssh) and one
that runs them directly (docker exec) behave alike; programs go in on stdin to `python3 -`. The
zipapp is copied in through the same pipe, once per version (it is named by its content). The
daemon runs detached in a private runtime folder of the box and lingers after its last client, so a
dropped connection or a restarting kernel finds it again; each pipe is a relay started with `attach`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import threading
import uuid
from typing import Any

from ..bundle import zipapp_bytes
from ..forward import ForwardBridge
from ..transport import PipeTransport
from .base import Provider

EXEC_ENV = "OWSANDBOX_EXEC"
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")

# Runs in the box as `python3 -` with a JSON object of arguments on its first line of stdin.
_BOOTSTRAP = r'''
import json, os, sys
args = json.loads(sys.stdin.readline())
base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
root = os.path.join(base, "owsandbox-%d" % os.getuid())
os.makedirs(root, mode=0o700, exist_ok=True)
os.chmod(root, 0o700)
folder = os.path.join(root, args["key"])
runner = os.path.join(root, args["runner_name"])
out = {"python": sys.version.split()[0], "executable": sys.executable, "runner": runner, "folder": folder,
       "socket": os.path.join(folder, "run", "runner.sock")}
payload = sys.stdin.read().strip()
if payload and not os.path.exists(runner):
    import base64
    temp = runner + ".%d.tmp" % os.getpid()
    with open(temp, "wb") as f:
        f.write(base64.b64decode(payload))
    os.replace(temp, runner)
if os.path.exists(runner):
    sys.path.insert(0, runner)  # the daemon is started and stopped as the runner itself does it
    from owbox import daemonctl
if args["action"] == "start" and not os.path.exists(runner):
    out["need_runner"] = True
elif args["action"] == "start":
    cwd = args["cwd"] or os.path.expanduser("~")
    if not os.path.isdir(cwd):
        out = {"error": "no such folder in the box: %s" % cwd}
    else:
        out["cwd"] = cwd
        os.makedirs(folder, mode=0o700, exist_ok=True)
        try:
            out.update(daemonctl.start(folder, ["--cwd", cwd, "--linger", str(args["linger"])], runner))
        except daemonctl.DaemonError as exc:
            out = {"error": str(exc)}
elif args["action"] == "stop" and os.path.exists(runner):
    daemonctl.stop(folder, remove=args.get("remove"))
elif args["action"] == "stop" and args.get("remove"):
    import shutil
    shutil.rmtree(folder, ignore_errors=True)
print(json.dumps(out))
'''


class BoxError(RuntimeError):
    """The box could not be reached or used; the message names the command and its stderr."""


class ExecProvider(Provider):
    name = "exec"
    enforcement = "the box"

    def __init__(self, cwd: str | os.PathLike[str] | None = None, prefix: list[str] | str | None = None,
                 python: str = "python3", key: str | None = None, linger_seconds: float = 300.0,
                 relay_silence_seconds: float = 60.0, box_cwd: str | None = None, timeout: float = 60.0) -> None:
        prefix = prefix if prefix is not None else os.environ.get(EXEC_ENV, "")
        self.prefix = shlex.split(prefix) if isinstance(prefix, str) else list(prefix)
        if not self.prefix:
            raise ValueError(f"the exec provider needs a command prefix (e.g. 'ssh me@host'); set {EXEC_ENV}")
        self.python = python
        self.key = key or f"k-{uuid.uuid4().hex[:16]}"
        self.linger_seconds = linger_seconds
        self.relay_silence_seconds = relay_silence_seconds
        # The folder in the box: OWSANDBOX_BOX_CWD, else the given one (a box rarely has our paths: "" = home).
        self.cwd = box_cwd if box_cwd is not None else os.environ.get("OWSANDBOX_BOX_CWD", "")
        self.local_cwd = str(cwd or os.getcwd())
        self.timeout = timeout
        self.socket_path = ""
        self.runner_path = ""
        self.daemon_info: dict[str, Any] = {}
        self.reused = False
        self.box_python = python
        self.box_folder = ""
        self._bridge: ForwardBridge | None = None
        self._lifecycle = threading.RLock()
        for word in (self.python, self.key):
            if not _PLAIN_WORD.match(word):
                raise ValueError(f"'{word}' is not a plain word; the exec provider passes only plain words")

    # -- talking to the box -----------------------------------------------------------------

    def _run_bootstrap(self, args: dict[str, Any], payload: bytes = b"") -> dict[str, Any]:
        argv = [*self.prefix, self.python, "-"]
        # `python3 -` reads the program up to EOF, so the program carries its own arguments and data.
        program = (f"import sys, io\nsys.stdin = io.StringIO({json.dumps(json.dumps(args))} + '\\n' + "
                   f"{json.dumps(payload.decode('ascii'))})\n" + _BOOTSTRAP)
        try:
            done = subprocess.run(argv, input=program.encode(), capture_output=True, timeout=self.timeout)
        except FileNotFoundError as exc:
            raise BoxError(f"cannot run {shlex.join(argv)}: {exc.strerror}") from None
        except subprocess.TimeoutExpired:
            raise BoxError(f"{shlex.join(argv)} did not answer within {self.timeout:g} s") from None
        lines = [line for line in done.stdout.decode(errors="replace").splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            stderr = done.stderr.decode(errors="replace").strip()
            if done.returncode == 127 or "not found" in stderr and self.python in stderr:
                raise BoxError(f"the box has no {self.python}: {shlex.join(argv)} failed "
                               f"(status {done.returncode}): {stderr[-1000:]}")
            raise BoxError(f"{shlex.join(argv)} failed (status {done.returncode}): {stderr[-1000:] or 'no message'}")
        answer = json.loads(lines[-1])
        if answer.get("error"):
            raise BoxError(answer["error"])
        return answer

    def _common(self, action: str) -> dict[str, Any]:
        name, _ = zipapp_bytes()
        return {"action": action, "key": self.key, "runner_name": name, "cwd": self.cwd,
                "linger": self.linger_seconds}

    # -- the provider -----------------------------------------------------------------------

    def create(self) -> None:
        with self._lifecycle:
            self._start()

    def _start(self) -> None:
        started = self._run_bootstrap(self._common("start"))
        if started.get("need_runner"):  # the first time this version meets this box
            _, data = zipapp_bytes()
            started = self._run_bootstrap(self._common("start"), base64.b64encode(data))
        self.socket_path, self.runner_path = started["socket"], started["runner"]
        # Relays start the interpreter by its path: a wrapper found on PATH (pyenv's, say) costs time on
        # every connection.
        folder = started.get("cwd") or ""
        self.box_folder = folder if _PLAIN_WORD.match(folder) else ""  # where a restarted daemon starts
        executable = started.get("executable") or ""
        self.box_python = executable if _PLAIN_WORD.match(executable) else self.python
        self.daemon_info = started.get("daemon", {})
        self.reused = bool(started.get("reused"))
        for word in (self.socket_path, self.runner_path):
            if not _PLAIN_WORD.match(word):
                raise BoxError(f"the box's runtime folder '{word}' has characters the exec provider cannot pass")

    def open_runner(self) -> PipeTransport:
        start = ["--start", "--cwd", self.box_folder, "--linger", str(self.linger_seconds)] if self.box_folder else []
        return PipeTransport([*self.prefix, self.box_python, "-S", self.runner_path, "attach", "--socket",
                              self.socket_path, "--silence-seconds", str(self.relay_silence_seconds), *start])

    def execd_socket(self, hello: dict[str, Any]) -> str:
        """The box's execd socket is in the box: a local bridge runs `forward` through the prefix."""
        with self._lifecycle:
            if self._bridge is None:
                target = hello["execd"]["unix_socket"]
                if not _PLAIN_WORD.match(target):
                    raise BoxError(f"the box's execd socket '{target}' has characters the exec provider cannot pass")
                self._bridge = ForwardBridge(lambda: [*self.prefix, self.box_python, "-S", self.runner_path, "forward",
                                                      "--socket", target])
            return self._bridge.path

    def restart_daemon(self) -> None:
        with self._lifecycle:
            self._run_bootstrap({**self._common("stop"), "remove": False})
            self._start()

    def _close_bridge(self) -> None:
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            bridge.close()

    def release(self) -> None:
        """Leave the daemon lingering in the box for a kernel that restarts."""
        self._close_bridge()

    def destroy(self) -> None:
        self._close_bridge()
        with self._lifecycle:
            try:
                self._run_bootstrap({**self._common("stop"), "remove": True})
            except BoxError:
                pass  # an unreachable box cannot be tidied; its daemon leaves after lingering

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "command": shlex.join(self.prefix), "socket": self.socket_path,
                "runner": self.runner_path, "box cwd": self.cwd or "~"}
