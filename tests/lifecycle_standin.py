"""A stand-in for OpenSandbox's lifecycle API, written from its spec (`specs/sandbox-lifecycle.yml` of
alibaba/OpenSandbox), for tests of what OpenSandbox's real server (tests/test_opensandbox_server.py)
cannot be made to do within a test: timeouts under its 60 s minimum, a sandbox deleted behind a
kernel's back, one stuck Pending or ending Failed, the spec's refusals. The provider is still driven
through the real SDK over real HTTP into a real execd.

What it plays:

* **the API** under `/v1`: create (`POST /sandboxes`, 202 Pending), list (`GET /sandboxes` with `state`,
  `metadata`, `page`, `pageSize`), fetch and delete (`/sandboxes/{id}`), `renew-expiration` and
  `endpoints/{port}`. Every request must carry `OPEN-SANDBOX-API-KEY` (401 `MISSING_API_KEY` or
  `INVALID_API_KEY`, as the server's auth middleware answers); bodies and parameters are checked
  against the spec's schemas (400 `INVALID_REQUEST` naming the field); an unknown sandbox is 404; each
  answer has an `X-Request-ID`. The spec's other paths (pause, resume, metadata, snapshots) answer 500
  `NOT_PLAYED`; paths outside it 404. Every request is logged (`requests`) for tests to look at.
* **a sandbox**: a local process in a folder of its own (its HOME and XDG_RUNTIME_DIR) serving the
  project's own execd-compatible endpoint (`ExecdServer`). It is a child subreaper, so deleting it
  finds and ends everything started in it, detached daemons included; it also ends itself when the
  stand-in's process goes (its stdin closes). Pending until its endpoint listens, then Running.
* **its endpoint**: `127.0.0.1:GATEWAY/sandboxes/{id}/port/{port}`, without a scheme (the spec's
  format), with the header `OpenSandbox-Ingress-To: {id}-{port}` (the server's gateway header mode).
  The stand-in's gateway *requires* both, records each request (`gateway_log`), strips the prefix and
  forwards to the sandbox's execd (port 44772; nothing else listens), adding the execd's own token.
* **expiry**: a sandbox whose `expiresAt` passes is deleted (`gone[id] == "ttl_expiry"`); a renewal
  moves `expiresAt` (the spec: in the future, after the current one).
* **images**: the names in `images` can be "pulled"; any other is the 500
  `DOCKER::SANDBOX_IMAGE_PULL_FAILED` that OpenSandbox's Docker runtime answers; an image in `stuck`
  stays Pending, one in `failing` ends Failed with that message.

The spec's minimum `timeout` is 60 s; `min_timeout` lowers it for tests of renewal and expiry, the one
departure from the spec, made only when a test asks. Resource limits are strings in the spec; the
stand-in also refuses a `memory` or `cpu` that OpenSandbox's server could not parse (it would ignore
them), so that a test sees a bad mapping.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlsplit

from owsandbox.box.procstat import descendants, pid_alive

API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
INGRESS_HEADER = "OpenSandbox-Ingress-To"
EXECD_PORT = 44772
IMAGE_PULL_FAILED = "DOCKER::SANDBOX_IMAGE_PULL_FAILED"

# The label rules the server holds metadata to (server/opensandbox_server/services/validators.py).
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_VOLUME_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The formats the server parses (services/helpers.py: parse_memory_limit, parse_nano_cpus).
_MEMORY = re.compile(r"^\s*(\d+)([kmgti]i?|[kmgti]?b)?\s*$", re.IGNORECASE)
_CPU = re.compile(r"^\s*(\d+(\.\d+)?)(m?)\s*$")
_SANDBOX_PATH = re.compile(r"^/v1/sandboxes/([^/]+)(?:/(renew-expiration|endpoints/([^/]+)|pause|resume|metadata|"
                           r"snapshots))?$")
_ROUTE = re.compile(r"^/sandboxes/([^/]+)/port/(\d+)(/.*)?$")
_CREATE_FIELDS = {"image", "snapshotId", "platform", "timeout", "resourceLimits", "env", "metadata", "entrypoint",
                  "networkPolicy", "credentialProxy", "secureAccess", "volumes", "extensions"}

#: The sandbox's process: a child subreaper serving the project's execd-compatible endpoint; it prints
#: its port, and ends everything below it, then itself, when its stdin closes (the stand-in is gone).
BOX_PROGRAM = r"""
import ctypes, json, os, signal, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
from owsandbox.box.execd.endpoint import ExecdServer
from owsandbox.box.procstat import descendants, pid_alive
server = ExecdServer(sys.argv[1], tcp_host="127.0.0.1", cwd=sys.argv[2])
server.start()
print(json.dumps({"port": server.tcp_port}), flush=True)
sys.stdin.buffer.read()
for _ in range(100):
    alive = [pid for pid in descendants(os.getpid()) if pid_alive(pid)]
    if not alive:
        break
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.02)
os._exit(0)
"""


class Refusal(Exception):
    """An answer other than success: the status, and the spec's ErrorResponse (code, message)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


