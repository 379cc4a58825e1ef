"""owsandbox against two other ways to run bash from Jupyter, on the same work, in one run.

The kernels:

* **owsandbox** — this project's kernel, installed into a temporary prefix with
  `owsandbox install --prefix TMP --name owsandbox-bench --provider local` (the `local` provider: a daemon on
  this machine, no isolation, like the other two; --owsandbox-provider chooses another);
* **bash_kernel** — `pip install bash_kernel` if it is missing, spec installed with
  `python -m bash_kernel.install --prefix TMP`; if that fails its column says "not available";
* **python3 `%%bash`** — the ipykernel kernel, every cell prefixed with IPython's `%%bash` cell magic.

Each kernel is started by `jupyter_client.KernelManager` in a fresh temporary folder and always shut
down in a `finally` (killed if it does not stop); processes left behind are looked for and killed.
The rows:

* startup: `start_kernel()` until the first `kernel_info_reply` (median of --startups starts), and
  until the first cell (`true`) has finished, since a kernel may answer kernel_info before it can run;
* trivial cell: `true`, execute_request → execute_reply, median and p90 of --runs runs after --warmup;
* streaming: `seq 1 N` from execute_request until both the execute_reply and `idle`; the stdout
  stream text is compared line by line with what seq prints. A probe with --probe-seq lines runs
  first; a kernel whose full run would take longer than --stream-budget seconds at the probe's rate is
  measured on the largest of N/10, N/100, ... that fits (or on the probe), and the table says so; a run
  past its time is interrupted and reported as partial;
* first output: `echo one; sleep 2; echo two`, request → the first stream message containing "one";
* Stop: `sleep 30`, once the kernel is busy and 0.5 s have passed `km.interrupt_kernel()`, until the
  execute_reply; then whether `echo $X` still prints what `export X=kept` set before;
* stderr apart: whether `echo out; echo err >&2` arrives as separate stdout and stderr streams.

Run: `python benchmarks/compare.py [--no-readme] [--runs 200] [--seq 3000000] [--kernels owsandbox,python3]`.
Progress goes to stderr, the Markdown table to stdout and, unless --no-readme, into
docs/explanation/performance.md between
`<!-- benchmark:start -->` and `<!-- benchmark:end -->`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

import zmq
from jupyter_client.manager import KernelManager

# The page the table lives on (its flags still say "readme", as they always have)
README = Path(__file__).resolve().parent.parent / "docs" / "explanation" / "performance.md"
START_MARK, END_MARK = "<!-- benchmark:start -->", "<!-- benchmark:end -->"
HEADING = "## Compared with other kernels"
MARKER_ENV = "OWSANDBOX_BENCH_RUN"  # set in every kernel's environment, to find what it left running
OWSANDBOX_SPEC = "owsandbox-bench"


def progress(text: str) -> None:
    print(f"[compare] {text}", file=sys.stderr, flush=True)


# -- kernels -------------------------------------------------------------------------------------


@dataclass
class Kernel:
    key: str  # as in --kernels
    label: str  # the table's column
    spec: str  # kernelspec name
    prefix: str = ""  # put before every cell's code
    why_not: str = ""  # why it is not available; empty when it is
    version: str = ""

    def cell(self, code: str) -> str:
        return self.prefix + code


def _run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}").splitlines()
    return lines[-1]


def _module_version(module: str) -> str | None:
    proc = _run([sys.executable, "-c", f"import {module}; print(getattr({module}, '__version__', '?'))"])
    return proc.stdout.strip() if proc.returncode == 0 else None


def prepare_owsandbox(prefix: Path, provider: str) -> Kernel:
    kernel = Kernel("owsandbox", "owsandbox", OWSANDBOX_SPEC)
    script = Path(sys.executable).with_name("owsandbox")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "owsandbox.cli"]
    where = ["--provider", provider] if provider else []
    proc = _run([*command, "install", "--prefix", str(prefix), "--name", OWSANDBOX_SPEC, *where])
    if proc.returncode != 0:
        kernel.why_not = f"`owsandbox install` failed: {_last_line(proc)}"
    kernel.version = _module_version("owsandbox") or "?"
    return kernel


def prepare_bash_kernel(prefix: Path) -> Kernel:
    kernel = Kernel("bash_kernel", "bash_kernel", "bash")
    version = _module_version("bash_kernel")
    if version is None:
        progress("bash_kernel is not installed: pip install bash_kernel")
        try:
            proc = _run([sys.executable, "-m", "pip", "install", "bash_kernel"])
        except subprocess.TimeoutExpired:
            kernel.why_not = "`pip install bash_kernel` did not finish within 600 s"
            return kernel
        if proc.returncode != 0:
            kernel.why_not = f"`pip install bash_kernel` failed: {_last_line(proc)}"
            return kernel
        version = _module_version("bash_kernel")
        if version is None:
            kernel.why_not = "bash_kernel was installed by pip but cannot be imported"
            return kernel
    kernel.version = version
    proc = _run([sys.executable, "-m", "bash_kernel.install", "--prefix", str(prefix)])
    if proc.returncode != 0:
        kernel.why_not = f"`python -m bash_kernel.install` failed: {_last_line(proc)}"
    return kernel


def prepare_python3() -> Kernel:
    kernel = Kernel("python3", "python3 `%%bash`", "python3", prefix="%%bash\n")
    ipykernel, ipython = _module_version("ipykernel"), _module_version("IPython")
    if ipykernel is None or ipython is None:
        kernel.why_not = "ipykernel or IPython cannot be imported"
    kernel.version = f"ipykernel {ipykernel}, IPython {ipython}"
    return kernel


# -- one kernel, driven over its channels -----------------------------------------------------------


@dataclass
class Cell:
    """One execute_request: what came back for it and when (perf_counter seconds)."""

    msg_id: str
    sent: float
    busy_at: float | None = None
    idle_at: float | None = None
    reply_at: float | None = None
    reply: dict[str, Any] | None = None
    streams: list[tuple[float, str, str]] = field(default_factory=list)  # (when, name, text)

    @property
    def done(self) -> bool:
        return self.reply is not None and self.idle_at is not None

    @property
    def finished_at(self) -> float:
        assert self.reply_at is not None and self.idle_at is not None
        return max(self.reply_at, self.idle_at)

    def text(self, name: str = "stdout") -> str:
        return "".join(text for _, stream, text in self.streams if stream == name)


class CellFailed(Exception):
    """A cell that should have succeeded did not."""


def check_ok(cell: Cell, code: str) -> None:
    assert cell.reply is not None
    content = cell.reply["content"]
    if content["status"] != "ok":
        raise CellFailed(f"{code!r} replied {content['status']}: {content.get('ename')}: {content.get('evalue')}")


class Session:
    """A started kernel with its client; `close` always shuts it down, killing it if it will not stop."""

    def __init__(self, kernel: Kernel, workdir: Path, env: dict[str, str]) -> None:
        self.kernel = kernel
        self.km = KernelManager(kernel_name=kernel.spec)
        self.kc: Any = None
        self._heard = False  # iopub has carried a message: its subscription is live
        self.started = time.perf_counter()
        self.km.start_kernel(cwd=str(workdir), env=env)
        try:
            self.kc = self.km.client()
            self.kc.start_channels()
            self.poller = zmq.Poller()
            self.poller.register(self.kc.iopub_channel.socket, zmq.POLLIN)
            self.poller.register(self.kc.shell_channel.socket, zmq.POLLIN)
        except BaseException:
            self.close()
            raise

    def wait_for_kernel_info(self, timeout: float = 60) -> float:
        """Seconds from before `start_kernel()` to the first kernel_info_reply; returns once iopub is live too."""
        deadline = time.perf_counter() + timeout
        asked = 0.0
        answered: float | None = None
        while answered is None:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{self.kernel.label}: no kernel_info_reply within {timeout:g} s")
            if time.perf_counter() - asked > 5:  # zmq queues the request until the kernel listens; ask again rarely
                self.kc.kernel_info()
                asked = time.perf_counter()
            with contextlib.suppress(Empty):
                if self.kc.shell_channel.get_msg(timeout=0.5)["msg_type"] == "kernel_info_reply":
                    answered = time.perf_counter() - self.started
        # iopub is a subscription, and what a kernel publishes before it is established is lost (the idle of the
        # first cell, say): ask until iopub has carried something.
        while not self._iopub_heard(0.05):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{self.kernel.label}: nothing on iopub within {timeout:g} s")
            self.kc.kernel_info()
            self._iopub_heard(0.25)
        while self.kc.shell_channel.msg_ready():  # the replies to the extra requests
            self.kc.shell_channel.get_msg(timeout=0)
        return answered

    def _iopub_heard(self, timeout: float) -> bool:
        with contextlib.suppress(Empty):
            while True:
                self.kc.iopub_channel.get_msg(timeout=timeout)
                self._heard = True
                timeout = 0
        return self._heard

    def send(self, code: str) -> Cell:
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
        return Cell(msg_id, time.perf_counter())

    def pump(self, cell: Cell, until: Callable[[Cell], bool], timeout: float) -> bool:
        """Read iopub and shell messages for `cell` until `until(cell)`; False if `timeout` passed first."""
        deadline = time.perf_counter() + timeout
        while not until(cell):
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            ready = dict(self.poller.poll(min(left, 0.1) * 1000))
            # At most a batch from each before the clock and `until` are looked at again: a kernel that sends
            # many small messages would otherwise keep this loop reading past the deadline.
            for _ in range(200 if self.kc.iopub_channel.socket in ready else 0):
                if not self.kc.iopub_channel.msg_ready():
                    break
                self._on_iopub(cell, self.kc.iopub_channel.get_msg(timeout=0))
            for _ in range(200 if self.kc.shell_channel.socket in ready else 0):
                if not self.kc.shell_channel.msg_ready():
                    break
                msg = self.kc.shell_channel.get_msg(timeout=0)
                if msg["parent_header"].get("msg_id") == cell.msg_id and msg["msg_type"] == "execute_reply":
                    cell.reply, cell.reply_at = msg, time.perf_counter()
        return True

    @staticmethod
    def _on_iopub(cell: Cell, msg: dict[str, Any]) -> None:
        if msg["parent_header"].get("msg_id") != cell.msg_id:
            return  # left over from an earlier request
        now = time.perf_counter()
        if msg["msg_type"] == "status":
            state = msg["content"]["execution_state"]
            if state == "busy" and cell.busy_at is None:
                cell.busy_at = now
            elif state == "idle":
                cell.idle_at = now
        elif msg["msg_type"] == "stream":
            cell.streams.append((now, msg["content"]["name"], msg["content"]["text"]))

    def run(self, code: str, timeout: float = 60) -> Cell:
        """Run one cell to its end (reply and idle); TimeoutError if it takes longer, CellFailed if it fails."""
        cell = self.send(self.kernel.cell(code))
        if not self.pump(cell, lambda c: c.done, timeout):
            raise TimeoutError(f"{self.kernel.label}: {code!r} did not finish within {timeout:g} s")
        check_ok(cell, code)
        return cell

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def close(self) -> None:
        try:
            if self.kc is not None:
                self.kc.stop_channels()
        finally:
            try:
                self.km.shutdown_kernel(now=False)  # shutdown_request; killed after shutdown_wait_time
            except Exception as exc:  # noqa: BLE001 - whatever happened, the kernel must go
                progress(f"{self.kernel.label}: shutdown failed ({exc}); killing it")
                with contextlib.suppress(Exception):
                    self.km.shutdown_kernel(now=True)


def leftover_processes(marker: str, root: Path) -> list[int]:
    """Our processes still running: they carry the run's marker in their environment or sit in `root`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if f"{MARKER_ENV}={marker}".encode() in environ.split(b"\0") or cwd.startswith(str(root)):
            found.append(int(entry.name))
    return found


