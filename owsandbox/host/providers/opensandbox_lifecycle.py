"""The `opensandbox` provider with a sandbox of the kernel's own: created through OpenSandbox's lifecycle
API when the kernel starts, renewed while it lives, deleted when it shuts down.

The plain `opensandbox` provider runs in a sandbox that someone made; a notebook user who only has a
server and an image wants what the `container` provider gives, a fresh box per kernel that goes away
with it. The lifecycle API is spoken through OpenSandbox's official Python SDK (an optional extra,
`pip install 'owsandbox[opensandbox]'`, imported only here and only when needed), so its requests are
the ones OpenSandbox itself maintains. Once the sandbox runs, everything else is the execd path of
`OpenSandboxProvider`.

* **Settings**: `OWSANDBOX_OPENSANDBOX_SERVER` (the lifecycle API's base URL, `http://host:8080`, with
  or without `/v1`; no scheme means http), `OWSANDBOX_OPENSANDBOX_API_KEY` (sent as
  `OPEN-SANDBOX-API-KEY`; the SDK's own `OPEN_SANDBOX_API_KEY` also works), `OWSANDBOX_IMAGE` (it must
  have bash, python3 and `tail`), `OWSANDBOX_LIMITS` as for the other providers,
  `OWSANDBOX_OPENSANDBOX_TIMEOUT` (the sandbox's lifetime without renewal, 600 s; the API's least is
  60) and `OWSANDBOX_OPENSANDBOX_READY_TIMEOUT` (how long it may take to become Running, 120 s).
  `OWSANDBOX_OPENSANDBOX_SERVER_PROXY=1` asks for execd's endpoint through the server's own proxy
  (`use_server_proxy`: `server/sandboxes/{id}/proxy/44772`, HTTP and WebSocket), for a kernel that
  reaches the server but not the sandboxes.
* **Create** (`POST /sandboxes`): the image, the entrypoint `tail -f /dev/null`, the timeout, resource
  limits from the kernel's limits (memory in Mi; cpu in millicores when one is set) and metadata labels
  `owsandbox.key` (the kernel's key) and `owsandbox.spec` (a digest of the settings). The API has no
  process limit (OpenSandbox's Docker runtime applies its own `pids_limit`; a Kubernetes one would
  refuse an unknown resource name), so `pids` is not sent, and `%sandbox` says the server sets it.
* **Ready**: the SDK returns once the server has accepted the sandbox and published its endpoints. Its
  health check (execd's `/ping`) is skipped: the provider waits for the state `Running` instead, which
  names the reason when the sandbox fails, then for execd to answer at all (a Running sandbox's execd
  may not listen yet), and the first pipe session to execd proves the rest.
* **execd**: `GET /sandboxes/{id}/endpoints/44772` answers `host[:port][/path]` without a scheme and
  the headers that route to it (`OpenSandbox-Ingress-To`, ...); the server's scheme is used, and every
  request to execd carries those headers.
* **Renewal**: a thread sets the expiry to now + the timeout every third of it (sooner again after a
  failure); a sandbox found gone (404) is reported by the next connection instead of a vague failure.
* **Restart and shutdown**: `release()` stops renewing and leaves the sandbox, with its daemon
  lingering; a provider with the same key finds it by its labels among the Running ones and reuses it
  when it was made with the same settings (one made otherwise is deleted, and a new one made).
  `destroy()` deletes it (`DELETE /sandboxes/{id}`). A kernel killed for good leaves it to its timeout.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from ... import settings
from ...channel.control import ExecdControl
from ...channel.endpoint import ExecdEndpoint
from ...channel.errors import ExecdHTTPError, ExecdUnreachable
from ...settings import Settings, settings_of
from ..isolation.resources import LimitReport, Limits, human_size
from .boxed import BoxError
from .container import IMAGE_ENV
from .opensandbox import OpenSandboxProvider

log = logging.getLogger(__name__)

SERVER_ENV = settings.OPENSANDBOX_SERVER
API_KEY_ENV = settings.OPENSANDBOX_API_KEY
SDK_KEY_ENV = "OPEN_SANDBOX_API_KEY"  # the SDK's own, used when ours is not set
TIMEOUT_ENV = settings.OPENSANDBOX_TIMEOUT
READY_ENV = settings.OPENSANDBOX_READY_TIMEOUT
EXECD_PORT = 44772  # where OpenSandbox's execd listens in every sandbox
KEY_LABEL = "owsandbox.key"
SPEC_LABEL = "owsandbox.spec"
ENTRYPOINT = ["tail", "-f", "/dev/null"]  # the sandbox's first process; the runner comes in through execd
INSTALL_HINT = "pip install 'owsandbox[opensandbox]'"
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_ENDED = ("failed", "terminated", "stopping")


def _sdk() -> Any:
    """The OpenSandbox SDK's module for synchronous use, or a BoxError saying how to install it."""
    try:
        import opensandbox.sync  # noqa: F401 - what follows needs the whole package
        from opensandbox import exceptions, models
        from opensandbox.config import connection_sync
    except ImportError as exc:
        raise BoxError(f"creating OpenSandbox sandboxes needs the OpenSandbox SDK, which is not installed here "
                       f"({exc}): {INSTALL_HINT}") from None
    return _Sdk(opensandbox.sync, exceptions, models.sandboxes, connection_sync.ConnectionConfigSync)


