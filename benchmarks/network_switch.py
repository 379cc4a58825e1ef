"""`%network on` to the box's first byte out, through a real kernel on bubblewrap (as root).

The kernel runs in a network namespace of the benchmark's own, and the box's one destination is a
server in another (tests/netns.py: a veth pair with TEST-NET-2 addresses inside the two namespaces
only), so no byte goes anywhere else. Each round sends `%network on` and, queued right behind it, a
cell whose command connects to the server and sends one byte; the server notes when that byte
arrives (CLOCK_MONOTONIC is the machine's, the same in every namespace). The figure is the time from
sending `%network on` to that byte's arrival: what a user waits from asking for the network to their
first request leaving the box. Also: `%network on` alone (request to reply) and `%network off`.

Run as root: `python benchmarks/network_switch.py [--rounds N]` from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from owsandbox.kernelspec import kernel_argv  # noqa: E402
from tests.kernel_session import KernelSession  # noqa: E402
from tests.netns import SERVER_ADDRESS, own_network  # noqa: E402

PORT = 9090
#: Prints the monotonic time at which each connection's first byte arrives, and answers it.
TIMING_SERVER = r"""
import socket, sys, time
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    connection, _ = server.accept()
    with connection:
        if connection.recv(1):
            print(time.monotonic(), flush=True)
            connection.sendall(b"y")
"""
FIRST_BYTE = (f"python3 -c \"import socket; s = socket.create_connection(('{SERVER_ADDRESS}', {PORT}), 5); "
              "s.sendall(b'x'); assert s.recv(1) == b'y'\"")


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms (min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    if os.getuid() != 0:
        print("run as root: the benchmark makes network namespaces of its own", file=sys.stderr)
        return 2
    with own_network() as network, tempfile.TemporaryDirectory(prefix="owsbx-netbench-") as folder:
        timing = subprocess.Popen(["ip", "netns", "exec", network.server, sys.executable, "-c", TIMING_SERVER,
                                   SERVER_ADDRESS, str(PORT)], stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        assert timing.stdout is not None and timing.stdout.readline().strip() == "listening"
        spec = Path(folder, "kernels", "owsandbox-bench-net")
        spec.mkdir(parents=True)
        spec.joinpath("kernel.json").write_text(json.dumps({
            "argv": network.in_client(kernel_argv(sys.executable)), "display_name": "bench", "language": "bash",
            "interrupt_mode": "message", "env": {"OWSANDBOX_PROVIDER": "bwrap"}}))
        os.environ["JUPYTER_PATH"] = folder + os.pathsep + os.environ.get("JUPYTER_PATH", "")
        workspace = Path(folder, "work")
        workspace.mkdir()
        kernel = KernelSession(workspace, kernel_name="owsandbox-bench-net", transport="ipc",
                               ip=str(Path(folder, "kernel")))
        to_first_byte, on_alone, off_alone = [], [], []
        try:
            assert kernel.run("true").status == "ok"
            for _ in range(args.rounds):
                sent = time.monotonic()
                on_id = kernel.send("%network on")
                cell_id = kernel.send(FIRST_BYTE)
                runs = kernel.collect_all([on_id, cell_id])
                assert runs[cell_id].status == "ok", runs[cell_id].outputs
                arrived = float(timing.stdout.readline())
                to_first_byte.append(arrived - sent)
                for setting, times in (("off", off_alone), ("on", on_alone), ("off", off_alone)):
                    started = time.monotonic()
                    assert kernel.run(f"%network {setting}").status == "ok"
                    times.append(time.monotonic() - started)
        finally:
            kernel.close()
            os.killpg(timing.pid, signal.SIGKILL)
            timing.wait()
    print(f"%network on -> first byte out of the box, median of {args.rounds}: {median_ms(to_first_byte)}")
    print(f"%network on alone (request -> reply): {median_ms(on_alone)}")
    print(f"%network off alone (request -> reply): {median_ms(off_alone)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