def kill_leftovers(marker: str, root: Path) -> list[int]:
    pids = leftover_processes(marker, root)
    if pids:
        time.sleep(1.0)  # a process may be on its way out
        pids = leftover_processes(marker, root)
    for pid in pids:
        progress(f"process {pid} was left behind; killing it")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return pids


# -- measurements ----------------------------------------------------------------------------------


@dataclass
class Results:
    startup: list[float] = field(default_factory=list)
    first_cell: list[float] = field(default_factory=list)
    trivial: list[float] = field(default_factory=list)
    stream: dict[str, Any] = field(default_factory=dict)
    stream_estimate: float | None = None  # seconds the full streaming run would take, when a smaller one ran
    first_output_ran: bool = False
    first_output: float | None = None
    second_output: float | None = None
    stop: float | None = None
    stop_status: str = ""
    kept: str = ""
    stderr_apart: str = ""
    program_output: float | None = None  # request → python3's first line, with PYTHONUNBUFFERED unset
    program_ran: bool = False
    prompt: str = ""  # request → input_request for `read -p`, or what happened instead
    order_runs: tuple[int, int] | None = None  # runs fully in order, of runs (1 ms between pairs)
    order_pairs: tuple[int, int] | None = None  # back-to-back pairs in order, of pairs
    notes: list[str] = field(default_factory=list)
    failed: str = ""
    leftovers: list[int] = field(default_factory=list)


