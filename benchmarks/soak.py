"""A soak: a lesson's cells on several real kernels at once for minutes, with relay kills, box kills, kernel
restarts and Stops at random points; nothing may be lost or shown twice, and memory must stay flat.

Each kernel (jupyter_client, the installed `owsandbox` kernelspec, its default sandbox) repeats, in a
random order: a cell whose output is checked line by line (`seq 1 N` and a marker: every line once, in
order), a Stop at a random moment of a long cell (the cell ends interrupted or done, and the next cell
works), a kill of the relay between kernel and box (the next cell's output is whole), a kill of the box's
daemon (the running cell may fail as "outcome unknown"; the next one works, on a new box) and a kernel
restart. The kernel's RSS and the box's memory (`usage_request`) are read at the start and every minute
(`--sample-seconds`), and every sample is printed, so that a plateau shows apart from a leak.

Run: `python benchmarks/soak.py [--kernels 10] [--minutes 10] [--seed 1] [--faults stop,relay]` (the
kernelspec installed: `owsandbox install --user`). Prints a line a kernel and the totals; exits 1 if
anything was lost or doubled.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "stat").read_text().rpartition(")")[2].split()[1] == str(pid):
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Tally:
    cells: int = 0
    lost_or_doubled: list[str] = field(default_factory=list)
    stops: int = 0
    relay_kills: int = 0
    box_kills: int = 0
    restarts: int = 0
    unknown_outcomes: int = 0
    rss: list[float] = field(default_factory=list)
    box_memory: list[float] = field(default_factory=list)


class Soaked:
    def __init__(self, name: str, folder: Path, rng: random.Random) -> None:
        self.name = name
        self.folder = folder
        self.rng = rng
        self.km = KernelManager(kernel_name="owsandbox")
        self.km.start_kernel(cwd=str(folder))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.tally = Tally()
        self.run("%output rate off")  # every line is counted here; no server between

    def run(self, code: str, timeout: float = 120, stop_after: float | None = None) -> tuple[dict[str, Any], str]:
        msg_id = self.kc.execute(code, stop_on_error=False)
        if stop_after is not None:
            threading.Timer(stop_after, self._stop).start()
        text = []
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                text.append(msg["content"]["text"])
        while True:
            reply = self.kc.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"], "".join(text)

    def _stop(self) -> None:
        msg = self.kc.session.msg("interrupt_request", {})
        self.kc.control_channel.send(msg)

    def checked_cell(self, number: int) -> None:
        lines = self.rng.randint(1, 20_000)
        reply, text = self.run(f"seq 1 {lines}; echo END-{number}")
        self.tally.cells += 1
        expected = "".join(f"{i}\n" for i in range(1, lines + 1)) + f"END-{number}\n"
        if reply["status"] != "ok":
            if "outcome" in reply.get("evalue", "") or reply.get("ename") in ("SandboxError", "RunnerError"):
                self.tally.unknown_outcomes += 1  # a box killed under it: said, never re-run
                return
            self.tally.lost_or_doubled.append(f"cell {number}: {reply.get('ename')}: {reply.get('evalue')}")
        elif text != expected:
            self.tally.lost_or_doubled.append(f"cell {number}: {len(text)} characters, expected {len(expected)}")

    def stop(self) -> None:
        reply, _ = self.run("sleep 30", stop_after=self.rng.uniform(0, 0.2))
        self.tally.stops += 1
        if reply["status"] == "ok" or reply.get("ename") != "Interrupted":
            self.tally.lost_or_doubled.append(f"a Stop did not end its cell: {reply.get('ename')} "
                                              f"{reply.get('status')}")

    def _processes(self) -> list[int]:
        kernel = self.km.provisioner.process.pid  # type: ignore[union-attr]
        found, todo = [], [kernel]
        while todo:
            for child in children(todo.pop()):
                found.append(child)
                todo.append(child)
        return found

    def kill_relay(self) -> None:
        for pid in self._processes():
            if " attach " in command_line(pid) and "runner" in command_line(pid):
                os.kill(pid, signal.SIGKILL)
                self.tally.relay_kills += 1
                return

    def kill_box(self) -> None:
        """The box's daemon, found by its workspace (after a restart the box is no child of the new kernel)."""
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                line = command_line(int(entry.name))
                if " serve " in line and f"--cwd {self.folder} " in line:
                    os.kill(int(entry.name), signal.SIGKILL)
                    self.tally.box_kills += 1
                    return

    def restart(self) -> None:
        self.km.restart_kernel(now=False)
        self.kc.wait_for_ready(timeout=120)
        self.tally.restarts += 1
        self.run("%output rate off")

    def sample(self) -> None:
        self.tally.rss.append(rss_mib(self.km.provisioner.process.pid))  # type: ignore[union-attr]
        msg = self.kc.session.msg("usage_request", {})
        self.kc.control_channel.send(msg)
        try:
            while True:
                reply = self.kc.control_channel.get_msg(timeout=10)
                if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    self.tally.box_memory.append(reply["content"].get("kernel_memory", 0) / 2**20)
                    return
        except Exception:  # noqa: BLE001 - a box just killed may not answer: no sample
            return

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


