"""%attach speed: small JSON records per second end to end through the channel, and reattach time.

A program in a pipe session of the box's execd-compatible endpoint prints N small records as fast
as it can; an `ExecdJsonLineChannel` receives them all. Then the program keeps ticking while the
channel detaches and reattaches with `since=cursor`; the time from starting the reattach to the
first record delivered is measured.

Run: `python benchmarks/attach_bench.py [--records N] [--rounds N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from owsandbox.box.execd.endpoint import ExecdServer
from owsandbox.channel import ExecdControl, ExecdEndpoint, ExecdJsonLineChannel
from owsandbox.channel.endpoint import TOKEN_HEADER

PRODUCER = ("import json, sys\n"
            "w = sys.stdout.write\n"
            "for n in range(1, {count} + 1):\n"
            "    w(json.dumps({{'type': 'event', 'n': n, 'text': 'x' * 40}}) + '\\n')\n"
            "sys.stdout.flush()\n"
            "import time; time.sleep(3600)\n")
TICKER = ("import json, sys, time\n"
          "n = 0\n"
          "while True:\n"
          "    n += 1; print(json.dumps({'type': 'tick', 'n': n}), flush=True); time.sleep(0.01)\n")


async def throughput(endpoint: ExecdEndpoint, folder: Path, count: int) -> tuple[float, int]:
    script = folder / "producer.py"
    script.write_text(PRODUCER.format(count=count))
    session = ExecdControl(endpoint).create(cwd=str(folder), command=f"{sys.executable} {script}")
    done = asyncio.Event()
    received = 0

    async def on_record(record: dict, _offset: int) -> None:
        nonlocal received
        received += 1
        if record.get("n") == count:
            done.set()

    async def on_failure(exc: BaseException) -> None:
        done.set()

    channel = ExecdJsonLineChannel(endpoint, session_id=session, on_record=on_record, on_failure=on_failure)
    started = time.perf_counter()
    await channel.connect(since=0)
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - started
    await channel.delete()
    return count / elapsed, received


async def reattach(endpoint: ExecdEndpoint, folder: Path, rounds: int) -> list[float]:
    script = folder / "ticker.py"
    script.write_text(TICKER)
    session = ExecdControl(endpoint).create(cwd=str(folder), command=f"{sys.executable} {script}")
    cursor = 0
    times = []
    for _ in range(rounds + 1):
        first = asyncio.Event()

        async def on_record(record: dict, _offset: int, first: asyncio.Event = first) -> None:
            first.set()

        async def on_failure(exc: BaseException) -> None:
            raise SystemExit(f"the ticker failed: {exc}")

        channel = ExecdJsonLineChannel(endpoint, session_id=session, on_record=on_record, on_failure=on_failure)
        started = time.perf_counter()
        await channel.connect(since=cursor)
        await asyncio.wait_for(first.wait(), 10)
        times.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.1)
        await channel.detach()
        cursor = channel.cursor
        await asyncio.sleep(0.1)  # records pile up while detached: the reattach replays them
    await ExecdJsonLineChannel(endpoint, session_id=session, on_record=on_record, on_failure=on_failure).delete()
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = ExecdServer("bench-token", unix_path=str(folder / "execd.sock"), cwd=tmp)
        server.start()
        try:
            endpoint = ExecdEndpoint(unix_socket=str(folder / "execd.sock"), headers={TOKEN_HEADER: "bench-token"})
            rate, received = asyncio.run(throughput(endpoint, folder, args.records))
            print(f"records end to end: {rate:,.0f} records/s ({received:,} of {args.records:,} received)")
            times = sorted(asyncio.run(reattach(endpoint, folder, args.rounds)))
            print(f"reattach with since to first record: median {statistics.median(times):.1f} ms, "
                  f"max {times[-1]:.1f} ms ({args.rounds} rounds)")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
