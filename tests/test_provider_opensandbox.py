"""The opensandbox provider: a box reached only through an execd endpoint (URL + access token).

The project's own execd-compatible endpoint stands in for an OpenSandbox sandbox's execd: it serves
the same `/pty` API over TCP with the same token header, so everything here goes through HTTP and
WebSocket pipe sessions exactly as it would against a real one. (The whole runner suite also runs
through it: see the `box` fixture.) The tests that need no white-box look at the stand-in also run
against an external execd named by `OWS_TEST_EXECD_URL` and `OWS_TEST_EXECD_TOKEN` (OpenSandbox's own,
built from its source and run on this machine's loopback), and are skipped when that is unset.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosedOK
from websockets.frames import Close

from owsandbox import protocol as P
from owsandbox.box.execd import endpoint as execd_module
from owsandbox.box.execd.endpoint import ExecdServer
from owsandbox.channel import ExecdControl, ExecdEndpoint, ExecdJsonLineChannel, ExecdNotFound
from owsandbox.channel.endpoint import TOKEN_HEADER
from owsandbox.host import wstransport
from owsandbox.host.client import RunnerClient
from owsandbox.host.executor import RunnerExecutor
from owsandbox.host.providers import RUNNER_PROVIDERS, enforcement_of
from owsandbox.host.providers.exec import BoxError
from owsandbox.host.providers.opensandbox import OpenSandboxProvider
from owsandbox.host.workspace import RunnerWorkspace
from owsandbox.host.wstransport import CLOSE_TIMEOUT_SECONDS, ExecdPipeTransport, ExecdTransportError

from .conftest import DEFAULT_KERNEL_NAME
from .daemon_restart import restart_daemon
from .kernel_session import KernelSession
from .ports import free_port
from .processes import wait_for_file
from .released_execd import ReleasedExecd
from .test_runner_shells import run_in_background, wait_until_busy
from .waiting import patience, shell_waits_for, wait_until

ENGINE = Path(__file__).resolve().parents[1] / "notebooks" / "engines" / "echo_engine.py"


EXECD_SERVERS = {"main": "opensandbox_execd", "release": "opensandbox_release_execd", "external": "external_execd"}


@pytest.fixture(params=list(EXECD_SERVERS))
def execd_server(request: pytest.FixtureRequest) -> Any:
    """The stand-in as execd's main branch and as a released execd (v1.0.18, release mode), and the
    external execd named by `OWS_TEST_EXECD_URL` (skipped when unset)."""
    return request.getfixturevalue(EXECD_SERVERS[request.param])


@pytest.fixture
def execd(execd_server: Any) -> dict[str, str]:
    """The execd's `url` and `token`."""
    return execd_server.address()


@pytest.fixture
def make_provider(execd: dict[str, str], workspace: Path) -> Iterator[Callable[..., OpenSandboxProvider]]:
    """Providers on the stand-in box, created here and destroyed at teardown."""
    made: list[OpenSandboxProvider] = []

    def make(**options: Any) -> OpenSandboxProvider:
        options.setdefault("url", execd["url"])
        options.setdefault("headers", {TOKEN_HEADER: execd["token"]})
        options.setdefault("box_cwd", str(workspace))
        provider = OpenSandboxProvider(**options)
        made.append(provider)
        provider.create()
        return provider

    try:
        yield make
    finally:
        for provider in made:
            provider.destroy()


@pytest.fixture
def connected(make_provider: Callable[..., OpenSandboxProvider]) -> Iterator[tuple[OpenSandboxProvider, RunnerClient]]:
    provider = make_provider()
    client = RunnerClient(provider.open_runner, ping_seconds=0.5, reconnect_timeout=20)
    try:
        client.connect()
        yield provider, client
    finally:
        client.close()