FAULTS = ("stop", "relay", "box", "restart")


def soak(kernel: Soaked, deadline: float, faults: tuple[str, ...] = FAULTS, every: float = 60) -> None:
    number = 0
    next_sample = 0.0
    chosen = {"stop": kernel.stop, "relay": kernel.kill_relay, "box": kernel.kill_box, "restart": kernel.restart}
    actions = ([kernel.checked_cell] * 6) + [chosen[name] for name in faults]
    while time.monotonic() < deadline:
        if time.monotonic() >= next_sample:
            kernel.sample()
            next_sample = time.monotonic() + every
        action = kernel.rng.choice(actions)
        number += 1
        if action == kernel.checked_cell:
            kernel.checked_cell(number)
        else:
            action()
            kernel.checked_cell(number)  # after every fault, a checked cell: nothing lost, nothing twice
    kernel.sample()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernels", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help="which of stop,relay,box,restart to make (a kernel restart or a box kill starts a new "
                             "process: leave them out to see one kernel's and one box's memory over the whole soak)")
    parser.add_argument("--sample-seconds", type=float, default=60, help="how often memory is read (default 60)")
    args = parser.parse_args()
    faults = tuple(name for name in args.faults.split(",") if name)
    unknown = [name for name in faults if name not in FAULTS]
    if unknown:
        parser.error(f"--faults: no fault named {', '.join(unknown)} (there are {', '.join(FAULTS)})")
    with tempfile.TemporaryDirectory(prefix="owsandbox-soak-") as base:
        kernels = []
        for index in range(args.kernels):
            folder = Path(base) / f"k{index}"
            folder.mkdir()
            kernels.append(Soaked(f"k{index}", folder, random.Random(args.seed * 1000 + index)))
        deadline = time.monotonic() + args.minutes * 60
        threads = [threading.Thread(target=soak, args=(kernel, deadline, faults, args.sample_seconds))
                   for kernel in kernels]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for kernel in kernels:
            kernel.close()
    bad = 0
    for kernel in kernels:
        t = kernel.tally
        bad += len(t.lost_or_doubled)
        print(f"{kernel.name}: {t.cells} checked cells, {t.stops} Stops, {t.relay_kills} relay kills, "
              f"{t.box_kills} box kills, {t.restarts} restarts, {t.unknown_outcomes} outcomes said unknown; "
              "lost or doubled: "
              f"{t.lost_or_doubled or 'none'}; kernel RSS {t.rss[0]:.0f} → {t.rss[-1]:.0f} MiB (max {max(t.rss):.0f}); "
              f"box {t.box_memory[0] if t.box_memory else 0:.0f} → {t.box_memory[-1] if t.box_memory else 0:.0f} MiB")
        print(f"  {kernel.name} kernel RSS by sample, MiB: {' '.join(f'{v:.0f}' for v in t.rss)}")
        print(f"  {kernel.name} box memory by sample, MiB: {' '.join(f'{v:.1f}' for v in t.box_memory)}")
    print(f"{len(kernels)} kernels, {time.monotonic() - started:.0f} s: "
          f"{sum(k.tally.cells for k in kernels)} checked cells, {bad} lost or doubled")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
