"""The `%attach` WebSocket cut at ~50 random moments: every record arrives once, in order, across all cuts.

A real execd-compatible server (the runner box's `ExecdServer`, on a Unix socket in a temporary
folder, with a token) runs a small program that writes numbered JSON records, in two ways: whole
lines in fast bursts with stderr lines in between ("lines"), or each record in three pieces a
millisecond apart, so that cuts land inside records ("pieces"). A channel attaches; after a delay
drawn from a seeded RNG the connection is cut, either abruptly (the TCP transport aborted: no Close
frame, as a dropped network) or politely (`detach()`), and a new channel attaches with
`since=<old channel's cursor>`. After the 50th cut the program is told to stop; it writes a last
record naming its last number and exits, and the last channel reads to the exit. The numbers
delivered must be exactly 1..N, and the stderr lines each there exactly once, in order; and execd's
ring must hold every line whole (the other stream's bytes never in the middle of one).

Each drill runs with a busy loop on every core (`busy_machine`), since the gaps it looks for open when
threads are late: a pump that falls behind reads a full pipe in pieces that end inside lines. Five
seeds, each in both modes; OWSANDBOX_FAULTS_SEED=N runs seed N alone.
"""

from __future__ import annotations

import asyncio
import random
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from owsandbox.box.execd.endpoint import ExecdServer
from owsandbox.channel import ExecdControl, ExecdEndpoint, ExecdJsonLineChannel
from owsandbox.channel.endpoint import TOKEN_HEADER
from owsandbox.channel.errors import ChannelDetached, ProgramExited

from .helpers import busy_machine, seeds_from_env

pytestmark = pytest.mark.system

SEEDS = seeds_from_env((777, 1, 2, 3, 4))
CUTS = 50
HOG_SECONDS = 300  # the most a drill's CPU hogs live, should the test die without its cleanup
TOKEN = "faults-token"

# Numbered records; stops when the file STOP exists, after a last record naming the last number.
# "lines": each record one write, in bursts of 10 with a 2 ms pause (at most about 200 kB/s: the 1 MiB
#   replay ring holds five seconds while nobody is attached, which a reconnection on a machine at load
#   20 could take), and a stderr line after every 13th record.
# "pieces": each record written in three pieces 1 ms apart, so that cuts often land inside a record
#   (the decoder holds a partial line, and the cursor must point at its start); no stderr, as the
#   channel's docs require for records split across writes.
PROGRAM = r'''
import os, sys, time
stop, mode = sys.argv[1], sys.argv[2]
n = 0
while True:
    n += 1
    line = b'{"n":%d,"pad":"%s"}\n' % (n, b"x" * (n % 23))
    if mode == "lines":
        os.write(1, line)
        if n % 13 == 0:
            os.write(2, b"warn %d\n" % n)
        pause = n % 10 == 0 and 0.002
    else:
        third = len(line) // 3
        for piece in (line[:third], line[third:2 * third]):
            os.write(1, piece)
            time.sleep(0.001)
        os.write(1, line[2 * third:])
        pause = 0.001
    if pause:
        time.sleep(pause)
        if os.path.exists(stop):
            break
os.write(1, b'{"end":true,"last":%d}\n' % n)
'''


