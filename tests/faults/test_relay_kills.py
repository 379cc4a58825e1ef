"""The relay killed at 200 random moments across a stream of commands: nothing lost, nothing twice.

Four shells of one LocalProvider daemon run commands back to back; each command first appends its id
to a shared file, then prints numbered lines on stdout (and on some, stderr lines too), quickly or
slowly. Meanwhile a killer thread cuts the client's pipe (`RunnerClient.cut()` kills the relay
process, as a lost network would) after a delay drawn from a seeded RNG, waits for the client to be
back, and does it again, 200 times. Every command must return exactly one result with its output
complete and exact, every side effect must have happened exactly once, and the live frames combined
with the record the way the kernel combines them (`CellOutput`) must show exactly the expected text.
"""

from __future__ import annotations

import os
import random
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from owsandbox.host.providers.local import LocalProvider
from owsandbox.kernel.cell.output import CellOutput, Notice, Stream
from tests.processes import children, command_line
from tests.waiting import WaitTimeout, wait_until

from ..conftest import running
from .helpers import seed_from_env

pytestmark = pytest.mark.system

SEED = 20261201
KILLS = 200
SHELLS = ("s0", "s1", "s2", "s3")
MIN_COMMANDS = 60  # the stream runs at least this long, and on until the last kill
MAX_COMMANDS = 2000  # a bound: a machine too slow for 200 kills in this many commands fails loudly
RECONNECT_WAIT = 20.0  # seconds the killer waits for the client to be back before it gives up


@dataclass
class Spec:
    """One command: `lines` numbered stdout lines, a stderr line every `err_every` (0: none), a pause
    of `pause` s after each line (0: none)."""

    cid: int
    lines: int
    err_every: int
    pause: float

    def command(self, effects: Path) -> str:
        body = f"echo c{self.cid}-out-$i"
        if self.err_every:
            body += f"; if [ $((i % {self.err_every})) = 0 ]; then echo c{self.cid}-err-$i >&2; fi"
        if self.pause:
            body += f"; sleep {self.pause}"
        return f"echo {self.cid} >> {effects}; for i in $(seq 1 {self.lines}); do {body}; done"

    def expected(self) -> dict[str, str]:
        out = "".join(f"c{self.cid}-out-{i}\n" for i in range(1, self.lines + 1))
        err = "".join(f"c{self.cid}-err-{i}\n" for i in range(1, self.lines + 1)
                      if self.err_every and i % self.err_every == 0)
        return {"stdout": out, "stderr": err}


def spec_for(seed: int, cid: int) -> Spec:
    """The same command for the same seed and id, whichever shell or moment runs it."""
    rng = random.Random(seed * 1_000_003 + cid)
    kind = rng.choice(("quick", "quick", "slow", "mixed"))
    if kind == "quick":
        return Spec(cid, rng.randint(1, 6), 0, 0.0)
    if kind == "slow":
        return Spec(cid, rng.randint(8, 25), 0, rng.choice((0.005, 0.01, 0.02)))
    return Spec(cid, rng.randint(10, 60), rng.randint(2, 5), rng.choice((0.0, 0.002, 0.01)))


def split_record(result: dict[str, Any]) -> dict[str, str]:
    """The record's output split back into stdout and stderr by its `segments`."""
    output, segments = result["output"], result.get("segments")
    assert segments is not None or not output, f"a record without segments: {result}"
    parts = {"stdout": "", "stderr": ""}
    position = 0
    for stream, length in segments or []:
        parts[stream] += output[position : position + length]
        position += length
    assert position == len(output), f"segments do not cover the output: {result}"
    return parts


def shown_text(events: list[Any]) -> dict[str, str]:
    shown = {"stdout": "", "stderr": ""}
    for event in events:
        assert isinstance(event, Stream), f"only streams expected, not {event!r}"
        shown[event.name] += event.text
    return shown


@dataclass
class Outcome:
    spec: Spec
    result: dict[str, Any] | None = None
    error: BaseException | None = None
    events: list[Any] = field(default_factory=list)
    gap: bool = False
    live_frames: int = 0
    completions: int = 0


@pytest.fixture
def local_box(zipapp: Path, workspace: Path):
    with running(LocalProvider(cwd=workspace, runner_path=zipapp, relay_silence_seconds=0),
                 reconnect_timeout=RECONNECT_WAIT) as pair:
        yield pair


