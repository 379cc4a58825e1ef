"""The kernel in a real terminal: `jupyter console --kernel owsandbox-test` driven through a pty with pexpect.

A terminal front end exercises what a notebook does not: it asks the kernel `is_complete` on every
Enter to decide between running the cell and showing a continuation prompt, asks `complete` on Tab,
turns Ctrl-C into an `interrupt_request` (the kernelspec says `interrupt_mode: message`), and on
Ctrl-D shuts the kernel down, which must take the sandbox daemon and its shells with it.

Two kinds of session are used. Most tests run with `simple_prompt=True` and TERM=dumb, so prompts are
plain `In [N]: ` lines; that mode reads lines with `input()` and never asks the kernel `is_complete` or
`complete`, so the multi-line and Tab tests run the console's prompt_toolkit interface instead, on an
xterm with colours off (NO_COLOR) and no cursor-position requests (PROMPT_TOOLKIT_NO_CPR). Its output
still carries cursor and style escapes, so prompts and echoed input are matched with escapes allowed
between characters.

Every console runs in a temporary folder (the kernel's workspace) with its own Jupyter runtime, config
and IPython folders; whatever happens, the console and every process under it are killed at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pexpect
import pytest

from .conftest import KERNEL_NAME
from .processes import PinnedProcesses, command_line, connected_to, descendants
from .waiting import patience

pytestmark = [pytest.mark.slow, pytest.mark.system,
              pytest.mark.skipif(not hasattr(os, "pidfd_open") or not os.path.isdir("/proc"),
                                 reason="follows processes through /proc and pidfds (Linux)")]

START_SECONDS = 60  # the console's banner and first prompt: a kernel and a sandbox daemon start
CELL_SECONDS = 30
ESCAPES = r"(?:\x1b\[[0-9;?]*[A-Za-z])*"  # CSI sequences prompt_toolkit puts between characters


def spelled(text: str) -> str:
    """A pattern for `text` as a terminal shows it: style and cursor escapes may sit between characters."""
    return ESCAPES.join(re.escape(ch) for ch in text)


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")


class Console:
    """One `jupyter console` with its own kernel, in a pty."""

    def __init__(self, folder: Path, *, simple: bool) -> None:
        self.folder = folder
        self.count = 1  # the number of the next `In [N]:` prompt
        self.transcript = folder / "console-transcript.txt"
        env = {
            **os.environ,  # JUPYTER_PATH finds the owsandbox-test kernelspec (tests/conftest.py)
            "JUPYTER_RUNTIME_DIR": str(folder / ".jupyter-runtime"),
            "JUPYTER_CONFIG_DIR": str(folder / ".jupyter-config"),
            "IPYTHONDIR": str(folder / ".ipython"),
            "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",  # dump_stacks() can show where a console or kernel is stuck
        }
        args = ["-m", "jupyter_console", "--kernel", KERNEL_NAME]
        if simple:
            env["TERM"] = "dumb"
            args.append("--ZMQTerminalInteractiveShell.simple_prompt=True")
        else:
            env.update(TERM="xterm", NO_COLOR="1", PROMPT_TOOLKIT_NO_CPR="1")
            # The console waits this long for is_complete before it stops asking for the rest of the
            # session (default 1 s); a loaded test machine must not turn that into a failure here.
            args.append("--ZMQTerminalInteractiveShell.kernel_is_complete_timeout=5")
        workspace = folder / "workspace"
        workspace.mkdir(parents=True)
        self._log = self.transcript.open("w", encoding="utf-8")
        self.child = pexpect.spawn(sys.executable, args, cwd=str(workspace), env=env, encoding="utf-8",
                                   codec_errors="replace", timeout=patience(CELL_SECONDS), dimensions=(40, 160))
        self.child.logfile_read = self._log
        self.workspace = workspace
        self.processes = PinnedProcesses()

    def wait_for_iopub(self, timeout: float = START_SECONDS) -> None:
        """Wait until the console holds a TCP connection to its kernel's IOPub port.

        jupyter console asks for kernel_info but does not wait for its IOPub subscription (it calls no
        wait_for_ready), and a kernel's IOPub drops what it publishes before anyone subscribes. A cell
        typed the moment the first prompt shows can lose its output, or its end (the console then waits
        for it forever). A person is slower than that; a test is not, so it waits for the connection.
        """
        deadline = time.monotonic() + timeout
        while not self._connected_to(self._iopub_port()):
            assert time.monotonic() < deadline, "the console never connected to its kernel's IOPub"
            time.sleep(0.01)

    def _iopub_port(self) -> int | None:
        for path in (self.folder / ".jupyter-runtime").glob("kernel-*.json"):
            try:
                return int(json.loads(path.read_text())["iopub_port"])
            except (OSError, ValueError, KeyError):
                return None  # still being written
        return None

    def _connected_to(self, port: int | None) -> bool:
        """Whether the console has an established TCP connection to `port`."""
        return port is not None and connected_to(self.child.pid, port)

    def prompt(self) -> str:
        return spelled(f"In [{self.count}]: ")

    def expect_prompt(self, timeout: float = CELL_SECONDS) -> str:
        """Wait for the next `In [N]:` prompt; the text since the last match, escapes removed."""
        self.child.expect(self.prompt(), timeout=patience(timeout))
        return plain(self.child.before)

    def run(self, line: str, timeout: float = CELL_SECONDS) -> str:
        """Run a one-line cell; its output (with the echoed input) once the next prompt shows."""
        self.child.send(line + "\r")
        self.count += 1
        return self.expect_prompt(timeout)

    def dump_stacks(self) -> None:
        """Have the console and its kernel print every thread's stack into the transcript (SIGABRT
        with faulthandler on), so a failure here says which of them was stuck, and where."""
        for pid in sorted([self.child.pid, *descendants(self.child.pid)]):
            if any(part in command_line(pid) for part in ("jupyter_console", "owsandbox.kernel")):
                try:
                    os.kill(pid, signal.SIGABRT)
                except ProcessLookupError:
                    pass
        try:
            self.child.expect(pexpect.EOF, timeout=5)
        except pexpect.TIMEOUT:
            pass

    def remember_processes(self) -> set[int]:
        """The console and everything it started so far (kernel, daemon, relays, shells), by pid."""
        return set(self.processes.add_tree(self.child.pid))

    def close(self) -> None:
        """Kill the console and every process seen below it; print the transcript (shown for a failure)."""
        try:
            if self.child.isalive():
                self.remember_processes()
            self.child.terminate(force=True)
            self.processes.kill()
            self.child.close(force=True)
        finally:
            self.processes.close()
            self._log.close()
            print(plain(self.transcript.read_text(encoding="utf-8", errors="replace")))


@pytest.fixture
def open_console(tmp_path: Path) -> Iterator[Callable[..., Console]]:
    consoles: list[Console] = []

    def start(simple: bool = True) -> Console:
        console = Console(tmp_path / f"console-{len(consoles)}", simple=simple)
        consoles.append(console)
        console.expect_prompt(START_SECONDS)
        console.wait_for_iopub(patience(START_SECONDS))
        console.remember_processes()
        return console

    yield start
    for console in consoles:
        console.close()


def test_a_cell_prints_its_output_in_the_console(open_console) -> None:
    console = open_console()
    shown = console.run("echo hello-$((6*7))")
    assert "hello-42\n" in shown
    assert "Error" not in shown


def test_ctrl_c_stops_the_running_command_and_the_shell_keeps_its_variables(open_console) -> None:
    console = open_console()
    console.child.send("export KEEP=still-here; echo sleep-$((1+1))-begun; sleep 60\r")
    console.count += 1
    console.child.expect("sleep-2-begun")  # printed by the cell, so the kernel is busy running it
    # jupyter_console's SIGINT handler waits on a future from inside the signal handler: a Ctrl-C that
    # lands while its main thread is just entering the wait for the cell (it holds a future's lock for
    # that instant) deadlocks the console itself. Nothing announces that the wait has begun, so give the
    # console half a second, as a person at the keyboard always does, watching for a prompt meanwhile:
    # a Ctrl-C at a prompt hangs jupyter_console 6 for good (the handler raises KeyboardInterrupt into
    # asyncio.run, whose teardown then waits for the thread blocked in input()), so a cell that ended by
    # itself is reported with what it showed, not pressed on.
    if console.child.expect([console.prompt(), pexpect.TIMEOUT], timeout=0.5) == 0:
        shown = plain(console.child.before) + console.run("echo probe-$((1+2))")  # prints what it held back
        pytest.fail(f"the cell ended before any Ctrl-C; the console showed: {shown!r}")
    console.child.sendintr()
    stopped_at = time.monotonic()
    try:
        stopped = console.child.expect(["Interrupted", console.prompt()], timeout=10)
    except pexpect.TIMEOUT:
        console.remember_processes()
        console.dump_stacks()
        raise
    assert time.monotonic() - stopped_at < 10
    if stopped == 0:
        console.expect_prompt(timeout=10)
        shown = console.run("echo $KEEP")
    else:
        # Back at the prompt with no error shown: jupyter_console prints IOPub only while a cell runs,
        # and the kernel's reply (shell) may overtake its error (IOPub, sent first) on a loaded machine,
        # or the console may take the Stop's control status for the cell's end. The next cell prints
        # what was held back, the error first.
        shown = console.run("echo $KEEP")
        assert "Interrupted" in shown.split("still-here")[0]
    assert "still-here\n" in shown


def test_enter_on_an_unfinished_loop_asks_for_more_lines_and_runs_them_as_one_cell(open_console) -> None:
    console = open_console(simple=False)
    # Without an answer to is_complete the console would guess "more" for every non-blank line, so a
    # one-line cell that runs on a single Enter shows that the kernel answered "complete".
    seen = console.run("echo one-line-$((1+1))")
    assert "one-line-2\n" in seen
    console.child.send("for i in 1 2; do\r")
    console.child.expect(r"\.\.\.: ", timeout=10)  # the continuation prompt: the console waits for more
    seen += plain(console.child.before)
    console.child.send("echo row-$i\r")
    console.child.send("done\r")
    console.child.send("\r")  # a blank line ends the cell whatever the kernel said of `done`
    console.child.expect("row-1\r\nrow-2\r\n")
    seen += plain(console.child.before)
    console.count += 1
    console.expect_prompt()  # In [3]: the three lines ran as one cell
    assert "syntax error" not in seen
    assert "is_complete" not in seen  # no "kernel did not respond to an is_complete_request" warning


def test_tab_completes_a_magic_name_and_the_completed_magic_runs(open_console) -> None:
    console = open_console(simple=False)
    console.child.send("%sand\t")
    console.child.expect(spelled("%sandbox"), timeout=10)
    console.child.send("\r")
    console.child.expect(r"Sandbox\s+local provider")  # the %sandbox summary, not "unknown magic %sand"
    console.count += 1
    console.expect_prompt()


def test_ctrl_d_ends_the_console_its_kernel_and_the_sandbox_processes(open_console) -> None:
    console = open_console()
    shown = console.run('echo "pids: $$ $PPID"')
    shell_pid, daemon_pid = map(int, re.search(r"pids: (\d+) (\d+)", shown).groups())
    started = console.remember_processes()
    kernel_pid = int(re.search(r"PPid:\s*(\d+)", Path(f"/proc/{daemon_pid}/status").read_text()).group(1))
    assert "owsandbox.kernel" in Path(f"/proc/{kernel_pid}/cmdline").read_text().replace("\0", " ")
    assert {shell_pid, daemon_pid, kernel_pid} <= started

    console.child.sendeof()
    console.child.expect(r"Do you really want to exit \(\[y\]/n\)\? ")
    console.child.send("y\r")
    console.child.expect("Shutting down kernel")
    console.child.expect(pexpect.EOF, timeout=20)
    console.child.close()
    assert console.child.exitstatus == 0

    left = console.processes.still_running_after(10)
    assert not left, {pid: Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ") for pid in left
                      if Path(f"/proc/{pid}").exists()}


def test_exit_leaves_the_console_as_it_would_close_a_terminal(open_console) -> None:
    console = open_console()
    assert "ready\n" in console.run("echo ready")
    console.remember_processes()
    console.child.sendline("exit")
    console.child.expect("exited \\(status 0\\); the next cell starts a new shell in ")
    console.child.expect("Shutting down kernel")
    console.child.expect(pexpect.EOF, timeout=20)
    console.child.close()
    assert console.child.exitstatus == 0
    assert not console.processes.still_running_after(10)


@pytest.mark.parametrize("magic", ["write", "shell", "send"])
def test_a_cell_magic_waits_for_its_body_until_a_blank_line(open_console, magic: str) -> None:
    """Enter after `%%write PATH` (or `%%shell`, `%%send`) does not run the cell with no body: the
    console asks for more lines, and a blank line runs the header and the body as one cell."""
    console = open_console(simple=False)
    engine = Path(__file__).resolve().parents[1] / "notebooks" / "engines" / "echo_engine.py"
    header, body, shown = {
        "write": ("%%write note.txt", "first line of the body", None),
        "shell": ("%%shell other", "echo on-$OWSANDBOX_SHELL", "on-other"),
        "send": ("%%send", '{"id": "c1", "type": "echo", "text": "from-the-body"}', "from-the-body"),
    }[magic]
    if magic == "send":
        console.run(f"%attach -- {sys.executable} {engine}")
    console.child.send(header + "\r")
    console.child.expect(r"\.\.\.: ", timeout=10)  # the console waits for the body
    console.child.send(body + "\r")
    console.child.expect(r"\.\.\.: ", timeout=10)
    console.child.send("\r")  # the blank line ends the cell
    console.count += 1
    seen = console.expect_prompt()
    if magic == "write":
        assert (console.folder / "workspace" / "note.txt").read_text() == "first line of the body\n"
        assert "wrote 0 bytes" not in seen
    else:
        assert shown in seen, seen
