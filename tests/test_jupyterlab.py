"""The kernel in a real JupyterLab, driven in a real browser (Chromium, headless, through Playwright).

`jupyter lab` is started from this environment on 127.0.0.1 (a port the OS picks, read back from the
server's info file), with a token, with its own config, data, runtime and IPython folders (nothing
from the user's Jupyter folders is read) and with the news feed, the update check and the PyPI
extension manager turned off, so it makes no request off this machine; the browser's own requests off
the server are aborted too. Its settings keep every cell in the page (windowing off), whatever a
later JupyterLab's default. Its root folder holds a copy of `notebooks/tour.ipynb` whose kernelspec is the test kernel
`owsandbox-test` (local provider, found through JUPYTER_PATH: tests/conftest.py).

The page opens the tour, waits for the kernel to be idle, runs every cell from the Run menu (the
cells that fail on purpose are tagged `raises-exception`, so the run goes on past them) and reads
what JupyterLab rendered: the stream text of shell cells, the SVG that `owdisplay chart.svg` shows,
the `%shells` table, and an error (name in red, as the traceback's ANSI colour asks) in exactly the
tagged cells. Then Stop: a new cell `echo started; sleep 60` is run, and once "started" shows, the
toolbar's ■ must end it with `Interrupted` within seconds, and the next cell still finds the shell
and its variables.

A screenshot of the page is saved in the test's tmp folder (its path is printed). Whatever happens,
the browser and the server are shut down, and every process seen under the server (kernel, sandbox
daemon, shells) must be gone afterwards.

Needs the `chromium` system package (Debian: apt-get install chromium) and the `playwright` and
`jupyterlab` Python packages (the test extra); Playwright's own browser download is not used. Without
them the test is skipped on a developer's machine and fails in CI.
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
from pathlib import Path
from typing import Any

import pytest

from .conftest import KERNEL_NAME
from .processes import PinnedProcesses

TOUR = Path(__file__).resolve().parents[1] / "notebooks" / "tour.ipynb"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SERVER_START_SECONDS = 60
KERNEL_IDLE_MS = 60_000  # the page loads and starts a kernel, which starts its sandbox
RUN_ALL_MS = 60_000
STEP_MS = 30_000
INTERRUPT_MS = 5_000
STDOUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stdout"]'
STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
ERROR = STDERR + ":has(.ansi-red-fg)"  # an error output: its traceback starts with the name in red
SVG = '.jp-OutputArea-output[data-mime-type="image/svg+xml"]'
HTML = '.jp-OutputArea-output[data-mime-type="text/html"]'


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
    """One `jupyter lab` server with its own folders; remembers (by pidfd) every process seen under it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
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
        env = {
            **os.environ,  # JUPYTER_PATH finds the owsandbox-test kernelspec (tests/conftest.py)
            "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_DATA_DIR": str(self.folder / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.runtime),
            "IPYTHONDIR": str(self.folder / "ipython"),
            "PYTHONUNBUFFERED": "1",
        }
        args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                "--ServerApp.port=0", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={self.root}", "--ServerApp.allow_root=True",
                "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly"]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(args, cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT)
        # With port 0 the OS picks the port; the server writes it to jpserver-<pid>.json once it listens.
        info_file = self.runtime / f"jpserver-{self.process.pid}.json"
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"jupyter lab exited with status {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not answer within {SERVER_START_SECONDS} s:\n{self.log()}")
            if not self.url and info_file.exists():
                try:
                    self.url = f"http://127.0.0.1:{json.loads(info_file.read_text())['port']}/"
                except (ValueError, KeyError):
                    pass  # being written
            if self.url:
                try:
                    with urllib.request.urlopen(f"{self.url}api/status?token={self.token}", timeout=5) as answer:
                        if answer.status == 200:
                            return
                except (OSError, urllib.error.URLError):
                    pass
            time.sleep(0.1)  # no event to wait on: the file and the port are polled

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def remember_processes(self) -> dict[int, str]:
        """The server and everything under it now (kernels, sandbox daemons, shells), pinned by pidfd."""
        if self.process is None:
            return {}
        return self.processes.add_tree(self.process.pid)

    def stop(self) -> dict[int, str]:
        """Terminate the server (it shuts its kernels down), kill it if it lingers; the processes seen
        under it that were still running 15 s later (they are killed)."""
        left: dict[int, str] = {}
        try:
            if self.process is not None:
                if self.process.poll() is None:
                    self.remember_processes()
                    self.process.terminate()
                    try:
                        self.process.wait(30)
                    except subprocess.TimeoutExpired:
                        self.process.kill()
                        self.process.wait(10)
                running = self.processes.still_running_after(15)
                left = {pid: self.processes.seen[pid] for pid in running}
                self.processes.kill(running)
        finally:
            self.processes.close()
        return left


