"""`owsandbox shell --existing`: a real terminal on a new shell in a running kernel's sandbox.

The system tests start one kernel as a user gets it (bubblewrap: a private /tmp, so a file the notebook
wrote there proves the terminal is in the same sandbox), with its connection file named as Jupyter's
servers name them, in a runtime folder of the module's own; each test drives `owsandbox shell` through
a pty with pexpect, as a person would in their terminal: the prompt, the window size following the pty
(setwinsize), vi, less and `git add -p` drawing and quitting, Ctrl-C and Ctrl-Z, and an exit (or a hang-up)
that leaves no session and no process in the box. Whatever happens, each terminal is killed and the
kernel shut down.

The unit tests are the pure parts: the key a kernel finds its sandbox by, the command the PTY session
runs, the JupyterLab terminal names, `%terminal open`'s text, and what `locate` refuses to connect to.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from owsandbox.channel.control import ExecdControl
from owsandbox.kernel.errors import CellError
from owsandbox.kernel.magics.terminal_open import terminal_open
from owsandbox.terminal import locate
from owsandbox.terminal.boxshell import shell_command
from owsandbox.terminal.launch import LAB_TERMINALS_ENV, kernel_of_lab_terminal, lab_terminal_name

from .conftest import DEFAULT_KERNEL_NAME, KERNEL_NAME, require_bwrap
from .waiting import WaitTimeout, patience, wait_until

START_SECONDS = 30  # the first prompt, and each step below: on a quiet machine (stretched by `patience`)
STEP_SECONDS = 15
PROMPT = "OWS-READY> "  # set by each test: PS1='OWS''-READY> ', so the echoed line does not match
SHELL = [sys.executable, "-c", "import sys; from owsandbox.cli import main; sys.exit(main())", "shell"]


# -- the pure parts -------------------------------------------------------------------------------


@pytest.mark.unit
def test_a_kernel_finds_its_sandbox_by_the_name_of_its_connection_file() -> None:
    assert locate.sandbox_key("/run/jupyter/kernel-1234-abcd.json") == "kernel-1234-abcd"
    one = locate.sandbox_key("/tmp/tmpx1y2.json")
    assert re.fullmatch(r"kernel-file-[0-9a-f]{20}", one) and one == locate.sandbox_key("/tmp/tmpx1y2.json")
    assert one != locate.sandbox_key("/tmp/tmpother.json")


@pytest.mark.unit
def test_the_session_gets_the_window_size_and_a_term_name_only() -> None:
    command = shell_command("xterm-256color", 133, 41, "truecolor")
    assert command.startswith("stty cols 133 rows 41 2>/dev/null; exec env TERM=xterm-256color COLORTERM=truecolor ")
    assert "bash --rcfile <(printf" in command and command.endswith(" -i")
    assert "alias ls='ls --color=auto'" in shlex.split(command.split("<(printf '%s' ", 1)[1].rsplit(")", 1)[0])[0]
    hostile = shell_command("xterm; touch /tmp/pwned", 80, 24, "$(reboot)")
    assert "TERM=xterm-256color" in hostile and "pwned" not in hostile and "reboot" not in hostile


@pytest.mark.unit
def test_jupyterlab_terminal_names_map_to_kernel_ids_and_nothing_else() -> None:
    kernel_id = str(uuid.uuid4())
    name = lab_terminal_name(kernel_id)
    assert name is not None and re.fullmatch(r"\w+", name)  # the terminal WebSocket's route takes \w+ only
    assert kernel_of_lab_terminal(name) == kernel_id
    for other in ("1", "sandbox_", "sandbox_../../x", "sandbox_" + "0" * 32, "term_" + name):
        assert kernel_of_lab_terminal(other) is None, other
    assert lab_terminal_name("not-a-uuid") is None


@pytest.mark.unit
def test_terminal_open_prints_the_command_and_offers_the_lab_button_only_where_it_works(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_id = str(uuid.uuid4())
    connection_file = f"/somewhere/runtime/kernel-{kernel_id}.json"
    monkeypatch.delenv(LAB_TERMINALS_ENV, raising=False)
    shown = terminal_open(connection_file, "bwrap")
    command = shown["text/plain"].strip().splitlines()[-1].strip()
    assert shlex.split(command)[-3:] == ["shell", "--existing", connection_file]
    assert "commandlinker" not in shown["text/html"]  # a terminal of that name would be a plain shell here
    monkeypatch.setenv(LAB_TERMINALS_ENV, "1")
    button = terminal_open(connection_file, "local")["text/html"]
    assert 'data-commandlinker-command="terminal:open"' in button and lab_terminal_name(kernel_id) in button
    for connection, provider, why in ((None, "bwrap", "without a connection file"),
                                      (connection_file, "container", "this kernel's is container")):
        with pytest.raises(CellError, match=why) as raised:
            terminal_open(connection, provider)
        assert raised.value.ename == "NoTerminal"


@pytest.mark.unit
def test_locate_connects_only_to_a_socket_of_the_hosts_own_with_the_hosts_token(tmp_path: Path) -> None:
    folder = tmp_path / "kernel-x"
    (folder / "run").mkdir(parents=True)
    (folder / "run" / "execd.sock").write_text("")  # a file where the socket should be
    with pytest.raises(locate.NoSandbox, match="not a socket of yours"):
        locate.endpoint_in(folder)
    (folder / "run" / "execd.sock").unlink()
    (folder / "run" / "execd.sock").symlink_to("/elsewhere/execd.sock")
    with pytest.raises(locate.NoSandbox, match="not a socket of yours"):
        locate.endpoint_in(folder)
    folder.chmod(0o755)
    assert "open to other users" in str(locate._private_problem(folder))
    assert locate._private_problem(folder / "run" / "execd.sock") is not None  # a link is never a folder


@pytest.mark.unit
def test_an_unknown_connection_file_is_named_in_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    (tmp_path / "kernel-1111-aaaa.json").write_text("{}")
    assert locate.resolve_connection_file("1111-aaaa") == tmp_path / "kernel-1111-aaaa.json"
    assert locate.resolve_connection_file("aaaa") == tmp_path / "kernel-1111-aaaa.json"
    with pytest.raises(locate.NoSandbox, match="no connection file 'nope'"):
        locate.find_sandbox("nope")


# -- through a real kernel and a real terminal ----------------------------------------------------


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jupyter-runtime")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory, runtime: Path) -> Iterator[object]:
    """A kernel as a user gets it (bubblewrap), named kernel-<id>.json as a Jupyter server names it."""
    require_bwrap()
    from .kernel_session import KernelSession

    workspace = tmp_path_factory.mktemp("terminal-ws")
    session = KernelSession(workspace, kernel_name=DEFAULT_KERNEL_NAME,
                            connection_file=str(runtime / f"kernel-{uuid.uuid4()}.json"))
    try:
        yield session
    finally:
        session.close()


class Terminal:
    """`owsandbox shell` in a pty of its own; killed at the end whatever happens."""

    def __init__(self, runtime: Path, args: list[str], rows: int = 24, cols: int = 100,
                 transcript: Path | None = None) -> None:
        env = {**os.environ, "TERM": "xterm-256color", "JUPYTER_RUNTIME_DIR": str(runtime)}
        self.started = time.monotonic()
        self.count = 0  # commands run by `run`
        self.child = pexpect.spawn(args[0], args[1:], env=env, encoding="utf-8", codec_errors="replace",
                                   timeout=patience(STEP_SECONDS), dimensions=(rows, cols))
        if transcript is not None:
            self._log = transcript.open("a", encoding="utf-8")
            self.child.logfile_read = self._log

    def ready(self) -> float:
        """Wait for the shell's own prompt, then set ours; the seconds to the first prompt."""
        self.child.expect(r"[#$] ", timeout=patience(START_SECONDS))
        seconds = time.monotonic() - self.started
        self.child.sendline("PS1='OWS''-READY> '")
        self.child.expect(PROMPT)
        return seconds

    def run(self, line: str, timeout: float | None = None) -> str:
        """Type `line`; what the terminal showed until it was done, escapes and \\r taken out. Done is a
        marker printed after it (a window change redraws the prompt, so prompts cannot be counted)."""
        self.count += 1
        self.child.sendline(f"{line}\nprintf 'OWS-DO''NE-%s\\n' {self.count}")
        self.child.expect(f"OWS-DONE-{self.count}\r\n", timeout=patience(STEP_SECONDS) if timeout is None else timeout)
        shown = plain(self.child.before)
        self.child.expect(PROMPT)
        return shown

    def close(self) -> None:
        """Hang up as a closed window does (the client then deletes its session), then make sure."""
        if self.child.isalive():
            self.child.kill(signal.SIGHUP)
            try:
                self.child.expect(pexpect.EOF, timeout=10)
            except pexpect.TIMEOUT:
                self.child.kill(signal.SIGKILL)
        self.child.close(force=True)


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?>=]*[A-Za-z]|\x1b[=>()][0-9A-B]?|\r", "", text)