def _bad(message: str) -> Refusal:
    return Refusal(400, "INVALID_REQUEST", message)


def _stamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class Logged:
    """One request as it arrived, and the status it got."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names in lower case
    body: Any = None
    status: int = 0


@dataclass
class StandinSandbox:
    id: str
    request: dict[str, Any]
    created_at: datetime
    expires_at: datetime | None
    folder: Path
    token: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    state: str = "Pending"
    reason: str = "SANDBOX_SCHEDULED"
    message: str = "the sandbox is being provisioned"
    transition_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    process: subprocess.Popen[bytes] | None = None
    execd_port: int = 0
    renewals: list[datetime] = field(default_factory=list)
    memory_bytes: int | None = None
    cpus: float | None = None

    @property
    def image(self) -> str:
        return self.request.get("image", {}).get("uri", "")

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self.request.get("metadata") or {})

    def status(self) -> dict[str, str]:
        return {"state": self.state, "reason": self.reason, "message": self.message,
                "lastTransitionAt": _stamp(self.transition_at)}

    def to_json(self, created: bool = False) -> dict[str, Any]:
        """The spec's `Sandbox`, or with `created` its `CreateSandboxResponse` (no image, no updatedAt)."""
        answer: dict[str, Any] = {"id": self.id, "status": self.status(), "metadata": self.metadata,
                                  "entrypoint": list(self.request.get("entrypoint") or ["tail", "-f", "/dev/null"]),
                                  "createdAt": _stamp(self.created_at)}
        if self.expires_at is not None:
            answer["expiresAt"] = _stamp(self.expires_at)
        if not created:
            answer["image"] = {"uri": self.image}
        return answer

    def processes(self) -> list[int]:
        """The sandbox's process and every live one below it."""
        if self.process is None or not pid_alive(self.process.pid):
            return []
        return [self.process.pid, *(pid for pid in descendants(self.process.pid) if pid_alive(pid))]