def test_cells_run_through_execd_and_keep_their_state(execd, workspace):
    provider = OpenSandboxProvider(url=execd["url"], headers={TOKEN_HEADER: execd["token"]}, box_cwd=str(workspace))
    started = time.monotonic()
    ws = RunnerWorkspace(provider, str(workspace))
    try:
        first = ws.executor.run("true")
        assert first["exit_code"] == 0 and time.monotonic() - started < 30
        assert ws.executor.run("mkdir -p deep && cd deep && export KEPT=yes; f() { echo in-f; }")["exit_code"] == 0
        assert ws.executor.run("echo $KEPT ${PWD##*/}; f")["output"] == "yes deep\nin-f\n"
        failed = ws.executor.run("echo out; echo err >&2; false")
        assert failed["exit_code"] == 1 and "out\n" in failed["output"] and "err\n" in failed["output"]
        assert ws.describe()["provider"] == "opensandbox" and ws.describe()["enforcement"] == "the OpenSandbox sandbox"
    finally:
        ws.close()
    assert not os.path.exists(provider.socket_path)  # destroy() stopped the daemon and removed its folder


def test_the_runner_is_copied_into_a_box_once_per_version(fresh_runtime, make_provider):
    first = make_provider(runtime_dir=fresh_runtime)
    assert first.uploads == 1 and not first.reused
    runner = Path(first.runner_path)
    assert runner.name.startswith("runner-") and runner.parent.parent == Path(fresh_runtime)
    stamp = runner.stat().st_mtime_ns
    second = make_provider(runtime_dir=fresh_runtime)  # another kernel on the same box
    assert second.uploads == 0 and second.runner_path == first.runner_path
    assert runner.stat().st_mtime_ns == stamp
    assert second.socket_path != first.socket_path  # a daemon of its own
    restart_daemon(first)  # a new daemon of a known version needs no copy either
    assert first.uploads == 1 and runner.stat().st_mtime_ns == stamp


def test_a_provider_with_the_same_key_finds_the_lingering_daemon(make_provider, workspace):
    key = f"k-opensandbox-reuse-{os.getpid()}"  # the box is this machine: another test run's daemon is not ours
    first = make_provider(key=key)
    first.release()
    again = make_provider(key=key)
    assert again.reused and again.daemon_info["pid"] == first.daemon_info["pid"]


def test_a_command_that_finishes_while_the_pipe_is_cut_delivers_its_result(make_provider, workspace):
    provider = make_provider()
    door = threading.Event()  # closed: the network stays down
    door.set()

    def open_runner() -> ExecdPipeTransport:
        assert door.wait(30)
        return provider.open_runner()

    client = RunnerClient(open_runner, ping_seconds=0.5, reconnect_timeout=20)
    try:
        client.connect()
        ex = RunnerExecutor(client, cwd=str(workspace))
        ex.run("cd /tmp && export STAYS=yes")
        flag, go = workspace / "finished.flag", workspace / "go"
        # it finishes once the test says so, after the cut: on a loaded machine a "sleep 0.3" finished first,
        # its answer arrived on the pipe about to be cut, and there was nothing to resume
        worker, result = run_in_background(lambda: ex.run(
            f"{shell_waits_for(go, interval=0.02)}; echo finished-while-cut; touch {flag}"))
        wait_until_busy(client)
        door.clear()
        client.cut()
        go.touch()
        wait_for_file(flag, patience(10))
        assert flag.exists() and worker.is_alive()  # done in the box; nobody has heard of it yet
        time.sleep(0.1)
        door.set()
        worker.join(30)
        assert result["output"] == "finished-while-cut\n" and result["exit_code"] == 0
        assert client.reconnects == 1 and client.restarts == 0
        assert ex.run("echo $STAYS $PWD")["output"] == "yes /tmp\n"
    finally:
        door.set()
        client.close()


def test_a_wrong_or_missing_token_fails_at_once_and_says_so(execd, workspace):
    for headers, words in (({TOKEN_HEADER: "not-the-token"}, "the access token is wrong"),
                           ({}, "the access token is missing")):
        provider = OpenSandboxProvider(url=execd["url"], headers=headers, box_cwd=str(workspace))
        started = time.monotonic()
        with pytest.raises(BoxError) as err:
            provider.create()
        assert time.monotonic() - started < 5
        message = str(err.value)
        assert "401" in message and words in message and "X-EXECD-ACCESS-TOKEN" in message
        assert execd["url"] in message and execd["token"] not in message


