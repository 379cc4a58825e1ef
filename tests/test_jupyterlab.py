"""The kernel in a real JupyterLab, driven in a real browser (Chromium, headless, through Playwright).

A `jupyter lab` of its own and a Chromium page that may reach only it (tests/lab_browser.py): its
root folder holds a copy of `notebooks/tour.ipynb` whose kernelspec is the test kernel `owsandbox-test`.

The page opens the tour, waits for the kernel to be idle, runs every cell from the Run menu (the
cells that fail on purpose are tagged `raises-exception`, so the run goes on past them) and reads
what JupyterLab rendered: the stream text of shell cells, the SVG that `owdisplay chart.svg` shows,
the `%shells` table, and an error (name in red, as the traceback's ANSI colour asks) in exactly the
tagged cells. Then Stop: a new cell `echo started; sleep 60` is run, and once "started" shows, the
toolbar's ■ must end it with `Interrupted` within seconds, and the next cell still finds the shell
and its variables.

A screenshot is saved in the test's tmp folder, and every process seen under the server must be gone
afterwards (tests/lab_browser.py). The README's picture (docs/_static/jupyterlab.png) is made by the test
that runs the tour on the default kernel (bubblewrap), asked with `DOCS_SCREENSHOT=PATH`; an ordinary run
skips it and writes nothing outside its tmp folder.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from .lab_browser import (
    ERROR,
    HTML,
    NOTE,
    STDERR,
    STDOUT,
    SVG,
    code_cell,
    context_menu_choose,
    lab_in_chromium,
    needs_linux_processes,
    notebook_for_test_kernel,
    run_all_cells,
    stop_from_toolbar,
)
from .waiting import patience

pytestmark = [pytest.mark.slow, pytest.mark.system]

TOUR = Path(__file__).resolve().parents[1] / "notebooks" / "tour.ipynb"
DOCS_SCREENSHOT = "DOCS_SCREENSHOT"  # where to save the README's picture of the tour, when set
INTERRUPT_MS = 5_000


def tour_for_test_kernel(folder: Path) -> dict[str, Any]:
    """Copy the tour into `folder` with the test kernel as its kernelspec; the notebook as written."""
    return notebook_for_test_kernel(folder, "tour.ipynb", json.loads(TOUR.read_text()))


def tags(cell: dict[str, Any]) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def run_the_tour(page: Any, code_cells: list[dict[str, Any]], display_name: str,
                 where: str = "[sandbox: local · no isolation") -> None:
    """With the tour open: wait for its kernel, run all cells from the Run menu, check what JupyterLab rendered
    (`where`: how the first cell's note starts)."""
    from playwright.sync_api import expect

    notebook = page.locator(".jp-NotebookPanel .jp-Notebook")
    code = notebook.locator(".jp-CodeCell")
    run_all_cells(page, len(code_cells), display_name)

    # Stream text from shell cells: state kept from cell to cell, stdout and stderr apart.
    expect(notebook.locator(STDOUT).filter(has_text="hello from the sandbox, in tour-demo")).to_have_count(1)
    expect(notebook.locator(STDOUT).filter(has_text="step 3")).to_have_text(re.compile(r"^step 1\nstep 2\nstep 3\n?$"))
    expect(notebook.locator(STDERR).filter(has_text="a warning")).to_have_count(1)

    # The first cell says where commands run, as a dimmed note of the kernel's, not in red on stderr.
    expect(code.nth(0).locator(NOTE).filter(has_text=where)).to_have_count(1)
    expect(notebook.locator(STDERR).filter(has_text="[sandbox")).to_have_count(0)

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
    table = notebook.locator(f"{HTML} table").filter(has=page.locator("th", has_text=re.compile(r"^\s*shell\s*$")))
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
    # The kernel runs it as soon as it is idle; two test runs at once took over Playwright's 5 s here.
    expect(long_cell.locator(STDOUT)).to_have_text("started", timeout=patience(30) * 1000)
    expect(long_cell.locator(".jp-InputPrompt")).to_have_text("[*]:")

    print(f"Stop → Interrupted rendered in {stop_from_toolbar(page, long_cell, INTERRUPT_MS):.2f} s")
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


@needs_linux_processes
@pytest.mark.timeout(600)  # a hang guard (155 s with two test runs at once); its waits scale with the load
def test_the_tour_runs_in_jupyterlab_in_chromium_and_stop_interrupts_a_cell(tmp_path: Path) -> None:
    with lab_in_chromium(tmp_path, "jupyterlab.png") as (lab, page):
        tour = tour_for_test_kernel(lab.root)
        code_cells = [cell for cell in tour["cells"] if cell["cell_type"] == "code"]
        lab.open(page, "tour.ipynb")
        run_the_tour(page, code_cells, tour["metadata"]["kernelspec"]["display_name"])
        seen = lab.remember_processes()
        assert any("owsandbox.kernel" in cmdline for cmdline in seen.values()), seen
        stop_a_running_cell(page, len(code_cells))
        lab.remember_processes()


@needs_linux_processes
@pytest.mark.timeout(600)  # a hang guard (155 s with two test runs at once); its waits scale with the load
def test_the_docs_screenshot_is_the_tour_on_the_default_kernel(tmp_path: Path) -> None:
    """The README's picture: the tour run in JupyterLab on the kernel a user gets (bubblewrap here), the top of
    the page (the file browser, the notebook's first cells and `%sandbox`) at 1280x860, saved at
    $DOCS_SCREENSHOT. Only when asked, so that an ordinary run leaves the repository as it is."""
    target = os.environ.get(DOCS_SCREENSHOT)
    if not target:
        pytest.skip(f"makes the docs' screenshot only when asked: {DOCS_SCREENSHOT}=docs/_static/jupyterlab.png")
    from .conftest import DEFAULT_KERNEL_NAME, require_bwrap

    require_bwrap()
    with lab_in_chromium(tmp_path, "docs-screenshot.png") as (lab, page):
        tour = notebook_for_test_kernel(lab.root, "tour.ipynb", json.loads(TOUR.read_text()),
                                        kernel_name=DEFAULT_KERNEL_NAME)
        code_cells = [cell for cell in tour["cells"] if cell["cell_type"] == "code"]
        lab.open(page, "tour.ipynb")
        run_the_tour(page, code_cells, tour["metadata"]["kernelspec"]["display_name"], "[sandbox: bubblewrap")
        page.locator(".jp-NotebookPanel .jp-Cell").first.scroll_into_view_if_needed()
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path), clip={"x": 0, "y": 0, "width": 1280, "height": 860})
        assert path.stat().st_size > 10_000, f"{path}: too small for a picture of the tour"
        print(f"the docs' screenshot: {path}")
        lab.remember_processes()