@pytest.mark.timeout(300)
def test_200_relay_kills_lose_and_repeat_nothing(local_box, workspace: Path) -> None:
    seed = seed_from_env(SEED)
    provider, client = local_box
    effects = workspace / "effects.txt"
    for shell in SHELLS:  # every shell exists before the first kill
        assert client.call("shell.run", {"shell": shell, "command": "true"}, timeout=30)["exit_code"] == 0

    lock = threading.Lock()
    outcomes: dict[int, Outcome] = {}
    kills = 0
    stop = threading.Event()  # the workers take no new command once set
    killer_error: list[str] = []
    next_id = iter(range(MAX_COMMANDS))

    def take_id() -> int | None:
        with lock:
            if stop.is_set() or (len(outcomes) >= MIN_COMMANDS and kills >= KILLS):
                return None
            cid = next(next_id, None)
            if cid is not None:
                outcomes[cid] = Outcome(spec_for(seed, cid))
            return cid

    def worker(shell: str) -> None:
        while (cid := take_id()) is not None:
            outcome = outcomes[cid]
            view = CellOutput()

            def on_frame(frame: dict[str, Any], view: CellOutput = view, outcome: Outcome = outcome) -> None:
                if frame.get("method") == "shell.output":
                    outcome.live_frames += 1
                    view.live(frame)

            try:
                result = client.call("shell.run", {"shell": shell, "command": outcome.spec.command(effects)},
                                     timeout=90, on_notification=on_frame)
            except BaseException as exc:  # noqa: BLE001 - reported below with the command
                outcome.error = exc
                outcome.completions += 1
                continue
            outcome.completions += 1
            outcome.result = result
            outcome.gap = view.gap
            view.finish(result)
            outcome.events = view.take()

    def killer() -> None:
        nonlocal kills
        rng = random.Random(seed)
        try:
            while kills < KILLS and not stop.is_set():
                try:
                    wait_until(lambda done=kills: client.connected and client.reconnects >= done, RECONNECT_WAIT,
                               f"the client to be back after kill {kills}", interval=0.001)
                except WaitTimeout:
                    killer_error.append(f"the client was not back {RECONNECT_WAIT:g} s after kill {kills}")
                    return
                roll = rng.random()
                # A few right after the resume (replays in flight), most while output streams.
                delay = 0.0 if roll < 0.1 else rng.uniform(0.0, 0.004) if roll < 0.3 else rng.uniform(0.0, 0.06)
                time.sleep(delay)
                client.cut()
                with lock:
                    kills += 1
        finally:
            if kills < KILLS:
                stop.set()

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(shell,), name=f"worker-{shell}") for shell in SHELLS]
    threads.append(threading.Thread(target=killer, name="killer"))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    stop.set()
    hung = [thread.name for thread in threads if thread.is_alive()]
    elapsed = time.monotonic() - started
    assert not hung, f"seed={seed}: threads still running after 240 s: {hung}"
    assert not killer_error, f"seed={seed}: {killer_error}"
    assert kills == KILLS, f"seed={seed}: only {kills} kills in {len(outcomes)} commands"

    # The client came back after every kill, from the same daemon: nothing was declared lost.
    with suppress(WaitTimeout):  # the assertion below says what is wrong
        wait_until(lambda: client.connected and client.reconnects >= KILLS, RECONNECT_WAIT,
                   "the client to be back after the last kill", interval=0.01)
    assert client.reconnects == KILLS and client.restarts == 0, (seed, client.reconnects, client.restarts)
    pending = [call.method for call in list(client._session.calls.values()) if not call.done()]
    assert not pending, f"seed={seed}: calls still waiting: {pending}"
    # Every killed relay was reaped: only the current one is left.
    relays = [pid for pid in children(os.getpid()) if f"attach --socket {provider.socket_path}" in command_line(pid)]
    assert len(relays) == 1, f"seed={seed}: relays alive: {relays}"

    problems: list[str] = []
    for cid, outcome in sorted(outcomes.items()):
        expected = outcome.spec.expected()
        if outcome.completions != 1 or outcome.error is not None or outcome.result is None:
            problems.append(f"c{cid}: completed {outcome.completions} times, error {outcome.error!r}")
            continue
        result = outcome.result
        if result.get("exit_code") != 0 or result.get("error") or result.get("truncated"):
            problems.append(f"c{cid}: {result}")
        elif split_record(result) != expected:
            problems.append(f"c{cid}: the record is {split_record(result)!r}, not {expected!r}")
        elif any(isinstance(event, Notice) for event in outcome.events):
            problems.append(f"c{cid}: a notice: {outcome.events!r}")
        elif shown_text(outcome.events) != expected:
            problems.append(f"c{cid}: shown {shown_text(outcome.events)!r}, not {expected!r} (gap={outcome.gap})")
    assert not problems, f"seed={seed}: " + "\n".join(problems[:20])

    ran = [int(word) for word in effects.read_text().split()]
    assert sorted(ran) == sorted(outcomes), f"seed={seed}: side effects {sorted(ran)} for commands {sorted(outcomes)}"
    assert len(ran) == len(set(ran)), f"seed={seed}: ran twice: {[c for c in set(ran) if ran.count(c) > 1]}"

    gaps = sum(outcome.gap for outcome in outcomes.values())
    live = sum(outcome.live_frames for outcome in outcomes.values())
    print(f"[faults] seed={seed}: {KILLS} kills across {len(outcomes)} commands on {len(SHELLS)} shells in "
          f"{elapsed:.1f} s; {live} live frames, {gaps} commands filled in from the record after a gap")
    # The drill is only worth something if kills landed mid-output: the record had to fill in.
    assert gaps > 0 and live > 0, f"seed={seed}: no command lost live frames ({gaps} gaps, {live} frames)"