def tour_for_test_kernel(folder: Path) -> dict[str, Any]:
    """Copy the tour into `folder` with the test kernel as its kernelspec; the notebook as written."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    notebook = json.loads(TOUR.read_text())
    notebook["metadata"]["kernelspec"] = {"name": KERNEL_NAME, "display_name": spec.display_name,
                                          "language": spec.language}
    (folder / "tour.ipynb").write_text(json.dumps(notebook, indent=1))
    return notebook


def tags(cell: dict[str, Any]) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def run_the_tour(page: Any, code_cells: list[dict[str, Any]], display_name: str) -> None:
    """With the tour open: wait for its kernel, run all cells from the Run menu, check what JupyterLab rendered."""
    from playwright.sync_api import expect

    # The status bar names the notebook's kernel and its state once the kernel is up.
    expect(page.locator("#jp-main-statusbar").get_by_text(f"{display_name} | Idle")).to_be_visible(
        timeout=KERNEL_IDLE_MS)
    notebook = page.locator(".jp-NotebookPanel .jp-Notebook")
    code = notebook.locator(".jp-CodeCell")
    prompts = code.locator(".jp-InputPrompt")
    expect(prompts).to_have_count(len(code_cells))

    # Run → Run All Cells; done when every code cell shows its execution count, in order.
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator('li[data-command="runmenu:run-all"]').click()
    expect(prompts).to_have_text([f"[{n}]:" for n in range(1, len(code_cells) + 1)], timeout=RUN_ALL_MS)
    expect(page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator")).to_have_attribute("data-status", "idle")

    # Stream text from shell cells: state kept from cell to cell, stdout and stderr apart.
    expect(notebook.locator(STDOUT).filter(has_text="hello from the sandbox, in tour-demo")).to_have_count(1)
    expect(notebook.locator(STDOUT).filter(has_text="step 3")).to_have_text(re.compile(r"^step 1\nstep 2\nstep 3\n?$"))
    expect(notebook.locator(STDERR).filter(has_text="a warning")).to_have_count(1)

    # An error in exactly the cells tagged raises-exception (the run went on past them), with its name.
    for index, cell in enumerate(code_cells):
        expect(code.nth(index).locator(ERROR)).to_have_count(1 if "raises-exception" in tags(cell) else 0)
    expect(notebook.locator(ERROR).filter(has_text="ExitStatus")).to_have_text(
        "ExitStatus: the command exited with status 2")
    expect(notebook.locator(ERROR).filter(has_text="TimedOut")).to_have_text(
        re.compile(r"^TimedOut: timed out after 1 s"))

    # owdisplay chart.svg: an <img> of the SVG, decoded by the browser at the SVG's own width.
    chart = notebook.locator(f"{SVG} img")
    expect(chart).to_have_count(1)
    expect(chart).to_have_attribute("src", re.compile(r"^data:image/svg\+xml"))
    chart.scroll_into_view_if_needed()
    page.wait_for_function("img => img.complete && img.naturalWidth === 170", arg=chart.element_handle())

    # %shells: an HTML table with `main` (the current shell, in tour-demo) and `scratch` (in /tmp).
    table = notebook.locator(f"{HTML} table").filter(has=page.locator("th", has_text="shell"))
    expect(table).to_have_count(1)
    rows = [row.locator("td").all_text_contents() for row in table.locator("tbody tr").all()]
    assert [(row[0].strip(), row[1].rsplit("/", 1)[-1]) for row in rows] == [("* main", "tour-demo"),
                                                                             ("scratch", "tmp")], rows


def stop_a_running_cell(page: Any, executed: int) -> None:
    """A new cell at the end runs a long command; ■ in the toolbar ends it within seconds, and the
    next cell runs on the same shell, its variables kept. `executed`: the cells run so far."""
    from playwright.sync_api import expect

    cells = page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell")
    count = cells.count()
    cells.last.locator(".jp-InputPrompt").click()
    page.locator('.jp-NotebookPanel-toolbar [data-command="notebook:insert-cell-below"]').click()
    expect(cells).to_have_count(count + 1)
    long_cell = cells.nth(count)
    long_cell.locator(".cm-content").click()
    page.keyboard.type("echo started; sleep 60")
    page.keyboard.press("Shift+Enter")  # runs it; a new empty cell follows, in edit mode
    expect(long_cell.locator(STDOUT)).to_have_text("started")
    expect(long_cell.locator(".jp-InputPrompt")).to_have_text("[*]:")

    pressed = time.monotonic()
    page.locator('.jp-NotebookPanel-toolbar [data-command="notebook:interrupt-kernel"]').click()
    expect(long_cell.locator(ERROR)).to_have_text(re.compile(r"^Interrupted: "), timeout=INTERRUPT_MS)
    print(f"Stop → Interrupted rendered in {time.monotonic() - pressed:.2f} s")
    expect(long_cell.locator(".jp-InputPrompt")).to_have_text(f"[{executed + 1}]:")

    expect(cells).to_have_count(count + 2)
    after_cell = cells.nth(count + 1)
    after_cell.locator(".cm-content").click()
    page.keyboard.type('echo "after-stop: $GREETING"')
    page.keyboard.press("Shift+Enter")
    expect(after_cell.locator(STDOUT)).to_have_text("after-stop: hello from the sandbox")
    expect(after_cell.locator(ERROR)).to_have_count(0)
    expect(after_cell.locator(".jp-InputPrompt")).to_have_text(f"[{executed + 2}]:")
    expect(page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator")).to_have_attribute("data-status", "idle")


@pytest.mark.skipif(not hasattr(os, "pidfd_open") or not os.path.isdir("/proc"),
                    reason="follows the server's processes through /proc and pidfds (Linux)")
@pytest.mark.timeout(180)
def test_the_tour_runs_in_jupyterlab_in_chromium_and_stop_interrupts_a_cell(tmp_path: Path) -> None:
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    lab = Lab(tmp_path)
    lab.root.mkdir()
    tour = tour_for_test_kernel(lab.root)
    code_cells = [cell for cell in tour["cells"] if cell["cell_type"] == "code"]
    screenshot = tmp_path / "jupyterlab.png"
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
                    page.goto(f"{lab.url}lab/tree/tour.ipynb?token={lab.token}")
                    run_the_tour(page, code_cells, tour["metadata"]["kernelspec"]["display_name"])
                    seen = lab.remember_processes()
                    assert any("owsandbox.kernel" in cmdline for cmdline in seen.values()), seen
                    stop_a_running_cell(page, len(code_cells))
                    lab.remember_processes()
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