def expected_chars(n: int) -> int:
    """Length of `seq 1 n`'s output."""
    total, digits, low = 0, 1, 1
    while low <= n:
        high = min(n, low * 10 - 1)
        total += (high - low + 1) * (digits + 1)
        digits, low = digits + 1, low * 10
    return total


def compare_lines(text: str, n: int) -> tuple[int, int, int]:
    """(lines of `seq 1 n` received, extra lines, highest line received); a line counts once, wherever it came."""
    seen = bytearray(n + 1)
    extra = highest = 0
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        value = int(line) if line.isdigit() and len(line) <= 10 else 0
        if 1 <= value <= n and not seen[value] and line == str(value):
            seen[value] = 1
            highest = max(highest, value)
        else:
            extra += 1
    return seen.count(1), extra, highest


def measure_startups(kernel: Kernel, count: int, workdir: Path, env: dict[str, str], res: Results) -> Session:
    """Start the kernel `count` times; every start but the last is shut down, the last is returned."""
    for i in range(count):
        session = Session(kernel, workdir, env)
        keep = False
        try:
            res.startup.append(session.wait_for_kernel_info())
            session.run("true", timeout=120)
            res.first_cell.append(time.perf_counter() - session.started)
            progress(f"{kernel.label}: start {i + 1}: kernel_info {res.startup[-1]:.3f} s, "
                     f"first cell done {res.first_cell[-1]:.3f} s")
            keep = i == count - 1
        finally:
            if not keep:
                session.close()
    return session


