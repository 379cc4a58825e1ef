"""A real JupyterLab server and a real Chromium page on it, for the tests that look at what the browser shows.

`jupyter lab` is started from this environment on 127.0.0.1 (a port the OS picks, read back from the
server's info file), with a token, with its own config, data, runtime and IPython folders (nothing
from the user's Jupyter folders is read) and with the news feed, the update check and the PyPI
extension manager turned off, so it makes no request off this machine; the browser's own requests off
the server are aborted too. Its settings keep every cell in the page (windowing off), whatever a
later JupyterLab's default. nbgrader's server and lab extensions, which this environment has as test
tooling and a person's JupyterLab does not, are off (tests/server_config.py). Notebooks put in its
root folder name the test kernel `owsandbox-test` (local provider, found through JUPYTER_PATH:
tests/conftest.py).

Whatever happens, a screenshot of the page is saved in the test's folder (its path is printed), the
browser and the server are shut down, and every process seen under the server (kernel, sandbox
daemon, shells) must be gone afterwards.

Needs the `chromium` system package (Debian: apt-get install chromium) and the `playwright` and
`jupyterlab` Python packages (the test extra); Playwright's own browser download is not used. Without
them the tests are skipped on a developer's machine and fail in CI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .conftest import KERNEL_NAME
from .processes import PinnedProcesses, stop_watched
from .server_config import without_nbgrader
from .waiting import WaitTimeout, patience, wait_until

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SERVER_START_SECONDS = 60
KERNEL_IDLE_MS = 60_000  # the page loads and starts a kernel, which starts its sandbox
RUN_ALL_MS = 60_000
PAGE_LOAD_MS = 60_000  # JupyterLab's page and its scripts, on a quiet machine (stretched by `patience`)
STEP_MS = 30_000
STDOUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stdout"]'
STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
ERROR = STDERR + ":has(.ansi-red-fg)"  # an error output: its traceback starts with the name in red
SVG = '.jp-OutputArea-output[data-mime-type="image/svg+xml"]'
HTML = '.jp-OutputArea-output[data-mime-type="text/html"]'
MARKDOWN = '.jp-OutputArea-output[data-mime-type="text/markdown"]'
NOTE = HTML + ":has(pre)"  # a note of the kernel's own (owsandbox/kernel/cell/notes.py): dimmed, not stderr
needs_linux_processes = pytest.mark.skipif(not hasattr(os, "pidfd_open") or not os.path.isdir("/proc"),
                                           reason="follows the server's processes through /proc and pidfds (Linux)")


def chromium_or_skip() -> str:
    """The Chromium to drive; skip on a developer's machine without it or Playwright, fail in CI."""
    problems = []
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        problems.append("Chromium is not installed (Debian: apt-get install chromium)")
    for module, package in (("playwright", "playwright"), ("jupyterlab", "jupyterlab")):
        if importlib.util.find_spec(module) is None:
            problems.append(f"the Python package {package} is not installed (pip install -e '.[test]')")
    if problems:
        if os.environ.get("CI"):
            pytest.fail("CI must be able to run JupyterLab in Chromium: " + "; ".join(problems))
        pytest.skip("; ".join(problems))
    assert chromium is not None
    return chromium