def test_an_unreachable_url_fails_at_once_and_names_it(workspace):
    url = f"http://127.0.0.1:{free_port()}"  # a port nobody listens on
    provider = OpenSandboxProvider(url=url, headers={TOKEN_HEADER: "t"}, box_cwd=str(workspace))
    started = time.monotonic()
    with pytest.raises(BoxError, match="cannot reach execd at " + url) as err:
        provider.create()
    assert "Connection refused" in str(err.value) and time.monotonic() - started < 5


def test_a_box_without_the_python_named_is_a_clear_error(execd, workspace):
    provider = OpenSandboxProvider(url=execd["url"], headers={TOKEN_HEADER: execd["token"]}, box_cwd=str(workspace),
                                   python="python3-not-here")
    with pytest.raises(BoxError, match="the box has no python3-not-here"):
        provider.create()


def test_attach_talks_to_the_same_execd(connected):
    provider, client = connected
    endpoint = provider.execd_endpoint(client.hello)
    assert endpoint == provider.endpoint and endpoint.origin == provider.endpoint.origin
    session_id = ExecdControl(endpoint).create()  # a released execd ignores a command here

    async def converse() -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        answered = asyncio.Event()

        async def on_record(record: dict[str, Any], offset: int) -> None:
            records.append(record)
            if record.get("type") == "response":
                answered.set()

        async def on_failure(exc: BaseException) -> None:
            answered.set()

        channel = ExecdJsonLineChannel(endpoint, session_id=session_id, on_record=on_record, on_failure=on_failure,
                                       label="echo engine")
        await channel.connect(command=f"{sys.executable} {ENGINE}")  # its first stdin line: exec it
        try:
            await channel.send({"id": 1, "type": "echo", "text": "x"})
            await asyncio.wait_for(answered.wait(), 20)
        finally:
            await channel.delete()
        return records

    records = asyncio.run(converse())
    assert {"id": 1, "type": "response", "ok": True, "text": "x"} in records


def test_the_daemon_drops_the_older_pipe_when_a_newer_one_comes(connected):
    provider, client = connected
    old = client._transport
    second = provider.open_runner()
    try:
        second.send(P.encode(P.request("h2", "runner.hello", {"protocol_version": 1})))
        answer = json.loads(second.read(10).split(b"\n")[0])
        assert answer["result"]["instance_id"] == client.instance_id
        assert old.ended.wait(patience(10)), "the older pipe never ended"
        # the older relay left, and execd said so (what the transport heard otherwise, for a failure)
        assert old.exit_code == 0, f"the older pipe ended with no exit 0: {old.stderr_tail()!r}"
    finally:
        second.close()
    assert RunnerExecutor(client).run("echo back")["output"] == "back\n"  # the client came back


def test_closing_a_pipe_deletes_its_session_and_the_relay_leaves(connected):
    """Seen through execd's own API (GET /pty/{id}), as any execd answers it."""
    provider, _ = connected
    transport = provider.open_runner()
    control = ExecdControl(provider.endpoint)
    assert control.status(transport.session_id)["running"] is True
    transport.close()

    def gone() -> bool:
        try:
            control.status(transport.session_id)
        except ExecdNotFound:
            return True
        return False

    wait_until(gone, 10, f"execd to forget session {transport.session_id}")
    assert transport.read() == b""
    with pytest.raises(OSError):
        transport.send(b"{}\n")