def measure_trivial(session: Session, runs: int, warmup: int, res: Results) -> None:
    for _ in range(warmup):
        session.run("true")
    for _ in range(runs):
        cell = session.run("true")
        assert cell.reply_at is not None
        res.trivial.append(cell.reply_at - cell.sent)
    progress(f"{session.kernel.label}: trivial cell median {statistics.median(res.trivial) * 1000:.2f} ms")


def seq_run(session: Session, n: int, timeout: float) -> tuple[dict[str, Any], bool]:
    """Run `seq 1 n`; returns the figures and whether the kernel still answers (False: start a new one)."""
    cell = session.send(session.kernel.cell(f"seq 1 {n}"))
    finished = session.pump(cell, lambda c: c.done, timeout)
    healthy = True
    if finished:
        elapsed = cell.finished_at - cell.sent
    else:
        elapsed = time.perf_counter() - cell.sent
        progress(f"{session.kernel.label}: seq 1 {n} still running after {timeout:g} s; interrupting")
        session.interrupt()
        healthy = session.pump(cell, lambda c: c.done, 15)
    if finished:
        check_ok(cell, f"seq 1 {n}")
    text = cell.text("stdout").replace("\r\n", "\n").replace("\r", "\n")  # a pty ends lines with \r\n
    received, extra, highest = compare_lines(text, n)
    # A run stopped early is judged on the lines up to the last one that came: the rest were never printed.
    missing = (n if finished else highest) - received
    return {"n": n, "seconds": elapsed, "finished": finished, "received": len(text.encode()),
            "expected": expected_chars(n), "missing": missing, "extra": extra, "highest": highest,
            "cut_notice": "output limit" in cell.text("stderr")}, healthy


def measure_streaming(session: Session, args: argparse.Namespace, res: Results) -> Session:
    """The probe, then the largest of N, N/10, N/100, ... that the probe's rate says fits in the budget."""
    label = session.kernel.label
    if session.kernel.key == "owsandbox":
        # Show the whole output: the default per-cell limit (4M characters) would cut it with a notice.
        check_ok(session.run(f"%output limit {expected_chars(args.seq) + 1_000_000}"), "%output limit")
    probe, healthy = seq_run(session, args.probe_seq, args.stream_budget)
    progress(f"{label}: probe seq 1 {args.probe_seq}: {probe['seconds']:.3f} s, missing {probe['missing']}, "
             f"extra {probe['extra']}")
    if not healthy:
        res.stream = probe
        return restart(session, res)
    result = probe
    if probe["finished"]:
        n = args.seq
        while n > args.probe_seq and probe["seconds"] * n / args.probe_seq > args.stream_budget:
            n //= 10
        if n < args.seq:
            estimate = probe["seconds"] * args.seq / args.probe_seq
            res.stream_estimate = estimate
            progress(f"{label}: seq 1 {args.seq} would take ~{estimate:.0f} s; "
                     f"measuring seq 1 {max(n, args.probe_seq)}")
        if n > args.probe_seq:
            result, healthy = seq_run(session, n, args.stream_budget + 15)
    res.stream = result
    progress(f"{label}: seq 1 {result['n']}: {result['seconds']:.3f} s, received {result['received']} bytes, "
             f"missing {result['missing']}, extra {result['extra']}")
    return session if healthy else restart(session, res)