DOLLARS = "pay $PRICE and $TAX"


@needs_linux_processes
@pytest.mark.timeout(600)  # a hang guard (155 s with two test runs at once); its waits scale with the load
def test_dollars_in_the_kernels_tables_and_notes_are_not_typeset_as_math(tmp_path: Path) -> None:
    """A bash kernel's text is full of `$`: the tables and notes the kernel makes are shown as written,
    while the notebook's own Markdown math (the control) is still typeset."""
    from playwright.sync_api import expect

    cells = [{"cell_type": "markdown", "id": "math", "metadata": {}, "source": "Energy: $E = mc^2$ here."},
             code_cell(f"mkdir -p '{DOLLARS}' && cd '{DOLLARS}' && echo in"), code_cell("%shells"),
             code_cell("%sandbox"), code_cell("echo gone; exit 3", tags=["raises-exception"])]
    with lab_in_chromium(tmp_path, "dollars.png") as (lab, page):
        notebook = notebook_for_test_kernel(lab.root, "dollars.ipynb", {"cells": cells, "metadata": {},
                                                                        "nbformat": 4, "nbformat_minor": 5})
        lab.open(page, "dollars.ipynb")
        run_all_cells(page, 4, notebook["metadata"]["kernelspec"]["display_name"])
        area = page.locator(".jp-NotebookPanel .jp-Notebook")
        expect(area.locator(".jp-MarkdownCell mjx-container")).to_have_count(1)  # math is on in this page
        shells = area.locator(f"{HTML} table").filter(has=page.locator("th", has_text=re.compile(r"^\s*shell\s*$")))
        expect(shells).to_contain_text(DOLLARS)
        expect(area.locator(f"{HTML} table").filter(has_text="Writes to")).to_have_count(1)
        expect(area.locator(NOTE).first).to_be_visible()
        expect(area.locator(".jp-OutputArea mjx-container")).to_have_count(0)
        assert DOLLARS in area.locator(".jp-OutputArea").all_text_contents().__str__()
        # The dimmed note's text starts where the stream's text does (JupyterLab pads stream output by 1ch).
        first = area.locator(".jp-CodeCell").nth(0)
        note, out = first.locator(f"{NOTE} pre"), first.locator(f"{STDOUT} pre")
        expect(out).to_have_text("in")
        lefts = [box.evaluate(TEXT_LEFT) for box in (note, out)]
        assert abs(lefts[0] - lefts[1]) <= 1.5, lefts
        lab.remember_processes()