@pytest.fixture
def terminal(runtime: Path, kernel: object, tmp_path: Path) -> Iterator[Terminal]:
    term = Terminal(runtime, [*SHELL, "--existing"], transcript=tmp_path / "terminal-transcript.txt")
    try:
        term.ready()
        yield term
    finally:
        term.close()


def sessions(kernel: object) -> list[dict[str, object]]:
    """The box's PTY sessions, asked of its endpoint as the terminal reaches it."""
    connection_file = Path(kernel.km.connection_file)  # type: ignore[attr-defined]
    return ExecdControl(locate.sandbox_of(connection_file).endpoint).list_sessions()


def box_processes(kernel: object, pattern: str) -> str:
    """The box's processes whose command line matches `pattern`, as the notebook sees them."""
    run = kernel.run(f"ps -eo args= | grep -E -- {shlex.quote(pattern)} | grep -v grep || echo none")  # type: ignore[attr-defined]
    return run.text().strip()


def in_foreground(kernel: object, program: str) -> None:
    """Wait until the box runs `program` (its whole command line) in a terminal's foreground group: from
    then on a key the terminal turns into a signal reaches it."""
    def shown() -> bool:
        listing = kernel.run("ps -eo stat=,args=").text()  # type: ignore[attr-defined]
        return any("+" in stat
                   for stat, _, args in (line.strip().partition(" ") for line in listing.splitlines())
                   if args.strip() == program)

    wait_until(shown, patience(STEP_SECONDS), f"`{program}` in the terminal's foreground", interval=0.1)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_command_that_terminal_open_prints_opens_a_shell_in_the_notebooks_sandbox(
        kernel: object, runtime: Path, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    assert kernel.run(f"echo {marker} > /tmp/from-the-notebook; cd /tmp").status == "ok"  # type: ignore[attr-defined]
    shown = kernel.run("%terminal open")  # type: ignore[attr-defined]
    text = shown.of_type("display_data")[0]["data"]["text/plain"]
    command = shlex.split(text.strip().splitlines()[-1])
    assert command[-1] == kernel.km.connection_file  # type: ignore[attr-defined]
    term = Terminal(runtime, command, rows=24, cols=100, transcript=tmp_path / "terminal-transcript.txt")
    try:
        print(f"owsandbox shell: first prompt after {term.ready() * 1000:.0f} ms")
        assert marker in term.run("cat /tmp/from-the-notebook")  # the box's private /tmp: the same sandbox
        assert "\nsandbox\n" in term.run("hostname")
        assert "\n100\n24\n" in term.run("tput cols; tput lines")
        term.child.setwinsize(31, 133)  # the user's window changes: SIGWINCH, then a resize in the box
        assert wait_until(lambda: "\n133\n31\n" in term.run("tput cols; tput lines"), 10,
                          "the box's terminal to follow the window")
        listed = term.run("ls -d --color=always /; alias ls")
        assert "\x1b[" in term.child.before and "alias ls='ls --color=auto'" in listed
        term.run("cd /; export TOUCHED=by-the-terminal")
    finally:
        term.close()
    after = kernel.run('echo "${TOUCHED:-untouched} $PWD"').text()  # type: ignore[attr-defined]
    assert after.strip() == "untouched /tmp", "the notebook's shell must not be touched"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_vi_less_and_git_add_p_draw_and_quit(terminal: Terminal) -> None:
    terminal.run("cd $(mktemp -d) && printf 'line-one\\nline-two\\n' > notes.txt")
    terminal.child.sendline("vi notes.txt")
    terminal.child.expect(r"\x1b\[\?1049h")  # the alternate screen: vi draws full-screen
    terminal.child.expect("line-two")
    terminal.child.send("\x1b:q!\r")
    terminal.child.expect(PROMPT)
    terminal.child.sendline("seq 1 500 | less")
    terminal.child.expect(r"\x1b\[\?1049h")
    terminal.child.expect("23")  # a screenful, then less waits for a key
    terminal.child.send("G")
    terminal.child.expect("500")
    terminal.child.send("q")
    terminal.child.expect(PROMPT)
    terminal.run("git init -q . && git -c user.email=a@b -c user.name=a add notes.txt && "
                 "git -c user.email=a@b -c user.name=a commit -qm one && echo line-three >> notes.txt")
    terminal.child.sendline("git add -p")
    terminal.child.expect(r"Stage this hunk \[y,n,q")
    terminal.child.sendline("y")  # git reads a line (interactive.singleKey is off)
    terminal.child.expect(PROMPT)
    assert "notes.txt" in terminal.run("git diff --cached --name-only")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_stops_a_sleep_ctrl_z_stops_a_job_and_ctrl_d_leaves(terminal: Terminal, kernel: object) -> None:
    # Each key is pressed once the box shows the sleep itself in the terminal's foreground. Not at the
    # line's echo: bash may still be reading it and take the key itself. Nor once a subshell has said
    # it runs: until it execs the sleep, the subshell catches SIGINT and acts on it only at its next
    # check, and an exec comes first (a fresh clone's CI, under load, saw ^C echoed and no prompt).
    terminal.child.sendline("sleep 60")
    in_foreground(kernel, "sleep 60")
    terminal.child.sendcontrol("c")
    try:
        terminal.child.expect(PROMPT)  # well before the 60 s are up (a sleep that ended gives status 0)
    except pexpect.TIMEOUT:
        pytest.fail(f"no prompt after Ctrl-C; the box's sleep 60: {box_processes(kernel, '^sleep 60$')!r}, "
                    f"the terminal showed {terminal.child.before!r}")
    assert "\nstatus=130\n" in terminal.run("echo status=$?")
    terminal.child.sendline("sleep 61")
    in_foreground(kernel, "sleep 61")
    terminal.child.sendcontrol("z")
    terminal.child.expect("Stopped")
    terminal.child.expect(PROMPT)
    assert "sleep 61" in terminal.run("jobs")
    # SIGKILL: a stopped process acts on no other signal until it is continued, which bash's `kill`
    # does for SIGTERM only when its own table already says Stopped (a fresh clone's CI, under load,
    # kept the job 44 s).
    terminal.run("kill -KILL %1; wait")
    # bash drops a killed job from its table once it has reaped it and said so, which may be after the
    # prompt is back: until then Ctrl-D answers "There are stopped jobs" instead of leaving. bash reaps
    # when a SIGCHLD comes, and may look before the death: the box's `ps` then showed the sleep a zombie
    # and `jobs` said Stopped for 15 s, until a next child ended (1 run in 4 of this module). So each
    # look runs a program first, as a user's next command would.
    listings: list[str] = []

    def job_gone() -> bool:
        listings.append(terminal.run("/bin/true; jobs"))
        return "sleep 61" not in listings[-1]

    try:
        wait_until(job_gone, patience(STEP_SECONDS), "the killed job to leave the shell's job table", interval=0)
    except WaitTimeout:
        processes = kernel.run("ps -eo pid,ppid,pgid,stat,wchan:20,args").text()  # type: ignore[attr-defined]
        pytest.fail(f"the killed job stayed in the shell's job table; `jobs` last showed {listings[-1]!r}; "
                    f"the box's processes:\n{processes}")
    terminal.child.sendcontrol("d")  # end of input on an empty line: the shell leaves, as in any terminal
    terminal.child.expect(pexpect.EOF)
    terminal.child.close()
    assert terminal.child.exitstatus == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_exit_leaves_no_session_and_no_process(kernel: object, runtime: Path, tmp_path: Path) -> None:
    term = Terminal(runtime, [*SHELL, "--existing", kernel.km.connection_file],  # type: ignore[attr-defined]
                    transcript=tmp_path / "terminal-transcript.txt")
    try:
        term.ready()
        assert len(sessions(kernel)) == 1
        term.run("sleep 1201 & nohup sleep 1202 >/dev/null 2>&1 & disown; (sleep 1203 &)")
        # `(sleep 1203 &)` execs after the prompt is back: wait for the three, not for the prompt.
        wait_until(lambda: box_processes(kernel, "^sleep 120[123]$").count("sleep") == 3,
                   patience(STEP_SECONDS), "the three sleeps in the box", interval=0.1)
        term.child.sendline("exit 3")
        term.child.expect(pexpect.EOF)
        term.child.close()
        assert term.child.exitstatus == 3
    finally:
        term.close()
    assert sessions(kernel) == []
    # The session leaves the table before its processes are signalled: wait for them to go.
    wait_until(lambda: box_processes(kernel, "^sleep 120[123]$") == "none", patience(STEP_SECONDS),
               "the sleeps to end with the session", interval=0.1)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_terminal_that_hangs_up_leaves_nothing_either(kernel: object, runtime: Path, tmp_path: Path) -> None:
    term = Terminal(runtime, [*SHELL, "--existing"], transcript=tmp_path / "terminal-transcript.txt")
    try:
        term.ready()
        term.run("sleep 1301 &")
        wait_until(lambda: "sleep 1301" in box_processes(kernel, "^sleep 1301$"), patience(STEP_SECONDS),
                   "the sleep in the box", interval=0.1)
        term.child.kill(signal.SIGHUP)  # the user's terminal window was closed
        term.child.expect(pexpect.EOF)
    finally:
        term.close()
    wait_until(lambda: sessions(kernel) == [], 10, "the session to be deleted")
    wait_until(lambda: box_processes(kernel, "^sleep 1301$") == "none", patience(STEP_SECONDS),
               "the sleep to end with the session", interval=0.1)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_local_kernels_terminal_ends_and_says_why_when_the_kernel_shuts_down(tmp_path: Path) -> None:
    from .kernel_session import KernelSession

    runtime = tmp_path / "runtime"
    runtime.mkdir()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    session = KernelSession(workspace, kernel_name=KERNEL_NAME,
                            connection_file=str(runtime / f"kernel-{uuid.uuid4()}.json"))
    term: Terminal | None = None
    try:
        assert session.run("echo ready").status == "ok"  # the sandbox is up
        term = Terminal(runtime, [*SHELL, "--existing"], transcript=tmp_path / "terminal-transcript.txt")
        term.ready()
        assert str(workspace) in term.run("pwd")  # the local provider: the kernel's folder on this machine
        session.close()
        term.child.expect(pexpect.EOF, timeout=30)
        assert "the kernel's sandbox has ended" in plain(term.child.before)
        term.child.close()
        assert term.child.exitstatus == 255
    finally:
        if term is not None:
            term.close()
        session.close()


@pytest.mark.slow
def test_no_terminal_for_a_kernel_that_is_not_there(runtime: Path, kernel: object, tmp_path: Path) -> None:
    stray = tmp_path / f"kernel-{uuid.uuid4()}.json"
    stray.write_text(json.dumps({"kernel_name": "python3"}))
    done = pexpect.run(shlex.join([*SHELL, "--existing", str(stray)]), withexitstatus=True, encoding="utf-8",
                       env={**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime)}, timeout=30)
    output, status = done
    assert status == 1 and f"no sandbox state for {stray.stem}" in output, output