def restart(session: Session, res: Results) -> Session:
    """Give up on a kernel that does not answer after an interrupted run: `measure` starts a new one."""
    res.notes.append(f"{session.kernel.label}: the kernel did not answer after the interrupted streaming run "
                     "and was restarted")
    raise RestartNeeded(session)


class RestartNeeded(Exception):
    def __init__(self, session: Session) -> None:
        super().__init__("restart needed")
        self.session = session


def measure_first_output(session: Session, res: Results) -> None:
    cell = session.send(session.kernel.cell("echo one; sleep 2; echo two"))
    if not session.pump(cell, lambda c: c.done, 30):
        raise TimeoutError("echo one; sleep 2; echo two did not finish within 30 s")
    check_ok(cell, "echo one; sleep 2; echo two")
    res.first_output_ran = True
    seen = ""
    for when, name, text in cell.streams:
        if name != "stdout":
            continue
        seen += text
        if res.first_output is None and "one" in seen:
            res.first_output = when - cell.sent
        if res.second_output is None and "two" in seen:
            res.second_output = when - cell.sent
    progress(f"{session.kernel.label}: \"one\" after {res.first_output} s, \"two\" after {res.second_output} s")


def measure_stop(session: Session, res: Results) -> None:
    session.run("export X=kept")
    cell = session.send(session.kernel.cell("sleep 30"))
    if not session.pump(cell, lambda c: c.busy_at is not None, 15):
        raise TimeoutError("the kernel did not go busy on `sleep 30`")
    assert cell.busy_at is not None
    busy_at = cell.busy_at
    session.pump(cell, lambda c: time.perf_counter() >= busy_at + 0.5, 5)
    stopped = time.perf_counter()
    session.interrupt()
    if session.pump(cell, lambda c: c.reply is not None, 40):
        assert cell.reply is not None and cell.reply_at is not None
        res.stop = cell.reply_at - stopped
        res.stop_status = cell.reply["content"]["status"]
    else:
        res.stop_status = "no reply within 40 s"
    session.pump(cell, lambda c: c.done, 40)
    after = session.run("echo $X").text().strip()
    res.kept = "yes" if after == "kept" else "no"
    progress(f"{session.kernel.label}: Stop took {res.stop} s ({res.stop_status}); `echo $X` gave {after!r}")


def measure_stderr(session: Session, res: Results) -> None:
    cell = session.run("echo out; echo err >&2")
    out, err = cell.text("stdout"), cell.text("stderr")
    apart = "out" in out and "err" not in out and "err" in err and "out" not in err
    res.stderr_apart = "yes" if apart else "no"
    progress(f"{session.kernel.label}: stdout {out!r}, stderr {err!r}")


PROGRAM = "python3 -c \"import time; print('one'); time.sleep(1.5); print('two')\""


def measure_program_output(session: Session, res: Results) -> None:
    """A program that buffers on a pipe: its first line shows at once only where it has a terminal."""
    cell = session.send(session.kernel.cell(PROGRAM))
    if not session.pump(cell, lambda c: c.done, 30):
        raise TimeoutError("the python3 program did not finish within 30 s")
    check_ok(cell, PROGRAM)
    res.program_ran = True
    seen = ""
    for when, name, text in cell.streams:
        seen += text if name == "stdout" else ""
        if "one" in seen:
            res.program_output = when - cell.sent
            break
    progress(f"{session.kernel.label}: python3's \"one\" after {res.program_output} s")