def test_close_does_not_wait_for_a_fin_that_execd_never_sends(monkeypatch, tmp_path):
    """execd answers Close but leaves TCP open; the transport closes it itself, at once. The close
    timeout is made far longer than the wait here, so a close that waited for the FIN (and was cut off
    by that timeout) would not end in time, however busy the machine is."""
    held: list[Any] = []
    monkeypatch.setattr(execd_module.WsConnection, "finish", lambda self: held.append(self))  # never closes TCP
    monkeypatch.setattr(wstransport, "CLOSE_TIMEOUT_SECONDS", 3600.0)
    server = ExecdServer("tok", tcp_host="127.0.0.1", cwd=str(tmp_path))
    server.start()
    try:
        endpoint = ExecdEndpoint(origin=server.address()["url"], headers={TOKEN_HEADER: "tok"})
        transport = ExecdPipeTransport(endpoint, "cat")
        transport.send(b"ping\n")
        assert transport.read(patience(10)) == b"ping\n"
        closing = threading.Thread(target=transport.close, name="closing")
        closing.start()
        closing.join(patience(CLOSE_TIMEOUT_SECONDS * 5))
        assert not closing.is_alive(), "close() waited for execd to close TCP"
        # the server really had left the connection open (another test's released execd in this worker may
        # finish a connection meanwhile: `finish` is patched on the class)
        assert any(not connection.closed for connection in held), held
    finally:
        for connection in held:
            connection.abort()
        server.stop()


def test_an_execd_on_a_unix_socket_carries_the_pipe_too(tmp_path):
    server = ExecdServer("tok", unix_path=str(tmp_path / "execd.sock"), cwd=str(tmp_path))
    server.start()
    try:
        provider = OpenSandboxProvider(url=f"unix:{tmp_path / 'execd.sock'}", headers={TOKEN_HEADER: "tok"},
                                       box_cwd=str(tmp_path))
        ws = RunnerWorkspace(provider, str(tmp_path))
        try:
            assert ws.executor.run("echo over a unix socket")["output"] == "over a unix socket\n"
        finally:
            ws.close()
    finally:
        server.stop()