# -- what a terminal user expects in the notebook's own shells too --------------------------------


@pytest.mark.timeout(60)
def test_the_notebooks_shells_colour_ls_and_grep_on_a_terminal_and_keep_the_bytes_on_pipes(kernel: object) -> None:
    shown = kernel.run("alias; ls -d /; echo sandbox | grep box")  # type: ignore[attr-defined]
    text = shown.text()
    assert "alias ls='ls --color=auto'" in text and "alias grep='grep --color=auto'" in text
    assert re.search(r"\x1b\[[0-9;]*m/\x1b\[0m", text), repr(text)  # the folder in its LS_COLORS colour
    assert re.search(r"sand\x1b\[[0-9;]*m(\x1b\[K)?box", text), repr(text)  # grep's match
    assert kernel.run("%terminal off").status == "ok"  # type: ignore[attr-defined]
    try:
        assert kernel.run("ls -d /").text() == "/\n"  # type: ignore[attr-defined]
    finally:
        kernel.run("%terminal on")  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_shift_tab_shows_what_man_f_says(kernel: object) -> None:
    reply = kernel.kc.inspect("ls", 2, reply=True, timeout=30)["content"]  # type: ignore[attr-defined]
    assert reply["found"], reply
    assert "list directory contents" in reply["data"]["text/plain"], reply