def measure_prompt(session: Session, res: Results) -> None:
    """`read -p`: does the kernel ask the notebook (input_request), how soon, and does the answer arrive."""
    code = session.kernel.cell("read -p 'Your name? ' n; echo \"hello $n\"")
    msg_id = session.kc.execute(code, allow_stdin=True, stop_on_error=False)
    cell = Cell(msg_id, time.perf_counter())
    asked_at = None
    deadline = time.perf_counter() + 10
    while asked_at is None and time.perf_counter() < deadline:
        with contextlib.suppress(Empty):
            msg = session.kc.stdin_channel.get_msg(timeout=0.05)
            if msg["msg_type"] == "input_request":
                asked_at = time.perf_counter()
                session.kc.input("Ada")
        session.pump(cell, lambda c: c.done, 0.01)
        if cell.done:
            break
    if asked_at is None:
        if not cell.done:
            session.interrupt()
            session.pump(cell, lambda c: c.done, 30)
            res.prompt = "no input_request: the cell waited until interrupted after 10 s"
        else:
            res.prompt = f"no input_request: the cell ended with {cell.text().strip()!r}"
        return
    session.pump(cell, lambda c: c.done, 30)
    answered = "hello Ada" in cell.text()
    res.prompt = f"{_ms(asked_at - cell.sent)}" + ("" if answered else " (the answer did not arrive)")
    progress(f"{session.kernel.label}: prompt: {res.prompt}")


def _alternating_in_order(cell: Cell, count: int) -> tuple[bool, int]:
    """(all lines in order, pairs whose out came right before its err) from the stream messages."""
    lines: list[tuple[str, str]] = []
    for _, name, text in cell.streams:
        lines += [(name, line) for line in text.splitlines()]
    expected = []
    for i in range(1, count + 1):
        expected += [("stdout", f"out {i}"), ("stderr", f"err {i}")]
    pairs = sum(1 for i in range(len(lines) - 1) if lines[i][0] == "stdout" and lines[i + 1] == ("stderr", "err "
                                                                                                 + lines[i][1][4:]))
    return lines == expected, pairs


def measure_order(session: Session, res: Results, runs: int = 10, count: int = 200) -> None:
    loop = f'for i in $(seq {count}); do echo "out $i"; echo "err $i" >&2; {{}}; done'
    in_order = 0
    for _ in range(runs):
        ok, _ = _alternating_in_order(session.run(loop.format("sleep 0.001")), count)
        in_order += ok
    res.order_runs = (in_order, runs)
    _, pairs = _alternating_in_order(session.run(loop.format(":")), count)
    res.order_pairs = (pairs, count)
    progress(f"{session.kernel.label}: order: {res.order_runs}, back-to-back pairs {res.order_pairs}")


def measure(kernel: Kernel, args: argparse.Namespace, root: Path, marker: str) -> Results:
    res = Results()
    workdir = Path(tempfile.mkdtemp(prefix=f"{kernel.key}-", dir=root))
    # As on a user's machine: no PYTHONUNBUFFERED, which would hide how programs buffer on a pipe.
    env = {key: value for key, value in os.environ.items() if key not in ("OWSANDBOX_PROVIDER", "PYTHONUNBUFFERED")}
    env[MARKER_ENV] = marker
    session: Session | None = None
    try:
        session = measure_startups(kernel, args.startups, workdir, env, res)
        measure_trivial(session, args.runs, args.warmup, res)
        try:
            session = measure_streaming(session, args, res)
        except RestartNeeded as needed:
            needed.session.close()
            session = None
            session = Session(kernel, workdir, env)
            session.wait_for_kernel_info()
        measure_first_output(session, res)
        measure_stop(session, res)
        measure_stderr(session, res)
        measure_program_output(session, res)
        measure_prompt(session, res)
        measure_order(session, res)
    except Exception as exc:  # noqa: BLE001 - one kernel's failure is reported in its column
        res.failed = f"{type(exc).__name__}: {exc}"
        progress(f"{kernel.label}: failed: {res.failed}")
    finally:
        if session is not None:
            session.close()
        res.leftovers = kill_leftovers(marker, root)
    return res


# -- the table ---------------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _s(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds < 10 else f"{seconds:.1f} s"


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]


def stream_rate(res: Results) -> str:
    stream = res.stream
    if not stream:
        return "—"
    shown = f"{stream['received'] / 1e6:.1f} MB"
    if not stream["finished"]:
        return (f"{stream['received'] / stream['seconds'] / 1e6:.2f} MB/s received: `seq 1 {stream['n']}` interrupted "
                f"after {_s(stream['seconds'])}, {shown} had arrived (partial)")
    rate = f"{stream['expected'] / stream['seconds'] / 1e6:.2f} MB/s"
    if stream["received"] < stream["expected"] * 0.99:
        shown_part = f"; {shown} of it shown"
    else:
        shown_part = ""
    text = f"{rate} ({stream['expected'] / 1e6:.1f} MB in {_s(stream['seconds'])}{shown_part})"
    if res.stream_estimate is not None:
        text += (f", measured on `seq 1 {stream['n']}`: the full run would take ~{res.stream_estimate:.0f} s "
                 "at that rate")
    return text


