"""The channel against the runner box's own execd-compatible server, with real programs behind it.

The same behaviours as against the scripted peer, now end to end: a Python program speaking JSON
lines runs under `bash -c` in pipe mode, and the channel reads it, writes to it, detaches and comes
back without losing or repeating a record, sees it exit, loses it to a takeover, and deletes it,
over the server's Unix socket and over TCP.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from owsandbox.box.execd.endpoint import ExecdServer
from owsandbox.channel.channel import ExecdJsonLineChannel
from owsandbox.channel.control import ExecdControl
from owsandbox.channel.endpoint import TOKEN_HEADER, ExecdEndpoint
from owsandbox.channel.errors import (
    ChannelDetached,
    ChannelTakenOver,
    ExecdAlreadyConnected,
    ExecdNotFound,
    ExecdUnauthorized,
    ProgramExited,
)
from tests.test_channel_scripted import Adapter, run

TOKEN = "box-token"
T = TypeVar("T")

# A JSON-lines program: with "tick" it writes {"n": k} every 10 ms; it answers each stdin record with
# {"id", "echo"}, writes "warn" to stderr first when asked, and exits when told (stderr first).
PROGRAM = r'''
import json, sys, threading, time
lock = threading.Lock()
def say(value):
    with lock:
        sys.stdout.write(json.dumps(value) + "\n")
        sys.stdout.flush()
def tick():
    n = 0
    while True:
        n += 1
        say({"n": n})
        time.sleep(0.01)
if sys.argv[1:] == ["tick"]:
    threading.Thread(target=tick, daemon=True).start()
for line in sys.stdin:
    request = json.loads(line)
    if "warn" in request:
        sys.stderr.write(request["warn"] + "\n")
        sys.stderr.flush()
    if "exit" in request:
        sys.exit(request["exit"])
    say({"id": request.get("id"), "echo": request})
'''


class Box:
    def __init__(self, server: ExecdServer, folder: Path) -> None:
        self.server = server
        self.script = folder / "program.py"
        self.script.write_text(PROGRAM)
        address = server.address()
        self.unix = ExecdEndpoint(unix_socket=address["unix_socket"], headers={TOKEN_HEADER: TOKEN})
        self.tcp = ExecdEndpoint(origin=address["url"], headers={TOKEN_HEADER: TOKEN})

    def command(self, *args: str) -> str:
        return shlex.join(["exec", sys.executable, str(self.script), *args])


@pytest.fixture
def box() -> Iterator[Box]:
    folder = Path(tempfile.mkdtemp(prefix="ows-execd-"))  # short: a Unix socket path has a length limit
    server = ExecdServer(token=TOKEN, unix_path=str(folder / "execd.sock"), tcp_host="127.0.0.1", cwd=str(folder))
    server.start()
    try:
        yield Box(server, folder)
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


async def create(endpoint: ExecdEndpoint, command: str) -> str:
    return await asyncio.to_thread(ExecdControl(endpoint).create, None, command)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_records_requests_and_the_cursor_end_to_end(box: Box, transport: str) -> None:
    endpoint = box.unix if transport == "unix" else box.tcp

    async def body() -> None:
        session_id = await create(endpoint, box.command())
        adapter = Adapter()
        channel = adapter.channel(endpoint, session_id)
        await channel.connect()
        assert channel.mode == "pipe"
        answer = channel.register_request("r1")
        await channel.send({"id": "r1", "text": "line\u2028separator ✓", "warn": "careful"})
        await adapter.until(lambda: len(adapter.records) == 1 and "careful\n" in "".join(adapter.stderr))
        record = adapter.values()[0]
        assert record == {"id": "r1", "echo": {"id": "r1", "text": "line\u2028separator ✓", "warn": "careful"}}
        assert not answer.done(), "the channel settled a request by itself"
        assert channel.complete_request("r1", record) and (await answer) is record
        status = await channel.status()
        assert status["running"] is True
        assert channel.cursor == status["output_offset"], "the cursor must count stderr bytes as execd does"
        await channel.detach()
        assert await channel.delete() is True

    run(body())


def test_detach_is_prompt_and_a_reattach_loses_and_repeats_nothing(box: Box) -> None:
    async def body() -> None:
        session_id = await create(box.unix, box.command("tick"))
        adapter = Adapter()
        channel = adapter.channel(box.unix, session_id)
        await channel.connect()
        await adapter.until(lambda: len(adapter.records) >= 5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await channel.detach()
        assert loop.time() - started < 1.0
        seen = len(adapter.records)
        offset = (await channel.status())["output_offset"]
        assert offset >= channel.cursor  # the program ran on while detached

        await channel.connect(since=channel.cursor)
        await adapter.until(lambda: len(adapter.records) >= seen + 10)
        numbers = [value["n"] for value in adapter.values()]
        assert numbers == list(range(1, len(numbers) + 1))
        await channel.detach()

        other = Adapter()  # a fresh channel from the old cursor (the kernel's %attach after a restart)
        again = other.channel(box.tcp, session_id)
        await again.connect(since=channel.cursor)
        await other.until(lambda: len(other.records) >= 3)
        assert other.values()[0]["n"] == numbers[-1] + 1
        assert await again.delete() is True
        assert await again.delete() is False
        with pytest.raises(ExecdNotFound):
            await asyncio.to_thread(ExecdControl(box.unix).status, session_id)

    run(body())


def test_an_exit_reports_its_code_and_stderr_tail(box: Box) -> None:
    async def body() -> None:
        session_id = await create(box.unix, box.command())
        adapter = Adapter()
        channel = adapter.channel(box.unix, session_id)
        await channel.connect()
        waiting = channel.register_request("never")
        await channel.send({"exit": 3, "warn": "fatal: config missing"})
        await adapter.until(lambda: bool(adapter.failures))
        failure = adapter.failures[0]
        assert isinstance(failure, ProgramExited) and failure.exit_code == 3
        assert "tool exited with code 3" in str(failure) and "fatal: config missing" in str(failure)
        with pytest.raises(ProgramExited):
            await waiting
        with pytest.raises(ChannelDetached, match="not connected"):
            await channel.send({"id": 1})
        assert (await asyncio.to_thread(ExecdControl(box.unix).status, session_id))["running"] is False

    run(body())


def test_a_signal_reaches_the_program(box: Box) -> None:
    async def body() -> None:
        session_id = await create(box.tcp, box.command("tick"))
        adapter = Adapter()
        channel = adapter.channel(box.tcp, session_id)
        await channel.connect()
        await adapter.until(lambda: len(adapter.records) >= 1)
        await channel.send_signal("SIGTERM")
        await adapter.until(lambda: bool(adapter.failures))
        assert isinstance(adapter.failures[0], ProgramExited) and adapter.failures[0].exit_code == -1

    run(body())


def test_a_takeover_ends_the_old_channel_and_409_without_it(box: Box) -> None:
    async def body() -> None:
        session_id = await create(box.unix, box.command("tick"))
        old_adapter, new_adapter = Adapter(), Adapter()
        old = old_adapter.channel(box.unix, session_id)
        await old.connect()
        await old_adapter.until(lambda: len(old_adapter.records) >= 2)
        with pytest.raises(ExecdAlreadyConnected):
            await new_adapter.channel(box.tcp, session_id).connect(since=old.cursor, takeover=False)
        assert old.is_connected
        new = new_adapter.channel(box.tcp, session_id)
        await new.connect(since=old.cursor)
        await old_adapter.until(lambda: bool(old_adapter.failures))
        assert isinstance(old_adapter.failures[0], ChannelTakenOver)
        await new_adapter.until(lambda: len(new_adapter.records) >= 3)
        assert new.is_connected and not old.is_connected
        assert await new.delete() is True

    run(body())


def test_control_lists_sessions_and_refuses_a_wrong_token(box: Box) -> None:
    control = ExecdControl(box.unix)
    session_id = control.create(command=box.command())
    assert session_id in [session["session_id"] for session in control.list_sessions()]
    assert control.status(session_id)["running"] is False  # nothing runs before the first WebSocket
    with pytest.raises(ExecdUnauthorized, match="token is wrong"):
        ExecdControl(ExecdEndpoint(unix_socket=box.unix.unix_socket, headers={TOKEN_HEADER: "nope"})).status(
            session_id)
    with pytest.raises(ExecdUnauthorized, match="token is missing"):
        ExecdControl(ExecdEndpoint(origin=box.tcp.origin)).list_sessions()
    assert control.delete(session_id) is True
    assert control.delete(session_id) is False
    assert os.path.exists(box.unix.unix_socket or "")


def test_a_thread_based_caller_drives_the_channel_on_a_loop_thread(box: Box) -> None:
    """The kernel's way: one event loop in its own thread, coroutines submitted from the caller's."""
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="channel-loop", daemon=True)
    thread.start()

    def call(coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=10)

    records: list[dict[str, Any]] = []
    arrived = threading.Event()

    async def on_record(value: dict[str, Any], offset: int) -> None:
        assert threading.current_thread() is thread  # callbacks run on the loop's thread
        records.append(value)
        arrived.set()

    async def on_failure(exc: BaseException) -> None:
        raise AssertionError(f"no failure expected: {exc!r}")

    async def ask(channel: ExecdJsonLineChannel, record: dict[str, Any]) -> asyncio.Future[Any]:
        future = channel.register_request(record["id"])  # futures belong to the loop: register on it
        await channel.send(record)
        return future

    async def wait(future: asyncio.Future[Any]) -> Any:  # a loop's future is awaited on that loop
        return await asyncio.wait_for(future, 5)

    try:
        session_id = ExecdControl(box.unix).create(command=box.command())
        channel = ExecdJsonLineChannel(box.unix, session_id=session_id, on_record=on_record, on_failure=on_failure)
        call(channel.connect())
        pending = call(ask(channel, {"id": 1, "q": "ping"}))
        assert arrived.wait(10)
        assert records == [{"id": 1, "echo": {"id": 1, "q": "ping"}}]
        loop.call_soon_threadsafe(channel.complete_request, 1, records[0])
        assert call(wait(pending)) == records[0]
        call(channel.detach())
        assert call(channel.delete()) is True
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