# Where an element's first line of text starts, in the page's pixels.
TEXT_LEFT = "el => { const r = document.createRange(); r.selectNodeContents(el); return r.getClientRects()[0].left; }"


@needs_linux_processes
@pytest.mark.timeout(600)  # a hang guard: 125 s in one of two test runs at once, over 240 s in the other
def test_a_flood_in_a_default_jupyterlab_ends_with_its_last_line_and_a_note_not_the_servers_warning(
        tmp_path: Path) -> None:
    """`seq 1 1000000` with the server's default iopub rate limits: the head streams, the rest is a live
    tail ending in 1000000, a note says what was not streamed, and the server never drops output."""
    from playwright.sync_api import expect

    cells = [code_cell("seq 1 1000000"), code_cell("echo after-the-flood")]
    with lab_in_chromium(tmp_path, "flood.png") as (lab, page):
        notebook = notebook_for_test_kernel(lab.root, "flood.ipynb", {"cells": cells, "metadata": {},
                                                                      "nbformat": 4, "nbformat_minor": 5})
        lab.open(page, "flood.ipynb")
        run_all_cells(page, 2, notebook["metadata"]["kernelspec"]["display_name"])
        flood = page.locator(".jp-NotebookPanel .jp-Notebook .jp-CodeCell").nth(0)
        expect(flood.locator(".jp-OutputArea-output").filter(has_text="were not streamed")).to_have_count(1)
        expect(flood.locator(".jp-OutputArea-output").filter(
            has_text=re.compile(r"999999\s+1000000\s*$"))).to_have_count(1)
        expect(page.locator(".jp-NotebookPanel .jp-Notebook")).not_to_contain_text("IOPub data rate exceeded")
        expect(page.locator(".jp-NotebookPanel .jp-Notebook .jp-CodeCell").nth(1).locator(STDOUT)).to_have_text(
            "after-the-flood")
        assert "IOPub data rate exceeded" not in lab.log()
        lab.remember_processes()