def stream_lost(res: Results) -> str:
    stream = res.stream
    if not stream:
        return "—"
    lines = stream["n"] if stream["finished"] else stream["highest"]
    if stream["missing"] == 0 and stream["extra"] == 0:
        return f"none (of {lines:,})"
    text = f"{stream['missing']:,} of {lines:,} missing, {stream['extra']:,} extra"
    if stream["cut_notice"]:
        text += (" — cut at the per-cell output limit (4M characters by default, `%output limit`), with a notice; "
                 "the whole output is kept in a log in the sandbox")
    return text


def first_output(res: Results) -> str:
    if not res.first_output_ran:
        return "—"
    text = _s(res.first_output) if res.first_output is not None else "\"one\" never came"
    return text + (f" (\"two\" at {_s(res.second_output)})" if res.second_output is not None else "")


def table(kernels: list[Kernel], results: dict[str, Results], args: argparse.Namespace) -> str:
    rows: list[tuple[str, Callable[[Results], str]]] = [
        (f"startup: `start_kernel()` → first kernel_info_reply (median of {args.startups})",
         lambda r: _s(statistics.median(r.startup)) if r.startup else "—"),
        ("startup → first cell (`true`) finished (median)",
         lambda r: _s(statistics.median(r.first_cell)) if r.first_cell else "—"),
        (f"trivial cell `true`: request → reply, median / p90 of {args.runs}",
         lambda r: f"{_ms(statistics.median(r.trivial))} / {_ms(_p90(r.trivial))}" if r.trivial else "—"),
        (f"streaming `seq 1 {args.seq}` ({expected_chars(args.seq) / 1e6:.1f} MB): request → reply and idle "
         "(owsandbox with `%output limit` above the output's size)",
         stream_rate),
        ("streaming: lines of stdout missing / extra", stream_lost),
        ("first output: `echo one; sleep 2; echo two`, request → \"one\"",
         first_output),
        ("Stop: `sleep 30`, interrupt → execute_reply",
         lambda r: (_s(r.stop) if r.stop is not None else r.stop_status or "—")),
        ("state kept after Stop (`export X=kept` … `echo $X`)", lambda r: r.kept or "—"),
        ("stderr kept apart (`echo out; echo err >&2`)", lambda r: r.stderr_apart or "—"),
        ("program output: python3 prints, sleeps 1.5 s, prints (no PYTHONUNBUFFERED): request → first line",
         lambda r: (_s(r.program_output) if r.program_output is not None else "came at the end")
         if r.program_ran else "—"),
        ("prompt: `read -p 'Your name? ' n` with a client that answers: request → input_request",
         lambda r: r.prompt or "—"),
        ("order of 200 alternating stdout/stderr lines: runs fully in order (1 ms between pairs) / "
         "back-to-back pairs in order",
         lambda r: f"{r.order_runs[0]} of {r.order_runs[1]} / {r.order_pairs[0]} of {r.order_pairs[1]}"
         if r.order_runs and r.order_pairs else "—"),
    ]
    lines = ["| | " + " | ".join(k.label for k in kernels) + " |", "|---" * (len(kernels) + 1) + "|"]
    for title, cell in rows:
        values = []
        for kernel in kernels:
            if kernel.why_not:
                values.append("not available")
                continue
            value = cell(results[kernel.key])
            values.append(value.replace("|", "\\|"))
        lines.append(f"| {title} | " + " | ".join(values) + " |")
    provider = (f"the `{args.owsandbox_provider}` provider" if args.owsandbox_provider
                else "its default provider")
    if args.owsandbox_provider == "local":
        provider += " (a daemon on this machine, no isolation, as for the other two)"
    how = ["each kernel started by `jupyter_client.KernelManager` in an empty temporary folder"]
    keys = {k.key for k in kernels}
    if "owsandbox" in keys:
        how.append(f"owsandbox with {provider}")
    if "python3" in keys:
        how.append("the python3 cells are `%%bash\\n<code>`")
    versions = "; ".join(f"{k.label} {k.version}" for k in kernels if k.version and not k.why_not)
    notes = [f"Measured {datetime.date.today().isoformat()} on {platform.system()} {platform.machine()}, "
             f"{os.cpu_count()} CPUs, Python {platform.python_version()}, with `python benchmarks/compare.py` "
             f"({'; '.join(how)})." + (f" Versions: {versions}." if versions else "")]
    for kernel in kernels:
        res = results.get(kernel.key)
        if kernel.why_not:
            notes.append(f"{kernel.label} was not available: {kernel.why_not}.")
            continue
        assert res is not None
        if kernel.key == "python3":
            notes.append("python3 `%%bash` runs every cell in a new bash, so no variable survives from one cell "
                         "to the next, Stop or not.")
        notes.extend(note + "." for note in res.notes)
        if res.failed:
            notes.append(f"{kernel.label}: the run stopped early: {res.failed}.")
        if res.leftovers:
            notes.append(f"{kernel.label}: {len(res.leftovers)} process(es) were left behind and killed.")
    return "\n".join(lines) + "\n\n" + "\n".join(f"* {note}" for note in notes) + "\n"


