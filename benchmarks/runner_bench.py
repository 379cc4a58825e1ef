"""Runner speed and memory through a real relay: round trip, throughput, RSS under 1 GB of output.

Run: `python benchmarks/runner_bench.py [--rounds N] [--flood-bytes N]`. Prints one line a figure.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from owsandbox.host.bundle import build_runner_zipapp
from owsandbox.host.client import RunnerClient
from owsandbox.host.providers.local import LocalProvider


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def round_trip(client: RunnerClient, rounds: int) -> list[float]:
    client.call("shell.run", {"command": "true"}, timeout=30)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        client.call("shell.run", {"command": "true"}, timeout=30)
        times.append((time.perf_counter() - started) * 1000)
    return times


def throughput(client: RunnerClient) -> dict:
    expected = "".join(f"{i}\n" for i in range(1, 3000001))
    frames: list[dict] = []
    started = time.perf_counter()
    result = client.call("shell.run", {"command": "seq 1 3000000"}, timeout=120, on_notification=frames.append)
    elapsed = time.perf_counter() - started
    live = "".join(f["text"] for f in frames)
    offset, contiguous = 0, True
    for frame in frames:
        contiguous = contiguous and frame["offset"] == offset
        offset += len(frame["text"])
    full = Path(result["log_path"]).read_text() if result.get("log_path") else result["output"]
    complete = full == expected and live == expected[: len(live)]
    return {"seconds": elapsed, "mb_s": len(expected) / elapsed / 1e6, "live_chars": len(live),
            "total_chars": len(expected), "contiguous": contiguous, "complete": complete}


def flood(client: RunnerClient, pid: int, size: int) -> dict:
    peak = rss_kb(pid)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.02):
            peak = max(peak, rss_kb(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    received = 0

    def count(frame: dict) -> None:
        nonlocal received
        received += len(frame["text"])

    started = time.perf_counter()
    result = client.call("shell.run", {"command": f"head -c {size} /dev/zero | tr '\\0' x | fold -w 99"},
                         timeout=1200, on_notification=count)
    elapsed = time.perf_counter() - started
    stop.set()
    sampler.join()
    return {"bytes": result["output_bytes"], "seconds": elapsed, "peak_rss_mb": peak / 1024,
            "live_chars": received, "truncated": result["truncated"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--flood-bytes", type=int, default=1_000_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        provider = LocalProvider(cwd=tmp, runner_path=build_runner_zipapp(Path(tmp) / "dist"))
        provider.create()
        client = RunnerClient(provider.open_runner)
        try:
            client.connect()
            pid = client.hello["pid"]
            times = sorted(round_trip(client, args.rounds))
            print(f"shell.run true round trip: median {statistics.median(times):.3f} ms, "
                  f"p90 {times[int(len(times) * 0.9)]:.3f} ms ({args.rounds} rounds)")
            seq = throughput(client)
            print(f"seq 1 3000000 ({seq['total_chars'] / 1e6:.1f} MB): {seq['mb_s']:.1f} MB/s for the result "
                  f"({seq['seconds']:.3f} s); live view {seq['live_chars']} chars, contiguous={seq['contiguous']}, "
                  f"record complete={seq['complete']}")
            print(f"daemon RSS idle: {rss_kb(pid) / 1024:.1f} MB")
            big = flood(client, pid, args.flood_bytes)
            print(f"flood of {big['bytes'] / 1e9:.2f} GB: peak daemon RSS {big['peak_rss_mb']:.1f} MB, "
                  f"{big['bytes'] / big['seconds'] / 1e6:.0f} MB/s, live view {big['live_chars']} chars")
        finally:
            client.close()
            provider.destroy()


if __name__ == "__main__":
    main()