class Lab:
    """One `jupyter lab` server with its own folders; remembers (by pidfd) every process seen under it.
    `args` are more command-line options for it, `env` more environment variables (e.g. a gateway's)."""

    def __init__(self, folder: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        self.folder = folder
        self.args = list(args)
        self.env = dict(env or {})
        self.root = folder / "root"
        self.runtime = folder / "runtime"
        self.token = secrets.token_hex(16)
        self.url = ""
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = folder / "jupyter-lab.log"
        self.processes = PinnedProcesses()  # every process seen under the server

    def start(self) -> None:
        config = self.folder / "config"
        settings = config / "lab" / "user-settings" / "@jupyterlab"
        for plugin, values in (
            # No "get notified about Jupyter news?" toast over the notebook, no update check.
            ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
            # Every cell stays in the page, scrolled into view or not, whatever a later JupyterLab's default.
            ("notebook-extension/tracker", {"windowingMode": "none"}),
        ):
            path = settings / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        without_nbgrader(config)
        env = {
            **os.environ,  # JUPYTER_PATH finds the owsandbox-test kernelspec (tests/conftest.py)
            "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_DATA_DIR": str(self.folder / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.runtime),
            "IPYTHONDIR": str(self.folder / "ipython"),
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                "--ServerApp.port=0", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={self.root}", "--ServerApp.allow_root=True",
                "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly", *self.args]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(args, cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT)
        # With port 0 the OS picks the port; the server writes it to jpserver-<pid>.json once it listens.
        info_file = self.runtime / f"jpserver-{self.process.pid}.json"

        def answering() -> bool:
            if self.process.poll() is not None:
                pytest.fail(f"jupyter lab exited with status {self.process.returncode}:\n{self.log()}")
            if not self.url and info_file.exists():
                try:
                    self.url = f"http://127.0.0.1:{json.loads(info_file.read_text())['port']}/"
                except (ValueError, KeyError):
                    pass  # being written
            if self.url:
                try:
                    with urllib.request.urlopen(f"{self.url}api/status?token={self.token}", timeout=5) as answer:
                        return answer.status == 200
                except (OSError, urllib.error.URLError):
                    pass
            return False

        bound = patience(SERVER_START_SECONDS)  # 6 s on a quiet pair of slow cores; over 60 at a load of 10
        try:  # no event to wait on: the file and the port are polled
            wait_until(answering, bound, "jupyter lab to answer", interval=0.1)
        except WaitTimeout:
            pytest.fail(f"jupyter lab did not answer within {bound:.0f} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def open(self, page: Any, notebook: str) -> None:
        """Open `notebook` (a file in the root folder) in JupyterLab, logged in by the token."""
        # The page's load (JupyterLab's scripts) took over Playwright's 30 s under two test runs at once.
        page.goto(f"{self.url}lab/tree/{notebook}?token={self.token}", timeout=patience(PAGE_LOAD_MS / 1000) * 1000)

    def remember_processes(self) -> dict[int, str]:
        """The server and everything under it now (kernels, sandbox daemons, shells), pinned by pidfd."""
        if self.process is None or self.process.poll() is not None:  # a reaped pid may be someone else's now
            return dict(self.processes.seen)
        return self.processes.add_tree(self.process.pid)

    def stop(self) -> dict[int, str]:
        """Terminate the server (it shuts its kernels down), kill it if it lingers; the processes seen
        under it that were still running 15 s later (they are killed)."""
        return stop_watched(self.process, self.processes, self.remember_processes)


def stop_from_toolbar(page: Any, cell: Any, timeout_ms: int = 5_000) -> float:
    """Press ■ in the notebook's toolbar and wait until `cell` shows the kernel's `Interrupted` error
    (within `timeout_ms` on a quiet machine, stretched by `patience` on a busy one); the seconds from
    the press to that."""
    from playwright.sync_api import expect

    pressed = time.monotonic()
    page.locator('.jp-NotebookPanel-toolbar [data-command="notebook:interrupt-kernel"]').click()
    expect(cell.locator(ERROR)).to_have_text(re.compile(r"^Interrupted: "), timeout=patience(timeout_ms / 1000) * 1000)
    return time.monotonic() - pressed


def context_menu_choose(page: Any, target: Any, label: str, tries: int = 3) -> None:
    """Right-click `target` and click the menu item `label`. Under two test runs at once the item was
    once in the page but hidden for 30 s (the menu gone before the click came, for a reason the page
    did not show): then Escape and open the menu again, up to `tries` times."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    item = page.locator(".lm-Menu").get_by_text(label, exact=True)
    for attempt in range(1, tries + 1):
        target.click(button="right")
        try:
            expect(item).to_be_visible(timeout=patience(10) * 1000)
            item.click(timeout=patience(10) * 1000)
            return
        except (AssertionError, PlaywrightTimeout):
            if attempt == tries:
                raise
            page.keyboard.press("Escape")


def notebook_for_test_kernel(folder: Path, name: str, notebook: dict[str, Any],
                             kernel_name: str = KERNEL_NAME) -> dict[str, Any]:
    """Write `notebook` as `folder/name` with a test kernel (by default `owsandbox-test`) as its kernelspec;
    the notebook as written."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(kernel_name)
    notebook = json.loads(json.dumps(notebook))
    notebook.setdefault("metadata", {})["kernelspec"] = {"name": kernel_name, "display_name": spec.display_name,
                                                         "language": spec.language}
    (folder / name).write_text(json.dumps(notebook, indent=1))
    return notebook


def code_cell(source: str, tags: list[str] | None = None) -> dict[str, Any]:
    return {"cell_type": "code", "id": uuid.uuid4().hex[:8], "execution_count": None,
            "metadata": {"tags": tags or []}, "outputs": [], "source": source}


def run_all_cells(page: Any, count: int, display_name: str) -> None:
    """With a notebook of `count` code cells open: wait for its kernel, run all cells from the Run menu,
    and wait until every one shows its execution count and the kernel is idle again."""
    from playwright.sync_api import expect

    # The status bar names the notebook's kernel and its state once the kernel is up.
    expect(page.locator("#jp-main-statusbar").get_by_text(f"{display_name} | Idle")).to_be_visible(
        timeout=patience(KERNEL_IDLE_MS / 1000) * 1000)
    prompts = page.locator(".jp-NotebookPanel .jp-Notebook .jp-CodeCell .jp-InputPrompt")
    expect(prompts).to_have_count(count)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator('li[data-command="runmenu:run-all"]').click()
    expect(prompts).to_have_text([f"[{n}]:" for n in range(1, count + 1)],
                                 timeout=patience(RUN_ALL_MS / 1000) * 1000)  # two test runs at once took longer
    expect(page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator")).to_have_attribute("data-status", "idle")


@contextmanager
def lab_in_chromium(folder: Path, screenshot_name: str = "jupyterlab.png", lab_args: Sequence[str] = (),
                    lab_env: Mapping[str, str] | None = None) -> Iterator[tuple[Lab, Any]]:
    """A started `Lab` in `folder` (its root folder made, empty; `lab_args` and `lab_env` passed to it) and a
    Chromium page that may reach only it.

    On the way out: a screenshot, the browser closed, the server stopped, what ran under it printed;
    then (unless the body failed) no process seen under the server may still have been running.
    """
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    lab = Lab(folder, lab_args, lab_env)
    lab.root.mkdir()
    screenshot = folder / screenshot_name
    started = time.monotonic()
    try:
        lab.start()
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 1400})
                page.set_default_timeout(STEP_MS)
                off_machine: list[str] = []

                def only_the_server(route: Any) -> None:
                    if route.request.url.startswith(lab.url):
                        route.continue_()
                    else:
                        off_machine.append(route.request.url)
                        route.abort()

                page.route("**/*", only_the_server)
                try:
                    yield lab, page
                finally:
                    try:
                        page.screenshot(path=str(screenshot))
                        print(f"screenshot: {screenshot}")
                    except Exception as exc:  # noqa: BLE001 - a screenshot must not hide the failure
                        print(f"no screenshot: {exc}")
                    if off_machine:
                        print("requests off this machine (aborted):", *off_machine, sep="\n  ")
            finally:
                browser.close()
    finally:
        left = lab.stop()
        seen = sorted(lab.processes.seen.items())
        print("processes seen under jupyter lab:", *(f"{pid} {cmd.replace(lab.token, '<token>')}" for pid, cmd in seen),
              sep="\n  ")
        if left:
            print("still running 15 s after jupyter lab ended (killed):", *left.values(), sep="\n  ")
        print(f"jupyter lab log ({lab.log_path}):\n{lab.log()[-6000:]}")
        print(f"took {time.monotonic() - started:.1f} s")
    assert not left, f"still running 15 s after jupyter lab ended (now killed): {left}"