def test_big_stdin_and_a_flood_of_stdout_flow_at_once(opensandbox_execd):
    """`cat` stops reading while its stdout is not read; sending must never stop our reading."""
    address = opensandbox_execd.address()
    transport = ExecdPipeTransport(ExecdEndpoint(origin=address["url"], headers={TOKEN_HEADER: address["token"]}),
                                   "cat")
    total, echoed = 40_000_000, [0]

    def read_back() -> None:
        while echoed[0] < total and (chunk := transport.read()):
            echoed[0] += len(chunk)

    reader = threading.Thread(target=read_back)
    reader.start()
    try:
        block = b"z" * 4_000_000
        for _ in range(total // len(block)):
            transport.send(block)
        reader.join(60)
        assert echoed[0] == total
    finally:
        transport.close()
        reader.join(10)


class _ScriptedConnection:
    """Plays execd's side of an attached pipe session, message by message."""

    def __init__(self, messages: list[str | bytes]) -> None:
        self.messages = list(messages)

    def recv(self, timeout: float | None = None) -> str | bytes:
        if not self.messages:
            raise ConnectionClosedOK(Close(1000, ""), Close(1000, ""), True)
        return self.messages.pop(0)

    def close(self) -> None:
        pass

    def close_socket(self) -> None:
        pass


def scripted(messages: list[str | bytes]) -> ExecdPipeTransport:
    transport = ExecdPipeTransport.__new__(ExecdPipeTransport)
    transport._init_state(ExecdEndpoint(origin="http://box:44772"), "engine")
    transport._ws = _ScriptedConnection(messages)  # type: ignore[assignment]
    transport._await_connected(1)
    return transport


@pytest.mark.unit
def test_a_replay_before_connected_is_stdout_and_stderr_goes_to_the_tail():
    transport = scripted([
        b"\x03" + (0).to_bytes(8, "big") + b"early ",
        json.dumps({"type": "connected", "session_id": "s", "mode": "pipe"}),
        b"\x02warning: odd\n",
        json.dumps({"type": "pong"}),
        b"\x01late\n",
        json.dumps({"type": "exit", "exit_code": 0}),
        b"\x01after the exit notice\n",  # a released execd's exit can overtake the last output
    ])
    assert transport.mode == "pipe"
    assert [transport.read(), transport.read(), transport.read(), transport.read()] == [
        b"early ", b"late\n", b"after the exit notice\n", b""]
    assert transport.exit_code == 0 and transport.ended.is_set() and transport.read() == b""
    assert transport.stderr_tail() == "warning: odd"
    transport.close()


@pytest.mark.unit
def test_a_replay_that_skipped_bytes_ends_the_pipe_loudly():
    transport = scripted([b"\x03" + (5).to_bytes(8, "big") + b"tail of something",
                          json.dumps({"type": "connected", "session_id": "s", "mode": "pipe"})])
    assert transport.read() == b"" and "output was lost" in transport.stderr_tail()


@pytest.mark.unit
def test_an_execd_error_before_connected_is_a_clear_failure():
    with pytest.raises(ExecdTransportError, match="START_FAILED: no bash"):
        scripted([json.dumps({"type": "error", "code": "START_FAILED", "error": "no bash"})])


@pytest.mark.unit
def test_the_endpoint_comes_from_the_environment_and_describe_never_shows_the_token(monkeypatch, workspace):
    monkeypatch.setenv("OWSANDBOX_EXECD_URL", "https://sandbox.example:8443/route")
    monkeypatch.setenv("OWSANDBOX_EXECD_TOKEN", "s3cret")
    provider = RUNNER_PROVIDERS["opensandbox"](cwd=workspace, key="k-env")
    assert isinstance(provider, OpenSandboxProvider)
    assert provider.endpoint.origin == "https://sandbox.example:8443/route"
    assert dict(provider.endpoint.headers) == {TOKEN_HEADER: "s3cret"}
    info = provider.describe()
    assert info["provider"] == "opensandbox" and info["endpoint"] == "https://sandbox.example:8443/route"
    assert "s3cret" not in repr(info) and "s3cret" not in repr(provider.endpoint)
    assert enforcement_of("opensandbox") == "the OpenSandbox sandbox"
    monkeypatch.delenv("OWSANDBOX_EXECD_URL")
    with pytest.raises(RuntimeError, match="OWSANDBOX_EXECD_URL is not set"):
        OpenSandboxProvider()


@pytest.mark.parametrize("execd_fixture", ["opensandbox_execd", "external_execd"])
def test_a_kernel_runs_cells_and_attach_in_an_opensandbox_box(execd_fixture, request, tmp_path):
    address = request.getfixturevalue(execd_fixture).address()
    kernel = KernelSession(tmp_path, kernel_name=DEFAULT_KERNEL_NAME, env={
        "OWSANDBOX_PROVIDER": "opensandbox", "OWSANDBOX_EXECD_URL": address["url"],
        "OWSANDBOX_EXECD_TOKEN": address["token"], "OWSANDBOX_BOX_CWD": str(tmp_path)})
    try:
        kernel.kc.kernel_info()
        banner = kernel.kc.get_shell_msg(timeout=10)["content"]["banner"]
        assert "provider opensandbox" in banner and "isolated by the OpenSandbox sandbox" in banner
        assert kernel.run("cd /tmp; export VIA=execd").status == "ok"
        assert kernel.run("echo $VIA $PWD").text() == "execd /tmp\n"
        started = kernel.run(f"%attach -- {sys.executable} {ENGINE}")
        assert started.status == "ok", started.error["evalue"]
        answer = kernel.run('%send {"id": 1, "type": "echo", "text": "through execd"}')
        assert answer.of_type("display_data")[0]["data"]["application/json"]["text"] == "through execd"
        assert kernel.run("%attach --kill").status == "ok"
    finally:
        kernel.close()


@pytest.mark.parametrize("warning", ["warn", "warning!\\n"])
def test_a_cursor_that_disagrees_with_a_released_execds_ring_is_found_and_re_derived(released_execd, warning,
                                                                                      monkeypatch):
    """A warning on stderr, then a record on stdout; the channel detaches right after the record.
    Live stderr may fall behind stdout (the stand-in's release mode always lags it; OpenSandbox's
    execd delivered stderr first every time here): then the cursor, taken right after the record,
    lands inside that record in the ring, or (a 9-byte warning ending in LF) right after the warning,
    where the byte before the cursor is an LF as expected; the reattach compares the bytes it read
    last with the ring, finds them after the warning and resumes right after them. When stderr came
    first the cursor agrees with the ring and nothing is re-derived. Either way: the record once,
    and the second channel ends right after the warning and the record.

    The stand-in holds stdout back `lag` s and stderr twice that: here long enough (stretched by the
    machine's load) that the record, printed a moment after the warning, always overtakes it."""
    if isinstance(released_execd, ReleasedExecd):
        monkeypatch.setattr(released_execd, "lag", patience(0.5))
    stderr_bytes = len(warning.replace("\\n", "\n"))
    address = released_execd.address()
    endpoint = ExecdEndpoint(origin=address["url"], headers={TOKEN_HEADER: address["token"]})
    session_id = ExecdControl(endpoint).create()

    async def converse() -> tuple[int, bytes, list[dict[str, Any]], list[str], ExecdJsonLineChannel]:
        records: list[dict[str, Any]] = []
        told: list[str] = []
        first = asyncio.Event()

        async def on_record(record: dict[str, Any], offset: int) -> None:
            records.append(record)
            first.set()

        async def on_failure(exc: BaseException) -> None:
            first.set()

        async def on_stderr(text: str) -> None:
            told.append(text)

        def channel() -> ExecdJsonLineChannel:
            return ExecdJsonLineChannel(endpoint, session_id=session_id, on_record=on_record, on_failure=on_failure,
                                        on_stderr=on_stderr, label="crossing")

        one = channel()
        await one.connect(command=f"""printf '{warning}' >&2; sleep 0.02; echo '{{"a": 1}}'; read x""")
        await asyncio.wait_for(first.wait(), patience(10))
        await one.detach()  # the cursor counts what has arrived by now: the record, and the warning if it came
        cursor, byte = one.cursor, one.cursor_tail
        two = channel()
        await two.connect(since=cursor, since_tail=byte)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience(10)
        while two.cursor < stderr_bytes + 9 and loop.time() < deadline:  # the replay, read
            await asyncio.sleep(0.02)
        await two.delete()
        return cursor, byte, records, told, two

    cursor, byte, records, told, two = asyncio.run(converse())
    assert records == [{"a": 1}] and byte.endswith(b'{"a": 1}\n')  # the record, once
    mismatch_said = any("does not agree with execd's output ring" in text for text in told)
    assert two.cursor == stderr_bytes + 9  # the ring: the warning, then the record
    if cursor == 9:  # stderr came after the record: counted as arrived, the cursor is 9, inside the ring's record
        assert byte == b'{"a": 1}\n' and two.cursor_mismatches == 1 and mismatch_said
    else:  # stderr came first: the cursor counts it and agrees with the ring
        assert cursor == stderr_bytes + 9 and two.cursor_mismatches == 0 and not mismatch_said
    if isinstance(released_execd, ReleasedExecd):
        assert cursor == 9  # the stand-in's stderr always lags: the disagreement is really found and re-derived


@pytest.mark.unit
def test_an_endpoint_as_the_lifecycle_api_gives_it_with_its_routing_headers(monkeypatch):
    """`host:port/proxy/44772` without a scheme, and whatever headers came with it (JSON)."""
    monkeypatch.setenv("OWSANDBOX_EXECD_URL", "10.0.0.7:8080/sandboxes/sb-1/proxy/44772")
    monkeypatch.setenv("OWSANDBOX_EXECD_HEADERS", json.dumps({"OPEN-SANDBOX-API-KEY": "k",
                                                              "OpenSandbox-Ingress-To": "sb-1-44772"}))
    monkeypatch.setenv("OWSANDBOX_EXECD_TOKEN", "t")
    endpoint = ExecdEndpoint.from_env()
    assert endpoint.origin == "http://10.0.0.7:8080/sandboxes/sb-1/proxy/44772"
    assert endpoint.http_path("/pty") == "/sandboxes/sb-1/proxy/44772/pty"
    assert endpoint.websocket_uri("/pty/x/ws?pty=0") == "ws://10.0.0.7:8080/sandboxes/sb-1/proxy/44772/pty/x/ws?pty=0"
    assert dict(endpoint.headers) == {"OPEN-SANDBOX-API-KEY": "k", "OpenSandbox-Ingress-To": "sb-1-44772",
                                      TOKEN_HEADER: "t"}
    assert OpenSandboxProvider().endpoint == endpoint
    monkeypatch.setenv("OWSANDBOX_EXECD_HEADERS", '["not", "an object"]')
    with pytest.raises(RuntimeError, match="OWSANDBOX_EXECD_HEADERS must be a JSON object"):
        ExecdEndpoint.from_env()


def test_refusals_behind_the_servers_proxy_are_execds_own(monkeypatch, tmp_path):
    """Through OpenSandbox's server proxy a refused WebSocket is accepted, then closed with 1008:
    the channel and the pipe name the same 401, 404 and 409 as when execd answers directly."""
    from owsandbox.channel import channel as channel_module
    from owsandbox.channel.errors import ExecdAlreadyConnected, ExecdNotFound, ExecdUnauthorized

    monkeypatch.setattr(channel_module, "BUSY_RETRY_SECONDS", 0.6)
    server = ReleasedExecd("tok", tcp_host="127.0.0.1", cwd=str(tmp_path), proxy_refusals=True)
    server.start()
    url = server.address()["url"][len("http://"):]  # as the lifecycle API gives it: no scheme
    good = ExecdEndpoint(origin=url, headers={TOKEN_HEADER: "tok"})
    held = ExecdControl(good).create()

    async def failure(endpoint: ExecdEndpoint, session_id: str) -> BaseException:
        async def ignore(*_: Any) -> None:
            pass

        channel = ExecdJsonLineChannel(endpoint, session_id=session_id, on_record=ignore, on_failure=ignore)
        try:
            await channel.connect()
        except Exception as exc:  # noqa: BLE001 - the test looks at which
            return exc
        finally:
            await channel.detach()
        raise AssertionError("connected")

    async def refusals() -> list[BaseException]:
        async def ignore(*_: Any) -> None:
            pass

        holder = ExecdJsonLineChannel(good, session_id=held, on_record=ignore, on_failure=ignore)
        await holder.connect()
        try:
            return [await failure(good, "no-such-session"),
                    await failure(ExecdEndpoint(origin=url, headers={TOKEN_HEADER: "wrong"}), held),
                    await failure(good, held)]
        finally:
            await holder.delete()

    try:
        missing, unauthorized, busy = asyncio.run(refusals())
        assert isinstance(missing, ExecdNotFound) and isinstance(unauthorized, ExecdUnauthorized)
        assert isinstance(busy, ExecdAlreadyConnected) and "closed the WebSocket with 1008" in str(busy)
    finally:
        server.stop()


def test_a_reattach_that_cannot_learn_whether_the_program_runs_is_not_tried(released_execd):
    """Before a reattach the kernel asks execd whether the program still runs (a released execd would
    start an ended one again). execd not knowing the session is an answer (the connection says it);
    no answer at all refuses the reattach, naming why, rather than risk running the program twice."""
    from owsandbox.kernel.attach.loop import session_status
    from owsandbox.kernel.errors import AttachFailed

    address = released_execd.address()
    endpoint = ExecdEndpoint(origin=address["url"], headers={TOKEN_HEADER: address["token"]})
    assert session_status(endpoint, "0123456789abcdef") is None
    silent = ExecdEndpoint(origin=f"http://127.0.0.1:{free_port()}", headers={TOKEN_HEADER: address["token"]})
    with pytest.raises(AttachFailed, match="could not ask execd whether session 01234567 still runs .* not attaching"):
        session_status(silent, "0123456789abcdef")
    wrong_token = ExecdEndpoint(origin=address["url"], headers={TOKEN_HEADER: "not-the-token"})
    with pytest.raises(AttachFailed, match="could not ask execd whether"):
        session_status(wrong_token, "0123456789abcdef")