class _Sdk:
    """The parts of the SDK this module uses, found once."""

    def __init__(self, sync: Any, exceptions: Any, models: Any, config: Any) -> None:
        self.SandboxSync, self.SandboxManagerSync = sync.SandboxSync, sync.SandboxManagerSync
        self.ApiError, self.SdkError = exceptions.SandboxApiException, exceptions.SandboxException
        self.ConnectionError = exceptions.SandboxConnectionException
        self.TimeoutError = exceptions.SandboxTimeoutException
        self.ReadyTimeout = getattr(exceptions, "SandboxReadyTimeoutException", None)
        self.SandboxFilter = models.SandboxFilter
        self.ConnectionConfig = config


def server_url(text: str) -> str:
    """The lifecycle API's base URL as the SDK takes it: with a scheme (http if none), without `/v1`."""
    url = text.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if not re.match(r"^https?://[^/\s]+(/\S*)?$", url):
        raise ValueError(f"{SERVER_ENV}={text!r} is not a URL such as http://opensandbox.example:8080")
    return url[:-3] if url.endswith("/v1") else url


def label_value(key: str) -> str:
    """A metadata label value for `key`: the key itself when it is a valid one (the server holds metadata to
    Kubernetes' label rules), else a digest of it."""
    if len(key) <= 63 and _LABEL_VALUE.match(key):
        return key
    return "h-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def resource_limits(limits: Limits) -> dict[str, str]:
    """The lifecycle API's `resourceLimits` for the kernel's limits: memory, and cpu when one is set."""
    memory = limits.memory
    if memory % (1 << 20) == 0:
        amount = f"{memory >> 20}Mi"
    elif memory % 1024 == 0:
        amount = f"{memory >> 10}Ki"
    else:
        amount = str(memory)
    found = {"memory": amount}
    if limits.cpu is not None:
        found["cpu"] = f"{max(1, round(limits.cpu * 1000))}m"
    return found


def _seconds(given: float | None, env: str, default: float, least: float) -> float:
    value = default if given is None else float(given)
    if value < least:
        raise ValueError(f"{env}={value:g} is under {least:g} seconds")
    return value


class OpenSandboxLifecycleProvider(OpenSandboxProvider):
    """An OpenSandbox sandbox per kernel, made and deleted through the lifecycle API (see the module)."""

    def __init__(self, cwd: str | os.PathLike[str] | None = None, server: str | None = None,
                 api_key: str | None = None, image: str | None = None, limits: Limits | list[str] | str | None = None,
                 key: str | None = None, *, sandbox_timeout: float | None = None, ready_timeout: float | None = None,
                 server_proxy: bool | None = None, python: str = "python3", linger_seconds: float = 300.0,
                 box_cwd: str | None = None, relay_silence_seconds: float = 60.0, runtime_dir: str | None = None,
                 timeout: float = 60.0, settings: Settings | None = None) -> None:
        settings = settings_of(settings)
        super().__init__(cwd, python=python, key=key, linger_seconds=linger_seconds, box_cwd=box_cwd,
                         relay_silence_seconds=relay_silence_seconds, runtime_dir=runtime_dir, timeout=timeout,
                         settings=settings)
        server = server if server is not None else settings.opensandbox_server
        if not server.strip():
            raise ValueError(f"the opensandbox provider needs {SERVER_ENV} to create sandboxes")
        self.server = server_url(server)
        self.api_key = api_key if api_key is not None else settings.opensandbox_api_key
        self.image = (image or settings.image).strip()
        if not self.image:
            raise ValueError(f"the opensandbox provider needs an image to create a sandbox from: set {IMAGE_ENV}")
        self.limits = limits if isinstance(limits, Limits) else Limits.parse(
            limits if limits is not None else list(settings.limits))
        # A timeout under the API's 60 s minimum goes to the server anyway, which names the rule.
        self.sandbox_timeout = _seconds(sandbox_timeout if sandbox_timeout is not None
                                        else settings.opensandbox_timeout, TIMEOUT_ENV, 600.0, 1.0)
        self.ready_timeout = _seconds(ready_timeout if ready_timeout is not None
                                      else settings.opensandbox_ready_timeout, READY_ENV, 120.0, 0.1)
        self.server_proxy = server_proxy if server_proxy is not None else settings.opensandbox_server_proxy
        self.sandbox_id = ""
        self.expires_at: datetime | None = None
        self.created_now = False  # this provider made the sandbox (rather than finding it)
        self.renewals = 0
        self.create_seconds: float | None = None  # from asking the server to a sandbox Running
        self.delete_seconds: float | None = None  # how long the DELETE took (destroy)
        self.lost: str | None = None  # why the sandbox is gone, once a renewal found it gone
        self._sdk: _Sdk | None = None
        self._sandbox: Any = None  # the SDK's SandboxSync
        self._renew_stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _endpoint_at_start(self, url: str | None, headers: Mapping[str, str] | None,
                           given: Settings) -> ExecdEndpoint | None:
        return None  # known once the sandbox runs (create)

    # -- the lifecycle API ----------------------------------------------------------------------

    def _config(self) -> Any:
        assert self._sdk is not None
        return self._sdk.ConnectionConfig(domain=self.server, api_key=self.api_key or None,
                                          protocol=self.server.split("://", 1)[0],
                                          request_timeout=timedelta(seconds=30), disable_metrics=True,
                                          use_server_proxy=self.server_proxy)

    def spec(self) -> str:
        """A digest of the settings a sandbox is made with: one made otherwise is not reused."""
        made_with = [self.image, resource_limits(self.limits), self.python, ENTRYPOINT]
        return hashlib.sha256(json.dumps(made_with).encode()).hexdigest()[:16]

    def _metadata(self) -> dict[str, str]:
        return {KEY_LABEL: label_value(self.key), SPEC_LABEL: self.spec()}

    def _failure(self, exc: BaseException, doing: str) -> BoxError:
        """A BoxError that says what went wrong with the server, in words a user can act on."""
        sdk = self._sdk
        where = f"the OpenSandbox server at {self.server}"
        if sdk is None or not isinstance(exc, sdk.SdkError):
            return BoxError(f"{where} could not {doing}: {exc}")
        if isinstance(exc, sdk.ApiError) and exc.status_code is not None:
            error = exc.error
            said = f"{exc.status_code} {error.code}: {error.message}" if error and error.message \
                else f"{exc.status_code}: {exc}"
            if exc.status_code in (401, 403):
                key = (f"the API key from {API_KEY_ENV}" if self.api_key
                       else f"the API key from {SDK_KEY_ENV}" if os.environ.get(SDK_KEY_ENV)
                       else f"no API key ({API_KEY_ENV} is not set)")
                return BoxError(f"{where} refused {key} when asked to {doing} ({said}): set {API_KEY_ENV} to a key "
                                "the server accepts")
            if "IMAGE" in str(error.code).upper() or "image" in str(error.message).lower():
                return BoxError(f"{where} could not {doing} from the image {self.image} ({said}): is {IMAGE_ENV} "
                                "an image the server can pull?")
            if exc.status_code == 404 and doing in ("create a sandbox", "list its sandboxes"):
                return BoxError(f"{where} has no lifecycle API at {self.server}/v1 ({said}): check {SERVER_ENV}")
            return BoxError(f"{where} could not {doing} ({said})")
        if sdk.ReadyTimeout is not None and isinstance(exc, sdk.ReadyTimeout):  # the SDK's own wait, as long as ours
            told = getattr(exc.error, "message", None) or str(exc)  # str() says it twice
            return BoxError(f"the OpenSandbox sandbox of the image {self.image} on {self.server} did not become ready "
                            f"within {self.ready_timeout:g} s ({told}); {READY_ENV} gives it longer")
        cause = exc.__cause__ or exc
        if isinstance(exc, sdk.ConnectionError):
            return BoxError(f"cannot reach {where} to {doing}: {cause}; is the server running, and is "
                            f"{SERVER_ENV} right?")
        if isinstance(exc, sdk.TimeoutError):
            return BoxError(f"{where} did not answer when asked to {doing}: {cause}")
        return BoxError(f"{where} could not {doing}: {exc}")

    def _find(self) -> Any:
        """The Running sandbox an earlier kernel with this key left, connected; None when there is none.
        Its namesakes made with other settings are deleted."""
        assert self._sdk is not None
        manager = self._sdk.SandboxManagerSync.create(self._config())
        try:
            try:
                found = manager.list_sandbox_infos(self._sdk.SandboxFilter(
                    metadata={KEY_LABEL: label_value(self.key)}, states=["Running"])).sandbox_infos
            except self._sdk.SdkError as exc:
                raise self._failure(exc, "list its sandboxes") from None
            ours = sorted((info for info in found if info.metadata.get(SPEC_LABEL) == self.spec()),
                          key=lambda info: info.created_at)
            for info in found:
                if not ours or info.id != ours[-1].id:
                    log.warning("deleting the OpenSandbox sandbox %s of an earlier kernel with this key: %s", info.id,
                                "made with other settings" if info.metadata.get(SPEC_LABEL) != self.spec()
                                else "a newer one is reused")
                    try:
                        manager.kill_sandbox(info.id)
                    except self._sdk.SdkError as exc:
                        log.warning("could not delete the OpenSandbox sandbox %s: %s", info.id, exc)
        finally:
            manager.close()
        if not ours:
            return None
        try:
            return self._sdk.SandboxSync.connect(ours[-1].id, connection_config=self._config(), skip_health_check=True,
                                                 connect_timeout=timedelta(seconds=self.ready_timeout))
        except self._sdk.SdkError as exc:
            raise self._failure(exc, f"connect to the sandbox {ours[-1].id}") from None

    def _make(self) -> Any:
        assert self._sdk is not None
        try:
            return self._sdk.SandboxSync.create(
                self.image, timeout=timedelta(seconds=self.sandbox_timeout), entrypoint=ENTRYPOINT,
                resource=resource_limits(self.limits), metadata=self._metadata(), connection_config=self._config(),
                ready_timeout=timedelta(seconds=self.ready_timeout), skip_health_check=True)
        except self._sdk.SdkError as exc:
            raise self._failure(exc, "create a sandbox") from None

    def _wait_running(self, deadline: float) -> None:
        """Until the sandbox is Running; BoxError when it failed or did not make it in time."""
        assert self._sdk is not None
        pause = 0.05
        while True:
            try:
                info = self._sandbox.get_info()
            except self._sdk.SdkError as exc:
                raise self._failure(exc, f"tell the state of the sandbox {self.sandbox_id}") from None
            state, status = info.status.state, info.status
            self.expires_at = info.expires_at
            if state.lower() == "running":
                return
            said = f"{state}" + (f" ({status.reason}: {status.message})" if status.reason or status.message else "")
            if state.lower() in _ENDED:
                raise BoxError(f"the OpenSandbox sandbox {self.sandbox_id} of the image {self.image} on {self.server} "
                               f"did not start: it is {said}")
            if time.monotonic() >= deadline:
                raise BoxError(f"the OpenSandbox sandbox {self.sandbox_id} of the image {self.image} on {self.server} "
                               f"did not become Running within {self.ready_timeout:g} s: it is still {said}; "
                               f"{READY_ENV} gives it longer")
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 1.5, 1.0)

    def _wait_for_execd(self, deadline: float) -> None:
        """Until the sandbox's execd answers. A sandbox is Running once its first process runs, and the
        execd that process starts may listen a moment later. Any HTTP answer will do (a session that does
        not exist is a 404); a refused connection, or a proxy's 502, 503 or 504 for one, is tried again
        until the ready deadline, after which the bootstrap's own connection names what failed."""
        control = ExecdControl(self.execd, timeout=5)
        pause = 0.02
        while True:
            try:
                control.status("owsandbox-readiness")
                return
            except ExecdHTTPError as exc:
                if exc.status not in (502, 503, 504):
                    return
            except ExecdUnreachable:
                pass
            if time.monotonic() >= deadline:
                return
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 1.5, 0.5)

    def _execd_from(self, endpoint: Any) -> ExecdEndpoint:
        """The execd endpoint from the API's answer: `host[:port][/path]` in the server's scheme, its headers."""
        address = endpoint.endpoint
        if "://" not in address:
            address = f"{self.server.split('://', 1)[0]}://{address}"
        return ExecdEndpoint(origin=address, headers=dict(endpoint.headers or {}))

    # -- renewal ----------------------------------------------------------------------------------

    def _renew(self) -> None:
        answer = self._sandbox.renew(timedelta(seconds=self.sandbox_timeout))
        self.expires_at = answer.expires_at
        self.renewals += 1

    def _start_renewing(self) -> None:
        stop = self._renew_stop = threading.Event()
        every = self.sandbox_timeout / 3

        def renew() -> None:
            wait = every
            while not stop.wait(wait):
                try:
                    self._renew()
                    wait = every
                except Exception as exc:  # noqa: BLE001 - whatever failed, the sandbox must not expire unsaid
                    sdk = self._sdk
                    if sdk is not None and isinstance(exc, sdk.ApiError) and exc.status_code == 404:
                        self.lost = (f"the OpenSandbox sandbox {self.sandbox_id} on {self.server} is gone (deleted, or "
                                     f"expired at {self._expiry()}): a new kernel makes a new one")
                        log.error("%s", self.lost)
                        return
                    wait = max(0.2, every / 4)
                    log.warning("renewing the OpenSandbox sandbox %s failed (%s); trying again in %.1f s",
                                self.sandbox_id, self._failure(exc, "renew it"), wait)

        self._renewer = threading.Thread(target=renew, name="opensandbox-renew", daemon=True)
        self._renewer.start()

    def _stop_renewing(self) -> None:
        thread, self._renewer = self._renewer, None
        self._renew_stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(35)  # a renewal under way ends within the SDK's request timeout

    def _expiry(self) -> str:
        if self.expires_at is None:
            return "never (no timeout)"
        return self.expires_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

    # -- the provider -----------------------------------------------------------------------------

    def create(self) -> None:
        with self._lifecycle:
            self._sdk = _sdk()
            started = time.monotonic()
            found = self._find()
            self._sandbox = found if found is not None else self._make()
            self.sandbox_id, self.created_now = self._sandbox.id, found is None
            try:
                self._wait_running(started + self.ready_timeout)
                try:
                    self.endpoint = self._execd_from(self._sandbox.get_endpoint(EXECD_PORT))
                    if not self.created_now:
                        self._renew()  # it may be near its end: a full timeout from now on
                except self._sdk.SdkError as exc:
                    raise self._failure(exc, f"give the execd endpoint of the sandbox {self.sandbox_id}") from None
                self._wait_for_execd(started + self.ready_timeout)
                self._start_renewing()
                self._start()
            except BaseException:
                self._stop_renewing()
                if self.created_now:
                    self._delete()
                else:  # an earlier kernel's, which may hold work: it ends at its timeout
                    self._sandbox, sandbox = None, self._sandbox
                    sandbox.close()
                raise
            self.create_seconds = time.monotonic() - started

    def open_runner(self):  # type: ignore[no-untyped-def]
        """A relay to the daemon; a sandbox found gone says so rather than failing to connect."""
        if self.lost:
            raise OSError(self.lost)
        return super().open_runner()

    def _delete(self) -> None:
        """Delete the sandbox (once) and close the SDK's connections; a failure is logged: the sandbox then
        ends at its timeout."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is None:
            return
        assert self._sdk is not None
        started = time.monotonic()
        try:
            sandbox.kill()
        except self._sdk.SdkError as exc:
            if not (isinstance(exc, self._sdk.ApiError) and exc.status_code == 404):
                log.warning("%s; it ends at its timeout (%s)", self._failure(exc, f"delete the sandbox {sandbox.id}"),
                            self._expiry())
        finally:
            sandbox.close()
        self.delete_seconds = time.monotonic() - started

    def release(self) -> None:
        """Leave the sandbox, and its daemon lingering, for a kernel that restarts with this key: no more
        renewals, so it lives until its timeout unless that kernel finds it."""
        self._stop_renewing()
        self._disconnect()
        with self._lifecycle:
            sandbox, self._sandbox = self._sandbox, None
            if sandbox is not None:
                sandbox.close()

    def destroy(self) -> None:
        self._stop_renewing()
        self._disconnect()
        with self._lifecycle:
            self._delete()

    def limit_report(self) -> LimitReport:
        # The sandbox's cgroup is the server's: an OOM kill shows here only as a SIGKILL.
        return LimitReport({"memory": human_size(self.limits.memory), "processes": "the server's number of",
                            "cpu": "the server's default" if self.limits.cpu is None else f"{self.limits.cpu:g}"},
                           oom_counted=False)

    def _limit_rows(self) -> dict[str, str]:
        asked = resource_limits(self.limits)
        return {"memory": human_size(self.limits.memory) + f" (resourceLimits.memory {asked['memory']})",
                "cpu": f"{self.limits.cpu:g} (resourceLimits.cpu {asked['cpu']})" if "cpu" in asked
                else "the server's default (none asked)",
                "processes": "the server's own setting (the lifecycle API has no process limit)"}

    def headline(self) -> list[str]:
        return [f"OpenSandbox sandbox {self.sandbox_id}", f"server {self.server}", f"image {self.image}",
                f"{human_size(self.limits.memory)}" + (f", {self.limits.cpu:g} CPU" + "s" * (self.limits.cpu != 1)
                                                       if self.limits.cpu else ""),
                self._starts_in()]

    def describe(self) -> dict[str, Any]:
        endpoint = self.execd
        return {"provider": self.name, "enforcement": self.enforcement, "server": self.server,
                "sandbox id": self.sandbox_id, "image": self.image,
                "expires": f"{self._expiry()}, renewed every {self.sandbox_timeout / 3:g} s while the kernel runs"
                           + (f" ({self.renewals} so far)" if self.renewals else ""),
                "timeout": f"{self.sandbox_timeout:g} s", "made by": "this kernel" if self.created_now
                else "an earlier kernel with this key (reused)", "limits": self._limit_rows(),
                "endpoint": endpoint.describe() + (" (the server's proxy)" if self.server_proxy else ""),
                "endpoint headers": ", ".join(sorted(endpoint.headers)) or "none",
                "dies with": "its kernel: deleted at shutdown; after a restart or a crash it lives until its timeout "
                             "unless the next kernel with this key finds it", **self._box_rows()}
