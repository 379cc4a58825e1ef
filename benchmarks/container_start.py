"""The `container` provider, measured: kernel start to first cell result, a cell's round trip,
`seq 1 3000000` through the kernel, and the removal of the container at shutdown.

The image must be there already (nothing is pulled or built): by default the tests' Debian 12 image
(`localhost/owsandbox-test-bookworm:1`, built by the container tests). Where podman needs a
containers.conf of its own (Debian's podman with runc on a hybrid cgroup host: `default_ulimits = []`),
pass it in `CONTAINERS_CONF` as usual.

* provider: `ContainerProvider.create()` + connect + `true` (first result), the median round trip of
  `true` through the executor, and the seconds of `rm -f` in `destroy()`;
* kernel: `owsandbox install --prefix TMP --image IMAGE --engine ENGINE`, then `KernelManager.start_kernel()`
  until the first cell (`true`) has finished; the median and p90 of `true` cells, request → reply;
  `seq 1 N` (with `%output limit` above its size) request → reply and idle, and the lines that came;
  `shutdown_kernel()` until the container is gone.

Run: `python benchmarks/container_start.py [--image IMAGE] [--engine podman] [--rounds 3] [--runs 200]`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import Kernel, Session, check_ok, expected_chars, seq_run  # noqa: E402

from owsandbox.host.providers.container import ContainerProvider  # noqa: E402
from owsandbox.host.workspace import RunnerWorkspace  # noqa: E402

SPEC = "owsandbox-container-bench"


def provider_rounds(args: argparse.Namespace, folder: str) -> None:
    firsts, removals = [], []
    for _ in range(args.rounds):
        started = time.perf_counter()
        workspace = RunnerWorkspace(ContainerProvider(folder, image=args.image, engine=args.engine), folder)
        try:
            assert workspace.executor.run("true")["exit_code"] == 0
            firsts.append(time.perf_counter() - started)
            trips = []
            for _ in range(args.runs):
                sent = time.perf_counter()
                workspace.executor.run("true")
                trips.append(time.perf_counter() - sent)
        finally:
            workspace.close()
        removals.append(workspace.provider.removal_seconds or 0.0)
    print(f"provider: create → first result median {statistics.median(firsts):.3f} s (of {args.rounds}: "
          f"{', '.join(f'{t:.3f}' for t in firsts)}); round trip of `true` median "
          f"{statistics.median(trips) * 1000:.2f} ms; rm -f at destroy median {statistics.median(removals):.3f} s")


def containers_of(engine: str, folder: str) -> list[str]:
    done = subprocess.run([engine, "ps", "--all", "--filter", f"label=owsandbox.workspace={folder}", "--format",
                           "{{.Names}}"], capture_output=True, text=True)
    return done.stdout.split()


def kernel_rounds(args: argparse.Namespace, root: Path) -> None:
    prefix = root / "prefix"
    install = [sys.executable, "-m", "owsandbox.cli", "install", "--prefix", str(prefix), "--name", SPEC,
               "--image", args.image, "--engine", args.engine]
    subprocess.run(install, check=True, capture_output=True)
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    kernel = Kernel("owsandbox", "owsandbox (container)", SPEC)
    folder = Path(tempfile.mkdtemp(prefix="ws-", dir=root))
    env = {k: v for k, v in os.environ.items() if k not in ("OWSANDBOX_PROVIDER", "PYTHONUNBUFFERED")}
    firsts, shutdowns = [], []
    for i in range(args.rounds):
        session = Session(kernel, folder, env)
        try:
            session.wait_for_kernel_info(120)
            session.run("true", timeout=120)
            firsts.append(time.perf_counter() - session.started)
            if i == args.rounds - 1:
                for _ in range(20):
                    session.run("true")
                trips = []
                for _ in range(args.runs):
                    cell = session.run("true")
                    assert cell.reply_at is not None
                    trips.append(cell.reply_at - cell.sent)
                check_ok(session.run(f"%output limit {expected_chars(args.seq) + 1_000_000}"), "%output limit")
                stream, _ = seq_run(session, args.seq, 300)
        finally:
            asked = time.perf_counter()
            session.close()
            while containers_of(args.engine, str(folder)) and time.perf_counter() - asked < 60:
                time.sleep(0.05)
            shutdowns.append(time.perf_counter() - asked)
    trips.sort()
    print(f"kernel: start_kernel() → first cell done median {statistics.median(firsts):.3f} s "
          f"({', '.join(f'{t:.3f}' for t in firsts)})")
    print(f"kernel: `true` request → reply median {statistics.median(trips) * 1000:.2f} ms, "
          f"p90 {trips[int(len(trips) * 0.9)] * 1000:.2f} ms (of {args.runs})")
    mb = stream["received"] / 1e6
    print(f"kernel: seq 1 {args.seq}: {mb:.1f} MB in {stream['seconds']:.3f} s = {mb / stream['seconds']:.2f} MB/s, "
          f"lines missing {stream['missing']}, extra {stream['extra']}")
    print(f"kernel: shutdown_kernel() → no container left, median {statistics.median(shutdowns):.3f} s "
          f"({', '.join(f'{t:.3f}' for t in shutdowns)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="localhost/owsandbox-test-bookworm:1")
    parser.add_argument("--engine", default="podman", choices=("podman", "docker"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seq", type=int, default=3_000_000)
    args = parser.parse_args()
    print(f"{args.engine} {shlex.quote(args.image)}; CONTAINERS_CONF={os.environ.get('CONTAINERS_CONF', '')}")
    with tempfile.TemporaryDirectory(prefix="owsbx-ctr-bench-") as tmp:
        folder = Path(tmp, "provider-ws")
        folder.mkdir()
        provider_rounds(args, str(folder))
        kernel_rounds(args, Path(tmp))


if __name__ == "__main__":
    main()