@needs_linux_processes
@pytest.mark.timeout(600)  # a hang guard (155 s with two test runs at once); its waits scale with the load
def test_a_subshell_console_runs_a_cell_while_the_notebooks_cell_runs(tmp_path: Path) -> None:
    """JupyterLab's "New Subshell Console for Notebook" (the notebook's context menu): the console's cells
    run on a kernel subshell, which is a shell of its own in the same sandbox, while the notebook is busy."""
    from playwright.sync_api import expect

    cells = [code_cell("echo notebook-started; sleep 60; echo notebook-never")]
    with lab_in_chromium(tmp_path, "subshell-console.png") as (lab, page):
        notebook = notebook_for_test_kernel(lab.root, "busy.ipynb", {"cells": cells, "metadata": {},
                                                                     "nbformat": 4, "nbformat_minor": 5})
        lab.open(page, "busy.ipynb")
        busy = page.locator(".jp-NotebookPanel .jp-Notebook .jp-CodeCell").nth(0)
        expect(page.locator("#jp-main-statusbar").get_by_text(
            f"{notebook['metadata']['kernelspec']['display_name']} | Idle")).to_be_visible(timeout=60_000)
        # Opened while the kernel is idle: JupyterLab asks for the kernel's info on the main shell as it opens one.
        context_menu_choose(page, page.locator(".jp-NotebookPanel .jp-Notebook"), "New Subshell Console for Notebook")
        console = page.locator(".jp-ConsolePanel")
        expect(console.locator(".jp-CodeConsole-banner")).to_contain_text("owsandbox", timeout=30_000)
        busy.locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        expect(busy.locator(STDOUT)).to_have_text("notebook-started", timeout=30_000)
        prompt = console.locator(".jp-CodeConsole-promptCell .cm-content")
        prompt.click()
        page.keyboard.type('cd /tmp; echo "from the console in $PWD"')
        page.keyboard.press("Shift+Enter")
        expect(console.locator(".jp-CodeConsole-content " + STDOUT)).to_contain_text("from the console in /tmp",
                                                                                       timeout=30_000)
        expect(busy.locator(".jp-InputPrompt")).to_have_text("[*]:")  # the notebook's cell still runs
        prompt.click()
        page.keyboard.type("%shells")
        page.keyboard.press("Shift+Enter")
        expect(console.locator(f".jp-CodeConsole-content {HTML} table")).to_contain_text("(kernel subshell)",
                                                                                          timeout=30_000)
        lab.remember_processes()
        stop_from_toolbar(page, busy, INTERRUPT_MS)  # the notebook's Stop (no subshell named) ends its cell


@needs_linux_processes
@pytest.mark.timeout(600)  # a hang guard (155 s with two test runs at once); its waits scale with the load
def test_the_kernel_usage_panel_shows_the_sandbox(tmp_path: Path) -> None:
    """jupyter-resource-usage's Kernel Usage panel asks the kernel (`usage_request`): it shows the memory a
    command holds in the bubblewrap box, against the box's memory limit as the total."""
    from playwright.sync_api import expect

    from owsandbox.host.isolation.resources import Limits

    from .conftest import DEFAULT_KERNEL_NAME

    hold = ("python3 -c \"import sys; b = b'x' * (200 << 20); print('held', flush=True); sys.stdin.read()\" "
            "< <(sleep 120) > held.txt & until [ -s held.txt ]; do sleep 0.05; done; cat held.txt")
    with lab_in_chromium(tmp_path, "kernel-usage.png") as (lab, page):
        notebook = notebook_for_test_kernel(lab.root, "usage.ipynb", {"cells": [code_cell(hold)], "metadata": {},
                                                                      "nbformat": 4, "nbformat_minor": 5},
                                            kernel_name=DEFAULT_KERNEL_NAME)
        lab.open(page, "usage.ipynb")
        run_all_cells(page, 1, notebook["metadata"]["kernelspec"]["display_name"])
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="kernelusage-panel-id"]').click()
        panel = page.locator("#kernelusage-panel-id")
        memory = re.compile(r"Memory:\s*(2\d\d|[3-9]\d\d)(\.\d+)?\s*MB")  # at least the 200 MB held
        expect(panel).to_contain_text(memory, timeout=30_000)
        total = Limits().memory / 1024**3
        expect(panel).to_contain_text(f"Total: {total:.2f} GB")  # the box's memory limit, not the machine's
        lab.remember_processes()
