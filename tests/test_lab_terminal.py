"""The sandbox terminal in JupyterLab, in Chromium: `%terminal open`'s button opens a JupyterLab terminal
running `owsandbox shell --existing` for the notebook's kernel.

JupyterLab runs with owsandbox's terminal manager (the one setting docs/how-to/jupyterlab.md gives) and the terminal's
screen-reader mode on, so that what xterm.js draws is also text in the page. The notebook's kernel is
the default one (bubblewrap: a private /tmp). A cell writes a file in the box's /tmp and `%terminal
open` shows its button; the click opens a terminal where that file is seen, `top -n1` draws its
full screen and ends, and vi draws and quits. Typed into the terminal, a command also writes what it
saw into the workspace, where the test reads it from this machine. The server is shut down at the
end, and every process seen under it (kernel, sandbox, terminal, `owsandbox shell`) must be gone
(tests/lab_browser.py).
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from .conftest import DEFAULT_KERNEL_NAME, require_bwrap
from .lab_browser import code_cell, lab_in_chromium, needs_linux_processes, notebook_for_test_kernel
from .waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.system]

MANAGER = "--TerminalsExtensionApp.terminal_manager_class=owsandbox.terminal.lab.SandboxTerminalManager"
TERMINAL_MS = 30_000


def screen_reader_terminals(folder: Path) -> None:
    """JupyterLab's terminal setting that keeps the screen's text in the page (xterm.js' accessibility tree)."""
    path = folder / "config" / "lab" / "user-settings" / "@jupyterlab" / "terminal-extension" / \
        "plugin.jupyterlab-settings"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"screenReaderMode": True}))


@needs_linux_processes
@pytest.mark.timeout(600)  # a hang guard (155 s with two test runs at once); its waits scale with the load
def test_terminal_open_opens_a_jupyterlab_terminal_in_the_notebooks_sandbox(tmp_path: Path) -> None:
    require_bwrap()
    from playwright.sync_api import expect

    marker = uuid.uuid4().hex[:12]
    screen_reader_terminals(tmp_path)
    with lab_in_chromium(tmp_path, "jupyterlab-terminal.png", lab_args=[MANAGER]) as (lab, page):
        notebook = notebook_for_test_kernel(lab.root, "terminal.ipynb", {
            "cells": [code_cell(f"echo {marker} > /tmp/lab-check"), code_cell("%terminal open")],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, kernel_name=DEFAULT_KERNEL_NAME)
        lab.open(page, "terminal.ipynb")
        display_name = notebook["metadata"]["kernelspec"]["display_name"]
        expect(page.locator("#jp-main-statusbar").get_by_text(f"{display_name} | Idle")).to_be_visible(timeout=60_000)
        cells = page.locator(".jp-NotebookPanel .jp-Notebook .jp-CodeCell")
        for index in range(2):
            cells.nth(index).locator(".jp-InputPrompt").click()
            page.keyboard.press("Shift+Enter")
            expect(cells.nth(index).locator(".jp-InputPrompt")).to_have_text(f"[{index + 1}]:")

        button = cells.nth(1).get_by_role("button", name="Open it as a JupyterLab terminal")
        expect(button).to_be_visible()
        button.click()
        terminal = page.locator(".jp-Terminal")
        dialog = page.locator(".jp-Dialog")
        expect(terminal.or_(dialog).first).to_be_visible(timeout=TERMINAL_MS)
        if dialog.count():  # JupyterLab may ask before it runs a command from an output
            print("JupyterLab asked:", dialog.inner_text())
            dialog.locator(".jp-mod-accept").first.click()
        expect(terminal).to_be_visible(timeout=TERMINAL_MS)
        screen = terminal.locator(".xterm-accessibility-tree")
        expect(screen).to_contain_text("owsandbox shell: a new shell in the sandbox", timeout=TERMINAL_MS)
        expect(screen).to_contain_text("@sandbox:", timeout=TERMINAL_MS)
        lab.remember_processes()

        terminal.locator(".xterm-helper-textarea").focus()
        page.keyboard.type("cat /tmp/lab-check; echo seen-$((6*7))\n")
        expect(screen).to_contain_text("seen-42")
        expect(screen).to_contain_text(marker)

        # A full-screen program reads keys until it has left: each next command is typed only once the
        # shell's prompt is back after it.
        page.keyboard.type("top -n1\n")  # clears the screen, draws one frame, and ends
        # (its first line, with the load average, may have scrolled away under the prompt that follows)
        expect(screen).to_contain_text(re.compile(r"Tasks:[\s\S]*PID\s+USER[\s\S]*\btop\b[\s\S]*root@sandbox:\S*#\s*$"))
        page.keyboard.type("vi notes.txt\n")
        # vi's own status line names the file in quotes; the echoed command line does not (keys typed
        # before vi has the terminal would reach the shell instead)
        expect(screen).to_contain_text('"notes.txt"', timeout=TERMINAL_MS)
        page.keyboard.press("Escape")
        page.keyboard.type(":q!\n")
        expect(screen).to_contain_text(re.compile(r"vi notes\.txt\s*root@sandbox:\S*#\s*$"))
        page.keyboard.type("{ cat /tmp/lab-check; top -b -n1 | head -3; tput cols; } > seen-by-terminal.txt\n")
        seen = lab.root / "seen-by-terminal.txt"
        wait_until(lambda: seen.exists() and seen.read_text().count("\n") >= 5, 20, "the terminal's file")
        text = seen.read_text()
        assert text.startswith(marker + "\n") and re.search(r"load average|Tasks:", text), text
        assert int(text.strip().splitlines()[-1]) > 20, text  # the terminal has the width xterm.js gave it
        lab.remember_processes()
        assert any("owsandbox.terminal" in cmdline for cmdline in lab.processes.seen.values()), lab.processes.seen