class LifecycleStandin:
    """The stand-in server (see the module's docstring); `with LifecycleStandin(...) as server:`."""

    def __init__(self, api_key: str = "standin-key", images: tuple[str, ...] = ("owsandbox/standin-box:1",), *,
                 stuck: tuple[str, ...] = (), failing: dict[str, str] | None = None, min_timeout: int = 60,
                 pending_seconds: float = 0.0) -> None:
        self.api_key = api_key
        self.images = set(images) | set(stuck) | set(failing or {})
        self.stuck = set(stuck)
        self.failing = dict(failing or {})
        self.min_timeout = min_timeout
        self.pending_seconds = pending_seconds
        self.requests: list[Logged] = []
        self.gateway_log: list[Logged] = []
        self.sandboxes: dict[str, StandinSandbox] = {}
        self.gone: dict[str, str] = {}  # id → why: "user_delete" or "ttl_expiry"
        self.ended: dict[str, StandinSandbox] = {}  # the records of the sandboxes that are gone
        self.root = Path(tempfile.mkdtemp(prefix="osl-"))  # short: sockets are made below it
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._http.daemon_threads = True
        self._http.standin = self  # type: ignore[attr-defined]
        self._gateway = _Gateway(self)
        self._threads: list[threading.Thread] = []

    # -- running ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The lifecycle API's base URL without `/v1` (what the SDK calls the domain)."""
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def start(self) -> LifecycleStandin:
        self._gateway.start()
        serve = (lambda: self._http.serve_forever(poll_interval=0.05), "standin-http")  # stop() waits a poll
        for target, name in (serve, (self._expire, "standin-expiry")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._http.shutdown()
        self._http.server_close()
        self._gateway.stop()
        for sandbox_id in list(self.sandboxes):
            self.delete(sandbox_id, "user_delete")
        for thread in self._threads:
            thread.join(5)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LifecycleStandin:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- what tests look at ---------------------------------------------------------------------

    def logged(self, method: str, pattern: str) -> list[Logged]:
        """The requests whose method is `method` and whose path matches `pattern` (a regex, in full)."""
        with self._lock:
            return [r for r in self.requests if r.method == method and re.fullmatch(pattern, r.path)]

    def record(self, sandbox_id: str) -> StandinSandbox:
        """A sandbox's record, whether it still exists or not."""
        with self._lock:
            return self.sandboxes.get(sandbox_id) or self.ended[sandbox_id]

    def only_sandbox(self) -> StandinSandbox:
        with self._lock:
            made = list(self.sandboxes.values()) + list(self.ended.values())
        assert len(made) == 1, f"expected one sandbox, the stand-in made {[s.id for s in made]}"
        return made[0]

    # -- sandboxes ------------------------------------------------------------------------------

    def create(self, request: dict[str, Any]) -> StandinSandbox:
        image = request.get("image", {}).get("uri", "")
        if image not in self.images:
            raise Refusal(500, IMAGE_PULL_FAILED, f"Failed to pull image {image}: 404 Client Error: Not Found "
                                                  f"(\"pull access denied for {image}, repository does not exist\")")
        now = datetime.now(timezone.utc)
        timeout = request.get("timeout")
        sandbox_id = str(uuid.uuid4())
        folder = self.root / sandbox_id[:8]
        (folder / "run").mkdir(mode=0o700, parents=True)
        sandbox = StandinSandbox(id=sandbox_id, request=request, created_at=now, folder=folder,
                                 expires_at=None if timeout is None else now + timedelta(seconds=timeout))
        limits = request.get("resourceLimits") or {}
        sandbox.memory_bytes = _memory_bytes(limits["memory"]) if "memory" in limits else None
        sandbox.cpus = _cpus(limits["cpu"]) if "cpu" in limits else None
        with self._lock:
            self.sandboxes[sandbox_id] = sandbox
        if image not in self.stuck:
            threading.Thread(target=self._provision, args=(sandbox,), name="standin-provision", daemon=True).start()
        return sandbox

    def _provision(self, sandbox: StandinSandbox) -> None:
        """Pending → Running once the sandbox's execd listens (or Failed, saying why)."""
        if self._stopping.wait(self.pending_seconds) or sandbox.image in self.failing:
            self._transition(sandbox, "Failed", "PROVISIONING_ERROR", self.failing.get(sandbox.image, "stopped"))
            return
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(sandbox.folder), "LANG": "C.UTF-8",
               "XDG_RUNTIME_DIR": str(sandbox.folder / "run"), **(sandbox.request.get("env") or {})}
        with open(sandbox.folder / "box.log", "wb") as log:
            process = subprocess.Popen([sys.executable, "-c", BOX_PROGRAM, sandbox.token, str(sandbox.folder)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                                       cwd=sandbox.folder, start_new_session=True)
        with self._lock:
            sandbox.process = process
            deleted = sandbox.id not in self.sandboxes
        if deleted:  # deleted while it was starting
            self._end(sandbox)
            return
        assert process.stdout is not None
        line = process.stdout.readline()
        try:
            sandbox.execd_port = int(json.loads(line)["port"])
        except (ValueError, KeyError):
            log_text = (sandbox.folder / "box.log").read_text(errors="replace")[-1000:]
            self._transition(sandbox, "Failed", "PROVISIONING_ERROR", f"the box did not start: {log_text}")
            return
        self._transition(sandbox, "Running", "SANDBOX_RUNNING", "the sandbox is running")

    def _transition(self, sandbox: StandinSandbox, state: str, reason: str, message: str) -> None:
        with self._lock:
            if sandbox.id in self.sandboxes:
                sandbox.state, sandbox.reason, sandbox.message = state, reason, message
                sandbox.transition_at = datetime.now(timezone.utc)

    def delete(self, sandbox_id: str, why: str) -> None:
        """End the sandbox and everything started in it; its record moves to `ended`."""
        with self._lock:
            sandbox = self.sandboxes.pop(sandbox_id, None)
            if sandbox is None:
                return
            sandbox.state, sandbox.reason = "Terminated", why
            self.gone[sandbox_id] = why
            self.ended[sandbox_id] = sandbox
        self._end(sandbox)

    def _end(self, sandbox: StandinSandbox) -> None:
        """Close the box's stdin: it ends everything below it (a subreaper, its orphans too), then itself."""
        process = sandbox.process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stdout is not None:
            process.stdout.close()

    def _expire(self) -> None:
        while not self._stopping.wait(0.05):
            now = datetime.now(timezone.utc)
            with self._lock:
                due = [s.id for s in self.sandboxes.values() if s.expires_at is not None and s.expires_at <= now]
            for sandbox_id in due:
                self.delete(sandbox_id, "ttl_expiry")

    def sandbox(self, sandbox_id: str) -> StandinSandbox:
        with self._lock:
            found = self.sandboxes.get(sandbox_id)
        if found is None:
            raise Refusal(404, "SANDBOX_NOT_FOUND", f"Sandbox {sandbox_id} not found")
        return found

    # -- the API ----------------------------------------------------------------------------------

    def answer(self, request: Logged) -> tuple[int, Any]:
        """(status, JSON body or None) for a request that passed the API key check."""
        path, method = request.path, request.method
        if path == "/v1/sandboxes":
            if method == "POST":
                check_create(request.body, self.min_timeout)
                return 202, self.create(request.body).to_json(created=True)
            if method == "GET":
                return 200, self._list(request.query)
            raise Refusal(405, "METHOD_NOT_ALLOWED", f"{method} is not allowed on {path}")
        if path == "/v1/snapshots" or path.startswith("/v1/snapshots/"):
            raise Refusal(500, "NOT_PLAYED", "the stand-in does not play snapshots")
        match = _SANDBOX_PATH.fullmatch(path)
        if match is None:
            raise Refusal(404, "NOT_FOUND", f"no such path: {path}")
        sandbox_id, action, port = match.groups()
        if action is None and method == "GET":
            return 200, self.sandbox(sandbox_id).to_json()
        if action is None and method == "DELETE":
            self.sandbox(sandbox_id)
            self.delete(sandbox_id, "user_delete")
            return 204, None
        if action == "renew-expiration" and method == "POST":
            return 200, self._renew(self.sandbox(sandbox_id), request.body)
        if port is not None and method == "GET":
            return 200, self._endpoint(sandbox_id, port, request.query)
        if action in ("pause", "resume", "metadata", "snapshots"):
            raise Refusal(500, "NOT_PLAYED", f"the stand-in does not play {action}")
        raise Refusal(405, "METHOD_NOT_ALLOWED", f"{method} is not allowed on {path}")

    def _list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        unknown = set(query) - {"state", "metadata", "page", "pageSize"}
        if unknown:
            raise _bad(f"unknown query parameters: {', '.join(sorted(unknown))}")
        page, size = _positive(query, "page", 1), _positive(query, "pageSize", 20)
        states = {state.lower() for state in query.get("state", [])}
        wanted: dict[str, str] = {}
        for text in query.get("metadata", []):
            wanted.update(parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text)))
        with self._lock:
            found = [s for s in self.sandboxes.values()
                     if (not states or s.state.lower() in states)
                     and all(s.metadata.get(k) == v for k, v in wanted.items())]
        found.sort(key=lambda s: s.created_at)
        pages = math.ceil(len(found) / size)
        items = [s.to_json() for s in found[(page - 1) * size:page * size]]
        return {"items": items, "pagination": {"page": page, "pageSize": size, "totalItems": len(found),
                                               "totalPages": pages, "hasNextPage": page < pages}}

    def _renew(self, sandbox: StandinSandbox, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or set(body) != {"expiresAt"}:
            raise _bad("the body must be an object with expiresAt only (RenewSandboxExpirationRequest)")
        moment = _datetime(body["expiresAt"], "expiresAt")
        now = datetime.now(timezone.utc)
        if moment <= now:
            raise Refusal(400, "INVALID_EXPIRATION", "New expiration time must be in the future.")
        with self._lock:
            if sandbox.expires_at is None:
                raise Refusal(409, "INVALID_EXPIRATION",
                              f"Sandbox {sandbox.id} does not have automatic expiration enabled.")
            if moment <= sandbox.expires_at:
                raise Refusal(400, "INVALID_EXPIRATION", "New expiration time must be after the current one.")
            sandbox.expires_at = moment
            sandbox.renewals.append(now)
        return {"expiresAt": _stamp(moment)}

    def _endpoint(self, sandbox_id: str, port_text: str, query: dict[str, list[str]]) -> dict[str, Any]:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise _bad(f"port must be an integer from 1 to 65535, not {port_text!r}")
        unknown = set(query) - {"use_server_proxy", "expires"}
        if unknown:
            raise _bad(f"unknown query parameters: {', '.join(sorted(unknown))}")
        proxy = query.get("use_server_proxy", ["false"])[-1]
        if proxy not in ("true", "false"):
            raise _bad(f"use_server_proxy must be a boolean, not {proxy!r}")
        if proxy == "true" or "expires" in query:
            raise Refusal(500, "NOT_PLAYED", "the stand-in plays the gateway's header route only")
        self.sandbox(sandbox_id)
        port = int(port_text)
        return {"endpoint": f"127.0.0.1:{self._gateway.port}/sandboxes/{sandbox_id}/port/{port}",
                "headers": {INGRESS_HEADER: f"{sandbox_id}-{port}"}}


# -- checking requests against the spec's schemas ------------------------------------------------------

def _string_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise _bad(f"{where} must be an object of string values")
    return value


def _only(value: Any, where: str, allowed: set[str], required: set[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{where} must be an object")
    extra, missing = set(value) - allowed, required - set(value)
    if extra:
        raise _bad(f"{where} has unknown fields: {', '.join(sorted(extra))}")
    if missing:
        raise _bad(f"{where} lacks {', '.join(sorted(missing))}")
    return value


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_LABEL_NAME.match(name))


def check_create(body: Any, min_timeout: int = 60) -> None:
    """A CreateSandboxRequest as the spec has it (standard mode: the stand-in has no pools), else a 400."""
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object (CreateSandboxRequest)")
    if isinstance(body.get("extensions"), dict) and body["extensions"].get("poolRef"):
        raise _bad("poolRef is not supported here (no pools)")
    if ("image" in body) == ("snapshotId" in body):
        raise _bad("exactly one of image and snapshotId must be given")
    if "snapshotId" in body:
        raise Refusal(404, "SNAPSHOT_NOT_FOUND", f"Snapshot {body['snapshotId']!r} not found")
    image = _only(body["image"], "image", {"uri", "auth"}, {"uri"})
    if not isinstance(image["uri"], str) or not image["uri"]:
        raise _bad("image.uri must be a non-empty string")
    if "auth" in image:
        auth = _only(image["auth"], "image.auth", {"username", "password"})
        _string_map(auth, "image.auth")
    entrypoint = body.get("entrypoint")
    if not isinstance(entrypoint, list) or not entrypoint or not all(isinstance(a, str) for a in entrypoint):
        raise _bad("entrypoint is required with image: a non-empty array of strings")
    if "timeout" in body and body["timeout"] is not None:
        timeout = body["timeout"]
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < min_timeout:
            raise _bad(f"timeout must be an integer of at least {min_timeout} (seconds) or null, not {timeout!r}")
    if "resourceLimits" not in body:
        raise _bad("resourceLimits is required (standard mode)")
    limits = _string_map(body["resourceLimits"], "resourceLimits")
    if "memory" in limits:
        _memory_bytes(limits["memory"])
    if "cpu" in limits:
        _cpus(limits["cpu"])
    for name in ("env", "extensions"):
        if name in body:
            _string_map(body[name], name)
    for key, value in _string_map(body.get("metadata", {}), "metadata").items():
        if key.startswith("opensandbox.io/") or not _label_key_ok(key):
            raise _bad(f"metadata key {key!r} is not a valid label key (or uses the reserved prefix)")
        if len(value) > 63 or (value and not _LABEL_NAME.match(value)):
            raise _bad(f"metadata value {value!r} is not a valid label value")
    if "platform" in body:
        platform = _only(body["platform"], "platform", {"os", "arch"}, {"os", "arch"})
        if platform["os"] not in ("linux", "windows") or platform["arch"] not in ("amd64", "arm64"):
            raise _bad("platform.os must be linux or windows, platform.arch amd64 or arm64")
    if "secureAccess" in body and not isinstance(body["secureAccess"], bool):
        raise _bad("secureAccess must be a boolean")
    if "networkPolicy" in body and body["networkPolicy"] is not None:
        policy = _only(body["networkPolicy"], "networkPolicy", {"defaultAction", "egress"})
        if policy.get("defaultAction", "deny") not in ("allow", "deny") or not isinstance(policy.get("egress", []),
                                                                                          list):
            raise _bad("networkPolicy.defaultAction must be allow or deny, networkPolicy.egress an array")
        for rule in policy.get("egress", []):
            rule = _only(rule, "networkPolicy.egress[]", {"action", "target"}, {"action", "target"})
            if rule["action"] not in ("allow", "deny") or not isinstance(rule["target"], str):
                raise _bad("an egress rule is {action: allow|deny, target: string}")
    if "credentialProxy" in body:
        proxy = _only(body["credentialProxy"], "credentialProxy", {"enabled"})
        if not isinstance(proxy.get("enabled", False), bool):
            raise _bad("credentialProxy.enabled must be a boolean")
    if "volumes" in body:
        if not isinstance(body["volumes"], list):
            raise _bad("volumes must be an array")
        for volume in body["volumes"]:
            if not isinstance(volume, dict) or not isinstance(volume.get("name"), str) \
                    or not _VOLUME_NAME.match(volume["name"]) or not str(volume.get("mountPath", "")).startswith("/"):
                raise _bad("a volume needs a DNS-label name and an absolute mountPath")


def _memory_bytes(text: str) -> int:
    match = _MEMORY.match(text)
    units = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "ki": 1 << 10, "m": 10**6, "mb": 10**6, "mi": 1 << 20,
             "g": 10**9, "gb": 10**9, "gi": 1 << 30, "t": 10**12, "tb": 10**12, "ti": 1 << 40}
    if match is None or (match.group(2) or "").lower() not in units:
        raise _bad(f"resourceLimits.memory {text!r} is not a size such as 512Mi or 2Gi")
    return int(match.group(1)) * units[(match.group(2) or "").lower()]


def _cpus(text: str) -> float:
    match = _CPU.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise _bad(f"resourceLimits.cpu {text!r} is not a CPU amount such as 500m or 2")
    return float(match.group(1)) / (1000 if match.group(3) else 1)


def _positive(query: dict[str, list[str]], name: str, default: int) -> int:
    text = query.get(name, [str(default)])[-1]
    if not text.isdigit() or int(text) < 1:
        raise _bad(f"{name} must be an integer of at least 1, not {text!r}")
    return int(text)


def _datetime(text: Any, where: str) -> datetime:
    if not isinstance(text, str):
        raise _bad(f"{where} must be an RFC 3339 date-time string")
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise _bad(f"{where} {text!r} is not an RFC 3339 date-time") from None
    if moment.tzinfo is None:
        raise _bad(f"{where} {text!r} has no time zone (RFC 3339 requires one)")
    return moment


# -- HTTP ----------------------------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    server_version = "OpenSandboxStandin/1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # the requests are logged as data (LifecycleStandin.requests)

    def _handle(self) -> None:
        standin: LifecycleStandin = self.server.standin  # type: ignore[attr-defined]
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        logged = Logged(self.command, parts.path, parse_qs(parts.query, keep_blank_values=True),
                        {k.lower(): v for k, v in self.headers.items()})
        with standin._lock:
            standin.requests.append(logged)
        try:
            if raw:
                try:
                    logged.body = json.loads(raw)
                except ValueError:
                    raise _bad("the body is not JSON") from None
            key = self.headers.get(API_KEY_HEADER)
            if not key:
                raise Refusal(401, "MISSING_API_KEY", "Authentication credentials are missing. "
                                                      f"Provide API key via {API_KEY_HEADER} header.")
            if key != standin.api_key:
                raise Refusal(401, "INVALID_API_KEY", "Authentication credentials are invalid. "
                                                      "Check your API key and try again.")
            status, body = standin.answer(logged)
        except Refusal as refusal:
            status, body = refusal.status, {"code": refusal.code, "message": refusal.message}
        except Exception as exc:  # noqa: BLE001 - a fault of the stand-in's own: say so, loudly
            status, body = 500, {"code": "STANDIN_FAULT", "message": f"{type(exc).__name__}: {exc}"}
        logged.status = status
        payload = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("X-Request-ID", str(uuid.uuid4()))
        if status != 204:
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if status != 204:
            self.wfile.write(payload)

    do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _handle


class _Gateway:
    """The ingress gateway in header mode: `/sandboxes/{id}/port/{port}/...` plus `OpenSandbox-Ingress-To`
    reach the sandbox's execd; every request it sees is logged, refused ones too."""

    def __init__(self, standin: LifecycleStandin) -> None:
        self.standin = standin
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="standin-gateway", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self._thread.join(5)
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="standin-route", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        with self._lock:
            self._sockets.add(client)
        try:
            client.settimeout(10)
            head, rest = _read_head(client)
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
            headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if ":" in line]
            named = {name.lower(): value for name, value in headers}
            parts = urlsplit(target)
            logged = Logged(method, parts.path, parse_qs(parts.query), named)
            with self.standin._lock:
                self.standin.gateway_log.append(logged)
            route = _ROUTE.fullmatch(parts.path)
            refusal = self._refusal(route, named.get(INGRESS_HEADER.lower()))
            if refusal is not None:
                logged.status = refusal.status
                body = json.dumps({"code": refusal.code, "message": refusal.message}).encode()
                client.sendall(f"HTTP/1.1 {refusal.status} Refused\r\nContent-Type: application/json\r\n"
                               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
                return
            assert route is not None
            sandbox = self.standin.sandbox(route.group(1))
            logged.status = 200
            path = (route.group(3) or "/") + (f"?{parts.query}" if parts.query else "")
            kept = [f"{name}: {value}" for name, value in headers
                    if name.lower() not in (INGRESS_HEADER.lower(), "x-execd-access-token")]
            forwarded = "\r\n".join([f"{method} {path} {version}", *kept,
                                     f"X-EXECD-ACCESS-TOKEN: {sandbox.token}", "", ""]).encode("latin-1")
            upstream = socket.create_connection(("127.0.0.1", sandbox.execd_port), timeout=10)
            with self._lock:
                self._sockets.add(upstream)
            client.settimeout(None)
            upstream.settimeout(None)
            upstream.sendall(forwarded + rest)
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()
        except (OSError, ValueError, Refusal):
            pass
        finally:
            with self._lock:
                self._sockets.discard(client)
                if upstream is not None:
                    self._sockets.discard(upstream)
            client.close()
            if upstream is not None:
                upstream.close()

    def _refusal(self, route: re.Match[str] | None, routed_to: str | None) -> Refusal | None:
        if route is None:
            return Refusal(404, "ROUTE_NOT_FOUND", "no route: the path must start /sandboxes/{id}/port/{port}")
        sandbox_id, port = route.group(1), int(route.group(2))
        if routed_to != f"{sandbox_id}-{port}":
            return Refusal(404, "ROUTE_NOT_FOUND", f"the {INGRESS_HEADER} header must be {sandbox_id}-{port}, "
                                                   f"not {routed_to!r}")
        try:
            sandbox = self.standin.sandbox(sandbox_id)
        except Refusal as refusal:
            return refusal
        if port != EXECD_PORT or sandbox.state != "Running":
            return Refusal(502, "UPSTREAM_UNAVAILABLE", f"nothing listens on port {port} of sandbox {sandbox_id} "
                                                        f"({sandbox.state})")
        return None


def _read_head(sock: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk or len(data) > 1 << 16:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until `source` ends, then end `sink`'s writing side."""
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass
