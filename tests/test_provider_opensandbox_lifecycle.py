"""The opensandbox provider creating a sandbox per kernel through OpenSandbox's lifecycle API.

OpenSandbox's real server runs in tests/test_opensandbox_server.py; what it cannot be made to do within
a test (timeouts under 60 s, expiry, a sandbox deleted behind the kernel's back, Pending and Failed
sandboxes, malformed requests) runs here, where `tests/lifecycle_standin.py` plays it from the API's spec: it
checks every request the real SDK sends, makes each sandbox a local process serving the project's own
execd-compatible endpoint, and hands out endpoints behind a gateway that requires the routing header.
The kernel is the real one (jupyter_client), the SDK the real one from PyPI, the HTTP real.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from owsandbox.host.providers import resolve
from owsandbox.host.providers.boxed import BoxError
from owsandbox.host.providers.opensandbox import OpenSandboxProvider
from owsandbox.host.providers.opensandbox_lifecycle import OpenSandboxLifecycleProvider, server_url
from owsandbox.host.workspace import RunnerWorkspace

from .conftest import DEFAULT_KERNEL_NAME
from .kernel_session import KernelSession
from .lifecycle_standin import API_KEY_HEADER, INGRESS_HEADER, LifecycleStandin
from .ports import free_port
from .processes import wait_gone
from .waiting import patience, wait_until

IMAGE = "owsandbox/standin-box:1"
KEY = "standin-key"
ENGINE = Path(__file__).resolve().parents[1] / "notebooks" / "engines" / "echo_engine.py"


@pytest.fixture
def standin() -> Iterator[LifecycleStandin]:
    """The stand-in as the spec has it (timeouts of at least 60 s)."""
    with LifecycleStandin(api_key=KEY) as server:
        yield server


@pytest.fixture
def quick_standin() -> Iterator[LifecycleStandin]:
    """The stand-in taking timeouts down to 2 s, so that renewal and expiry happen within a test."""
    with LifecycleStandin(api_key=KEY, min_timeout=2) as server:
        yield server


@pytest.fixture(autouse=True)
def no_outside_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings of the machine that runs the tests must not leak into the providers made here."""
    for name in ("OWSANDBOX_EXECD_URL", "OWSANDBOX_EXECD_TOKEN", "OWSANDBOX_EXECD_HEADERS", "OWSANDBOX_IMAGE",
                 "OWSANDBOX_LIMITS", "OWSANDBOX_OPENSANDBOX_SERVER", "OWSANDBOX_OPENSANDBOX_API_KEY",
                 "OWSANDBOX_OPENSANDBOX_TIMEOUT", "OWSANDBOX_OPENSANDBOX_READY_TIMEOUT", "OPEN_SANDBOX_API_KEY",
                 "OPEN_SANDBOX_DOMAIN", "OWSANDBOX_OPENSANDBOX_SERVER_PROXY"):
        monkeypatch.delenv(name, raising=False)


def lifecycle_kernel(folder: Path, server: LifecycleStandin, **env: str) -> KernelSession:
    settings = {"OWSANDBOX_PROVIDER": "opensandbox", "OWSANDBOX_OPENSANDBOX_SERVER": server.url,
                "OWSANDBOX_OPENSANDBOX_API_KEY": KEY, "OWSANDBOX_IMAGE": IMAGE, **env}
    return KernelSession(folder, kernel_name=DEFAULT_KERNEL_NAME, env=settings)


def sandbox_table(kernel: KernelSession) -> str:
    described = kernel.run("%sandbox --all")
    assert described.status == "ok", described.outputs
    return described.of_type("display_data")[0]["data"]["text/plain"]


def provider(server: LifecycleStandin | str, **options: Any) -> OpenSandboxLifecycleProvider:
    """A provider made by name, as the kernel makes it, on `server` (the stand-in, or a URL)."""
    url = server if isinstance(server, str) else server.url
    options = {"server": url, "api_key": KEY, "image": IMAGE, "cwd": "/", **options}
    made = resolve("opensandbox")(**options)
    assert isinstance(made, OpenSandboxLifecycleProvider)
    return made


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # a port nobody listens on


# -- through the kernel -----------------------------------------------------------------------------------

def test_a_kernel_runs_in_a_sandbox_it_created_renews_it_and_deletes_it_at_shutdown(quick_standin, tmp_path):
    server = quick_standin
    kernel = lifecycle_kernel(tmp_path, server, OWSANDBOX_LIMITS="memory=768M,cpu=1.5",
                              OWSANDBOX_OPENSANDBOX_TIMEOUT="3")
    try:
        first = kernel.run("echo $HOME; pwd")
        assert first.status == "ok", first.outputs
        made = server.only_sandbox()
        assert first.text() == f"{made.folder}\n{made.folder}\n"  # the created sandbox's own folder, not ours
        assert f"[sandbox: OpenSandbox sandbox {made.id} · server {server.url} · image {IMAGE}" in first.notes()
        # the kernel's limits reached the create request, mapped onto the API's resource limits
        assert made.request["resourceLimits"] == {"memory": "768Mi", "cpu": "1500m"}
        assert made.memory_bytes == 768 << 20 and made.cpus == 1.5
        assert made.request["timeout"] == 3 and made.request["metadata"]["owsandbox.key"].startswith("kernel-")
        wait_until(lambda: made.renewals, 10, "a renewal (every second with a 3 s timeout)")
        assert made.expires_at is not None and made.expires_at > made.created_at + timedelta(seconds=3)
        table = sandbox_table(kernel)
        for shown in (server.url, made.id, IMAGE, "expires", "renewed every 1 s", "this kernel",
                      "resourceLimits.memory 768Mi"):
            assert shown in table, (shown, table)
        shown_expiry = datetime.strptime(table.split("expires", 1)[1].split(",")[0].strip(),
                                         "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=timezone.utc)
        assert abs(shown_expiry - made.expires_at) < timedelta(seconds=3)  # a recent renewal's answer
        started = kernel.run(f"%attach -- {sys.executable} {ENGINE}")  # %attach: the same execd, same headers
        assert started.status == "ok", started.outputs
        answer = kernel.run('%send {"id": 1, "type": "echo", "text": "through the gateway"}')
        assert answer.of_type("display_data")[0]["data"]["application/json"]["text"] == "through the gateway"
        assert kernel.run("%attach --kill").status == "ok"
        # every request to execd went through the gateway with the routing header the endpoint named
        assert server.gateway_log and all(r.status == 200 for r in server.gateway_log)
        assert {r.headers.get(INGRESS_HEADER.lower()) for r in server.gateway_log} == {f"{made.id}-44772"}
        inside = made.processes()
        assert len(inside) >= 3  # the box, the runner's daemon (detached), its bash...
        outlived = made.created_at + timedelta(seconds=3.5)  # past the expiry it was created with
        wait_until(lambda: datetime.now(timezone.utc) > outlived, 10, "the sandbox's first timeout to pass")
        assert made.id in server.sandboxes and kernel.run("echo still").text() == "still\n"
    finally:
        kernel.close()
    assert server.gone == {made.id: "user_delete"}
    assert wait_gone(inside) == []  # deleting it ended everything in it, the detached daemon included


def test_a_kernel_restart_keeps_the_sandbox_and_shutdown_deletes_it(standin, tmp_path):
    kernel = lifecycle_kernel(tmp_path, standin)
    try:
        assert kernel.run("export BEFORE=1; echo kept > kept.txt").status == "ok"
        made = standin.only_sandbox()
        daemon = int(kernel.run("echo $PPID").text())  # the runner's daemon, which started the shell
        assert daemon in made.processes()
        kernel.restart(now=False)
        again = kernel.run("echo [$BEFORE]; cat kept.txt")
        assert again.status == "ok", again.outputs
        assert again.text() == "[]\nkept\n"  # fresh shells, the same sandbox
        assert standin.only_sandbox() is made and made.id in standin.sandboxes
        assert len(standin.logged("POST", "/v1/sandboxes")) == 1
        found = standin.logged("GET", "/v1/sandboxes")
        assert len(found) == 2 and all(r.query["state"] == ["Running"] for r in found)
        assert "an earlier kernel with this key (reused)" in sandbox_table(kernel)
        assert int(kernel.run("echo $PPID").text()) == daemon  # the same daemon, lingering for the new kernel
    finally:
        kernel.close()
    assert standin.gone == {made.id: "user_delete"}


def test_a_killed_kernel_leaves_its_sandbox_to_expire(quick_standin, tmp_path):
    # A lifetime of 2 s on a quiet machine; longer on a busy one, where a kernel that was not run for
    # 2 s saw its box expire before its first cell (two test runs at once, load 20 on 2 cores).
    lifetime = max(2, round(patience(2)))
    kernel = lifecycle_kernel(tmp_path, quick_standin, OWSANDBOX_OPENSANDBOX_TIMEOUT=str(lifetime))
    try:
        assert kernel.run("setsid sleep 600 & disown; echo started").text() == "started\n"
        made = quick_standin.only_sandbox()
        inside = made.processes()
        os.kill(kernel.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: made.id in quick_standin.gone, lifetime + patience(13), "the sandbox to expire")
        assert quick_standin.gone[made.id] == "ttl_expiry"
        # Its lifetime after its last renewal at most, and the stand-in's tick.
        assert time.monotonic() - killed < lifetime + patience(2)
        assert wait_gone(inside) == []
    finally:
        kernel.close()


def test_a_sandbox_that_cannot_be_made_is_the_first_cells_error(standin, tmp_path):
    kernel = lifecycle_kernel(tmp_path, standin, OWSANDBOX_OPENSANDBOX_API_KEY="not-the-key")
    try:
        failed = kernel.run("echo never")
        assert failed.status == "error" and failed.error["ename"] == "SandboxUnavailable"
        message = failed.error["evalue"]
        assert message.startswith("the opensandbox sandbox could not start: the OpenSandbox server at " + standin.url)
        assert "401 INVALID_API_KEY" in message and "OWSANDBOX_OPENSANDBOX_API_KEY" in message
        assert "not-the-key" not in message
    finally:
        kernel.close()


# -- failures, each named ------------------------------------------------------------------------------

def test_a_sandbox_deleted_behind_the_kernels_back_is_named(quick_standin):
    made = provider(quick_standin, sandbox_timeout=2)
    made.create()
    try:
        quick_standin.delete(made.sandbox_id, "user_delete")  # someone else deleted it
        wait_until(lambda: made.lost, 10, "a renewal to find the sandbox gone")
        with pytest.raises(OSError, match=f"the OpenSandbox sandbox {made.sandbox_id} on {quick_standin.url} is "
                                          "gone .*a new kernel makes a new one"):
            made.open_runner()
    finally:
        made.destroy()  # its DELETE answers 404, which is no error here
    assert made.delete_seconds is not None

def test_an_unreachable_server_is_named():
    url = closed_port_url()
    made = provider(url)
    with pytest.raises(BoxError, match=f"cannot reach the OpenSandbox server at {url} .*Connection refused") as err:
        made.create()
    assert "OWSANDBOX_OPENSANDBOX_SERVER" in str(err.value)


def test_a_wrong_or_missing_api_key_is_named(standin, monkeypatch):
    with pytest.raises(BoxError, match=r"refused the API key from OWSANDBOX_OPENSANDBOX_API_KEY .*401 INVALID_API_KEY"):
        provider(standin, api_key="wrong").create()
    with pytest.raises(BoxError, match=r"refused no API key \(OWSANDBOX_OPENSANDBOX_API_KEY is not set\) .*"
                                       r"401 MISSING_API_KEY"):
        provider(standin, api_key="").create()
    monkeypatch.setenv("OPEN_SANDBOX_API_KEY", "wrong-too")  # the SDK's own setting, used when ours is not set
    with pytest.raises(BoxError, match=r"refused the API key from OPEN_SANDBOX_API_KEY .*401 INVALID_API_KEY"):
        provider(standin, api_key="").create()
    assert not standin.sandboxes and not standin.gone


def test_an_image_the_server_cannot_pull_is_named(standin):
    with pytest.raises(BoxError, match=r"could not create a sandbox from the image nowhere/none:1 \(500 "
                                       r"DOCKER::SANDBOX_IMAGE_PULL_FAILED: Failed to pull image nowhere/none:1.*\): "
                                       r"is OWSANDBOX_IMAGE an image the server can pull\?"):
        provider(standin, image="nowhere/none:1").create()
    assert not standin.sandboxes


def test_a_sandbox_that_never_runs_or_fails_is_named_and_deleted():
    with LifecycleStandin(api_key=KEY, stuck=("slow/pull:1",), failing={"bad/entry:1": "exec: python3: not found"}
                          ) as server:
        started = time.monotonic()
        # Named by this provider's wait for Running, or, when the SDK's wait for the sandbox's endpoint (as
        # long) ran out first, as a busy machine can make it, by that one.
        with pytest.raises(BoxError, match=r"did not become (Running within 0\.5 s: it is still Pending "
                                           r"\(SANDBOX_SCHEDULED: .*|ready within 0\.5 s \(.*\)); "
                                           r"OWSANDBOX_OPENSANDBOX_READY_TIMEOUT gives it longer"):
            provider(server, image="slow/pull:1", ready_timeout=0.5).create()
        assert time.monotonic() - started < 5
        with pytest.raises(BoxError, match=r"of the image bad/entry:1 .* did not start: it is Failed "
                                           r"\(PROVISIONING_ERROR: exec: python3: not found\)"):
            provider(server, image="bad/entry:1").create()
        assert sorted(server.gone.values()) == ["user_delete", "user_delete"]  # neither was left behind
        assert not server.sandboxes


def test_the_sdks_own_ready_timeout_names_the_setting_that_gives_it_longer():
    """The SDK waits for the new sandbox's endpoint as long as this provider waits for Running; on a busy
    machine its wait can run out first, and its words alone name no setting."""
    from opensandbox.exceptions import SandboxReadyTimeoutException

    from owsandbox.host.providers.opensandbox_lifecycle import _sdk

    made = provider("http://127.0.0.1:9", image="slow/pull:1", ready_timeout=0.5)
    made._sdk = _sdk()
    said = str(made._failure(SandboxReadyTimeoutException("Sandbox readiness timed out. Endpoint has not been "
                                                          "resolved"), "create a sandbox"))
    assert said == ("the OpenSandbox sandbox of the image slow/pull:1 on http://127.0.0.1:9 did not become ready "
                    "within 0.5 s (Sandbox readiness timed out. Endpoint has not been resolved); "
                    "OWSANDBOX_OPENSANDBOX_READY_TIMEOUT gives it longer"), said


def test_a_missing_sdk_names_the_extra_to_install(standin, monkeypatch):
    # As if it were not installed: the package blocked whether or not a test before imported it.
    for name in {"opensandbox", *(name for name in sys.modules if name.startswith("opensandbox."))}:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(BoxError, match=r"needs the OpenSandbox SDK, which is not installed here .*: "
                                       r"pip install 'owsandbox\[opensandbox\]'"):
        provider(standin).create()


def test_settings_that_cannot_work_are_refused_before_anything_starts(monkeypatch, standin):
    monkeypatch.setenv("OWSANDBOX_OPENSANDBOX_SERVER", standin.url)
    monkeypatch.setenv("OWSANDBOX_EXECD_URL", "http://127.0.0.1:1")
    with pytest.raises(ValueError, match="OWSANDBOX_OPENSANDBOX_SERVER and OWSANDBOX_EXECD_URL are both set"):
        resolve("opensandbox")(cwd="/")
    monkeypatch.delenv("OWSANDBOX_EXECD_URL")
    with pytest.raises(ValueError, match="needs an image to create a sandbox from: set OWSANDBOX_IMAGE"):
        resolve("opensandbox")(cwd="/")
    monkeypatch.delenv("OWSANDBOX_OPENSANDBOX_SERVER")
    monkeypatch.setenv("OWSANDBOX_EXECD_URL", "http://127.0.0.1:1")
    assert type(resolve("opensandbox")(cwd="/")) is OpenSandboxProvider  # the sandbox that exists, as before
    assert server_url("osb.example:8080/v1/") == "http://osb.example:8080"
    assert server_url("https://osb.example/v1") == "https://osb.example"


@pytest.mark.unit
def test_the_server_proxy_setting_is_a_yes_or_a_no(monkeypatch):
    for text, meant in (("1", True), ("yes", True), ("0", False), ("", False)):
        monkeypatch.setenv("OWSANDBOX_OPENSANDBOX_SERVER_PROXY", text)
        assert provider("http://127.0.0.1:1").server_proxy is meant
    monkeypatch.setenv("OWSANDBOX_OPENSANDBOX_SERVER_PROXY", "perhaps")
    with pytest.raises(ValueError, match="OWSANDBOX_OPENSANDBOX_SERVER_PROXY='perhaps' is neither 1 .* nor 0"):
        provider("http://127.0.0.1:1")
    assert provider("http://127.0.0.1:1", server_proxy=True).server_proxy is True  # an argument wins


# -- what the SDK sends, and what the stand-in refuses -------------------------------------------------------

def test_the_sdks_requests_are_the_ones_the_spec_describes(quick_standin):
    server = quick_standin
    made = provider(server, limits="memory=1G", sandbox_timeout=3, key="kernel-shapes")
    workspace = RunnerWorkspace(made, "/")
    try:
        assert workspace.executor.run("echo ok")["output"] == "ok\n"
        wait_until(lambda: made.renewals >= 1, 10, "a renewal")
    finally:
        workspace.close()
    sandbox_id = made.sandbox_id
    sent = [(r.method, r.path.replace(sandbox_id, "ID"), r.status) for r in server.requests]
    assert sent[:4] == [("GET", "/v1/sandboxes", 200), ("POST", "/v1/sandboxes", 202),
                        ("GET", "/v1/sandboxes/ID/endpoints/44772", 200),
                        ("GET", "/v1/sandboxes/ID/endpoints/18080", 200)]  # the SDK also asks for egress's
    assert ("POST", "/v1/sandboxes/ID/renew-expiration", 200) in sent
    assert sent[-1] == ("DELETE", "/v1/sandboxes/ID", 204)
    assert {r.headers.get(API_KEY_HEADER.lower()) for r in server.requests} == {KEY}
    listed = server.requests[0]
    assert listed.query == {"metadata": ["owsandbox.key=kernel-shapes"], "state": ["Running"]}
    created = server.requests[1].body
    assert created == {"image": {"uri": IMAGE}, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 3,
                       "resourceLimits": {"memory": "1024Mi"}, "secureAccess": False,
                       "metadata": {"owsandbox.key": "kernel-shapes", "owsandbox.spec": made.spec()}}
    assert server.requests[2].query == {"use_server_proxy": ["false"]}
    renewal = server.logged("POST", f"/v1/sandboxes/{sandbox_id}/renew-expiration")[0]
    assert set(renewal.body) == {"expiresAt"}
    renewed_to = datetime.fromisoformat(renewal.body["expiresAt"])
    assert renewed_to.tzinfo is not None and abs(renewed_to - datetime.now(timezone.utc)) < timedelta(seconds=5)


def raw(server: LifecycleStandin, method: str, path: str, body: Any = None, key: str | None = KEY,
        headers: dict[str, str] | None = None, origin: str | None = None) -> tuple[int, dict[str, Any]]:
    """A request made by hand (not the SDK): its status and JSON answer."""
    request = urllib.request.Request((origin or server.url) + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {}),
                                              **({API_KEY_HEADER: key} if key is not None else {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text else {}
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read() or b"{}")


def test_malformed_requests_get_the_specs_errors(standin):
    good = {"image": {"uri": IMAGE}, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 60,
            "resourceLimits": {"memory": "512Mi"}}
    assert raw(standin, "POST", "/v1/sandboxes", good, key=None) == (401, {
        "code": "MISSING_API_KEY", "message": f"Authentication credentials are missing. Provide API key via "
                                              f"{API_KEY_HEADER} header."})
    assert raw(standin, "POST", "/v1/sandboxes", good, key="wrong")[1]["code"] == "INVALID_API_KEY"
    for change, words in (({"resourceLimits": None}, "resourceLimits is required"),
                          ({"timeout": 30}, "timeout must be an integer of at least 60"),
                          ({"timeout": "60"}, "timeout must be an integer"),
                          ({"entrypoint": []}, "entrypoint is required"),
                          ({"image": {"uri": IMAGE, "tag": "x"}}, "image has unknown fields: tag"),
                          ({"snapshotId": "snap-1"}, "exactly one of image and snapshotId"),
                          ({"metadata": {"opensandbox.io/owner": "me"}}, "reserved prefix"),
                          ({"resourceLimits": {"memory": "lots"}}, "is not a size"),
                          ({"platform": {"os": "linux"}}, "platform lacks arch")):
        body = {k: v for k, v in {**good, **change}.items() if v is not None}
        status, answer = raw(standin, "POST", "/v1/sandboxes", body)
        assert (status, answer["code"]) == (400, "INVALID_REQUEST") and words in answer["message"], (change, answer)
    assert raw(standin, "GET", "/v1/sandboxes/no-such")[0] == 404
    assert raw(standin, "DELETE", "/v1/sandboxes/no-such")[1]["code"] == "SANDBOX_NOT_FOUND"
    assert raw(standin, "GET", "/v1/sandboxes?pageSize=0")[0] == 400
    status, created = raw(standin, "POST", "/v1/sandboxes", good)
    assert status == 202 and created["status"]["state"] == "Pending" and "image" not in created
    sandbox_id = created["id"]
    wait_until(lambda: standin.sandboxes[sandbox_id].state == "Running", 10, "the sandbox to run")
    renew = f"/v1/sandboxes/{sandbox_id}/renew-expiration"
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    assert raw(standin, "POST", renew, {"expiresAt": later.isoformat(), "extra": 1})[0] == 400
    assert raw(standin, "POST", renew, {"expiresAt": "2000-01-01T00:00:00Z"})[1]["code"] == "INVALID_EXPIRATION"
    assert raw(standin, "POST", renew, {"expiresAt": later.isoformat()})[0] == 200
    assert raw(standin, "GET", f"/v1/sandboxes/{sandbox_id}/endpoints/70000")[0] == 400
    status, endpoint = raw(standin, "GET", f"/v1/sandboxes/{sandbox_id}/endpoints/44772")
    assert status == 200 and "://" not in endpoint["endpoint"]
    origin, path = "http://" + endpoint["endpoint"].split("/", 1)[0], "/" + endpoint["endpoint"].split("/", 1)[1]
    # the gateway routes only with the header the endpoint came with
    assert raw(standin, "GET", path + "/pty/none", key=None, origin=origin)[1]["code"] == "ROUTE_NOT_FOUND"
    routed = raw(standin, "GET", path + "/pty/none", key=None, origin=origin, headers=endpoint["headers"])
    assert routed[0] == 404 and routed[1]["code"] != "ROUTE_NOT_FOUND"  # execd's own answer: no such session
    assert raw(standin, "DELETE", f"/v1/sandboxes/{sandbox_id}") == (204, {})
    assert standin.gone == {sandbox_id: "user_delete"}