class Collector:
    """What every channel delivered, in order; callbacks that never suspend (a record counts as
    delivered once its callback returned)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self.failures: list[BaseException] = []
        self.changed = asyncio.Event()

    async def on_record(self, value: dict[str, Any], offset: int) -> None:
        self.records.append(value)
        self.changed.set()

    async def on_stderr(self, text: str) -> None:
        self.stderr.append(text)
        self.changed.set()

    async def on_failure(self, exc: BaseException) -> None:
        self.failures.append(exc)
        self.changed.set()

    async def until(self, predicate, timeout: float = 20.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise AssertionError(f"timed out; {len(self.records)} records, failures {self.failures}")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), min(remaining, 0.5))
            except asyncio.TimeoutError:
                pass


@pytest.fixture
def server():
    folder = Path(tempfile.mkdtemp(prefix="ows-cuts-"))  # short: a Unix socket path has a length limit
    execd = ExecdServer(token=TOKEN, unix_path=str(folder / "execd.sock"), cwd=str(folder))
    execd.start()
    try:
        yield execd, folder
    finally:
        execd.stop()
        shutil.rmtree(folder, ignore_errors=True)


WHOLE_LINE = re.compile(rb'\{"n":\d+,"pad":"x*"\}|\{"end":true,"last":\d+\}|warn \d+')  # what PROGRAM writes


def cut_lines(ring: bytes, first: int) -> list[bytes]:
    """The lines of `ring` (whose first byte is output offset `first`) that are neither a whole record
    of PROGRAM nor a whole stderr line of it: [] when no line was cut by the other stream."""
    lines = ring.split(b"\n")[:-1]
    if first > 0:
        lines = lines[1:]  # the ring's first line may have lost its start to the ring's bound
    return [line for line in lines if not WHOLE_LINE.fullmatch(line)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["lines", "pieces"])
@pytest.mark.parametrize("seed", SEEDS)
def test_50_cuts_deliver_every_record_once_in_order(server, mode: str, seed: int) -> None:
    print(f"[faults] seed={seed} (replay with OWSANDBOX_FAULTS_SEED={seed})")
    rng = random.Random(seed)
    execd, folder = server
    endpoint = ExecdEndpoint(unix_socket=execd.address()["unix_socket"], headers={TOKEN_HEADER: TOKEN})
    script, stop = folder / "numbers.py", folder / "stop"
    script.write_text(PROGRAM)
    command = shlex.join(["exec", sys.executable, str(script), str(stop), mode])
    session_id = ExecdControl(endpoint).create(command=command)
    collector = Collector()
    kinds: list[str] = []
    partial_cuts = 0  # cuts that left the decoder holding part of a record: the cursor is that line's start

    def new_channel() -> ExecdJsonLineChannel:
        return ExecdJsonLineChannel(endpoint, session_id=session_id, on_record=collector.on_record,
                                    on_failure=collector.on_failure, on_stderr=collector.on_stderr, label="numbers")

    async def body() -> None:
        nonlocal partial_cuts
        channel = new_channel()
        await channel.connect(since=0)
        for cut in range(CUTS):
            before = len(collector.records)
            roll = rng.random()
            delay = 0.0 if roll < 0.1 else rng.uniform(0.0, 0.005) if roll < 0.3 else rng.uniform(0.0, 0.1)
            await asyncio.sleep(delay)
            failures = len(collector.failures)
            if rng.random() < 0.5:
                kinds.append("abort")
                ws = channel._ws  # the connection: abort its transport, as a network that drops would
                assert ws is not None, f"seed={seed}: cut {cut}: not connected ({collector.failures[-1:]})"
                ws.transport.abort()
                await collector.until(lambda failures=failures: len(collector.failures) > failures, 10)
                failure = collector.failures[-1]
                assert type(failure) is ChannelDetached and "without a closing handshake" in str(failure), \
                    f"seed={seed}: cut {cut}: {failure!r}"
            else:
                kinds.append("detach")
                await channel.detach()
                assert len(collector.failures) == failures, f"seed={seed}: {collector.failures[-1]!r}"
            cursor = channel.cursor
            partial_cuts += cursor < channel._decoder.position
            status = await channel.status()
            assert status["output_offset"] >= cursor, (seed, cut, status, cursor)
            channel = new_channel()
            await channel.connect(since=cursor)
            if cut % 10 == 9:  # now and then, make sure records still flow before the next cut
                await collector.until(lambda before=before: len(collector.records) > before + 5, 10)
        stop.write_text("stop")
        failures = len(collector.failures)
        await collector.until(lambda: len(collector.failures) > failures, 30)
        assert isinstance(collector.failures[-1], ProgramExited), f"seed={seed}: {collector.failures[-1]!r}"
        assert collector.failures[-1].exit_code == 0
        session = execd.sessions.get(session_id)
        assert session is not None
        cut = cut_lines(session.ring.read_from(0)[1], session.ring.oldest)
        assert not cut, f"seed={seed}: lines cut in execd's ring: {cut[:3]}"
        await channel.delete()

    started = time.monotonic()
    with busy_machine(HOG_SECONDS):
        asyncio.run(asyncio.wait_for(body(), 240))
    elapsed = time.monotonic() - started

    values = collector.records
    assert values and values[-1].get("end") is True, f"seed={seed}: the last record is {values[-1:]}"
    last = values[-1]["last"]
    numbers = [value["n"] for value in values[:-1]]
    if numbers != list(range(1, last + 1)):
        seen: set[int] = set()
        repeats = [n for n in numbers if n in seen or seen.add(n)]  # type: ignore[func-returns-value]
        missing = sorted(set(range(1, last + 1)) - set(numbers))
        raise AssertionError(f"seed={seed}: {len(numbers)} records for 1..{last}; missing {missing[:20]}, "
                             f"repeated {repeats[:20]}, out of order at "
                             f"{next((i for i in range(1, len(numbers)) if numbers[i] != numbers[i - 1] + 1), None)}")
    assert all(value["pad"] == "x" * (value["n"] % 23) for value in values[:-1]), f"seed={seed}: a mangled record"
    stderr_lines = "".join(collector.stderr).splitlines()
    expected_stderr = [f"warn {n}" for n in range(13, last + 1, 13)] if mode == "lines" else []
    assert stderr_lines == expected_stderr, \
        f"seed={seed}: stderr lines {stderr_lines[:5]}... ({len(stderr_lines)}, expected {last // 13})"
    print(f"[faults] seed={seed} mode={mode}: {CUTS} cuts ({kinds.count('abort')} aborted, "
          f"{kinds.count('detach')} detached) "
          f"over {last} records in {elapsed:.1f} s; {partial_cuts} cuts inside a record")
    if mode == "pieces":
        assert partial_cuts > 0, f"seed={seed}: no cut landed inside a record"