def write_readme(path: Path, text: str) -> None:
    readme = path.read_text(encoding="utf-8")
    block = f"{START_MARK}\n{text}{END_MARK}"
    if START_MARK in readme and END_MARK in readme:
        head, _, rest = readme.partition(START_MARK)
        _, _, tail = rest.partition(END_MARK)
        readme = head + block + tail
    else:
        readme = readme.rstrip("\n") + f"\n\n{HEADING}\n\n{block}\n"
    path.write_text(readme, encoding="utf-8")


# -- main ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def jupyter_paths(root: Path) -> Iterator[None]:
    """Point Jupyter at the temporary kernelspecs (and keep connection files in `root`) for the run."""
    saved = {key: os.environ.get(key) for key in ("JUPYTER_PATH", "JUPYTER_RUNTIME_DIR")}
    paths = [str(root / "share" / "jupyter")] + ([saved["JUPYTER_PATH"]] if saved["JUPYTER_PATH"] else [])
    os.environ["JUPYTER_PATH"] = os.pathsep.join(paths)
    os.environ["JUPYTER_RUNTIME_DIR"] = str(root / "runtime")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default="owsandbox,bash_kernel,python3",
                        help="which kernels, comma-separated (default: all three)")
    parser.add_argument("--owsandbox-provider", default="local",
                        help="the sandbox provider of the owsandbox kernel (default: local, no isolation, like the "
                             "others; '' leaves the kernel's own default)")
    parser.add_argument("--startups", type=int, default=3, help="starts measured (median)")
    parser.add_argument("--runs", type=int, default=200, help="trivial cells measured")
    parser.add_argument("--warmup", type=int, default=5, help="trivial cells run before measuring")
    parser.add_argument("--seq", type=int, default=3_000_000, help="lines of the streaming run")
    parser.add_argument("--probe-seq", type=int, default=30_000, help="lines of the probe before it")
    parser.add_argument("--stream-budget", type=float, default=45.0,
                        help="seconds a streaming run may take; slower kernels are measured on the probe")
    parser.add_argument("--no-readme", action="store_true", help="only print the table")
    parser.add_argument("--readme", type=Path, default=README,
                        help="the page to write the table into (default: docs/explanation/performance.md)")
    args = parser.parse_args(argv)
    args.kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    unknown = set(args.kernels) - {"owsandbox", "bash_kernel", "python3"}
    if unknown:
        parser.error(f"unknown kernels: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    marker = uuid.uuid4().hex
    root = Path(tempfile.mkdtemp(prefix="owsandbox-compare-"))
    try:
        with jupyter_paths(root):
            prepare = {"owsandbox": lambda: prepare_owsandbox(root, args.owsandbox_provider),
                       "bash_kernel": lambda: prepare_bash_kernel(root), "python3": prepare_python3}
            kernels = [prepare[key]() for key in args.kernels]
            results: dict[str, Results] = {}
            for kernel in kernels:
                if kernel.why_not:
                    progress(f"{kernel.label} is not available: {kernel.why_not}")
                    continue
                progress(f"measuring {kernel.label}")
                results[kernel.key] = measure(kernel, args, root, marker)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = table(kernels, results, args)
    print(text, end="")
    if not args.no_readme:
        write_readme(args.readme, text)
        progress(f"table written into {args.readme}")
    progress(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
