"""`%preview` in JupyterLab, in Chromium: the box's page runs in the notebook's frame, but not in JupyterLab's origin.

A notebook on the default kernel (bubblewrap) starts `python3 -m http.server` in the box, serving a page
whose script tries to read what JupyterLab has: the parent page's DOM (`parent.document`), the cookies
(`document.cookie`, where the server's login cookie is), local storage, and its own origin. It writes what it
saw into its own page and sends it to the box's own server (`report?...`, a relative URL: the request
shows in the server's access log, which the test reads from the workspace). `%preview` shows it in a frame.
The test reads the frame's page (Playwright reaches into the frame) and the access log: everything must
have been refused, the origin opaque (`null`); and JupyterLab's own page must still be whole.
"""

from __future__ import annotations

import json
import random
import re
import urllib.parse
from pathlib import Path

import pytest

from .conftest import DEFAULT_KERNEL_NAME, require_bwrap
from .lab_browser import code_cell, lab_in_chromium, needs_linux_processes, notebook_for_test_kernel
from .waiting import patience, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.system]

PROBE = """<!doctype html><html><head><title>probe</title></head><body><p id="seen">running</p>
<img id="pixel" src="pixel.svg" alt="">
<script>
const seen = {};
try { seen.parent = "read:" + parent.document.title; } catch (e) { seen.parent = "blocked:" + e.name; }
try { seen.parent_cookie = "read:" + parent.document.cookie; } catch (e) { seen.parent_cookie = "blocked:" + e.name; }
try { seen.cookie = "read:" + document.cookie; } catch (e) { seen.cookie = "blocked:" + e.name; }
try { seen.storage = "read:" + localStorage.length; } catch (e) { seen.storage = "blocked:" + e.name; }
try { seen.top_location = "read:" + top.location.href; } catch (e) { seen.top_location = "blocked:" + e.name; }
seen.origin = String(self.origin);
document.getElementById("seen").textContent = JSON.stringify(seen);
new Image().src = "report?" + new URLSearchParams(seen);
fetch("pixel.svg").then(r => r.text()).then(t => { document.body.dataset.fetched = "ok:" + t.length; },
                                            e => { document.body.dataset.fetched = "failed:" + e; });
</script></body></html>
"""
PIXEL = '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>'


@needs_linux_processes
@pytest.mark.timeout(480)
def test_a_previewed_page_cannot_read_jupyterlabs_dom_or_cookies(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    require_bwrap()
    from . import lab_browser

    # JupyterLab and a bubblewrap kernel on a busy machine (2 CPUs shared) start slowly: more time for both.
    monkeypatch.setattr(lab_browser, "SERVER_START_SECONDS", 240)
    from playwright.sync_api import expect

    port = random.randrange(20000, 30000)
    with lab_in_chromium(tmp_path, "jupyterlab-preview.png") as (lab, page):
        site = lab.root / "site"
        site.mkdir()
        (site / "probe.html").write_text(PROBE)
        (site / "pixel.svg").write_text(PIXEL)
        start = (f"nohup python3 -m http.server {port} --bind 127.0.0.1 --directory site 2>access.log >/dev/null &\n"
                 f"for i in $(seq 1200); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.05; done")
        notebook = notebook_for_test_kernel(lab.root, "preview.ipynb", {
            "cells": [code_cell(start), code_cell(f"%preview {port} probe.html")],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, kernel_name=DEFAULT_KERNEL_NAME)
        page.set_default_timeout(120_000)
        page.set_default_navigation_timeout(120_000)
        lab.open(page, "preview.ipynb")
        display_name = notebook["metadata"]["kernelspec"]["display_name"]
        expect(page.locator("#jp-main-statusbar").get_by_text(f"{display_name} | Idle")).to_be_visible(timeout=60_000)
        cells = page.locator(".jp-NotebookPanel .jp-Notebook .jp-CodeCell")
        for index in range(2):
            cells.nth(index).locator(".jp-InputPrompt").click()
            page.keyboard.press("Shift+Enter")
            expect(cells.nth(index).locator(".jp-InputPrompt")).to_have_text(f"[{index + 1}]:")
        title_before = page.title()
        frame_element = cells.nth(1).locator("iframe")
        expect(frame_element).to_have_attribute("sandbox", "allow-scripts allow-forms allow-popups")
        entry = f"/owsandbox/preview/{_kernel_id(page)}/{port}/probe.html"
        expect(cells.nth(1).locator("a")).to_have_attribute("href", entry)
        expect(frame_element).to_have_attribute("src", entry)  # the entry: the server's login sends it on
        frame = frame_element.content_frame
        seen_text = frame.locator("#seen")
        expect(seen_text).not_to_have_text("running", timeout=30_000)
        seen = json.loads(seen_text.inner_text())
        print("what the box's page saw:", seen)
        assert seen["origin"] == "null", seen
        for what in ("parent", "parent_cookie", "cookie", "storage", "top_location"):
            assert seen[what].startswith("blocked:"), (what, seen)
        # The page's own requests (an image, fetch()) reach its server: the capability path lets them through.
        # The image loads on its own: the probe's script may have run first (under load it did).
        expect(frame.locator("#pixel")).to_have_js_property("complete", True, timeout=60_000)
        assert frame.locator("#pixel").evaluate("img => img.naturalWidth") == 4  # loaded, not broken
        expect(frame.locator("body")).to_have_attribute("data-fetched", f"ok:{len(PIXEL)}")
        log = lab.root / "access.log"

        def reported() -> list[str]:
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            return [line for line in lines if "GET /report?" in line]

        print("the box server's log:", log.read_text(errors="replace") if log.exists() else "(none)")
        wait_until(reported, patience(30), "the page's report to reach the box's own server")
        query = urllib.parse.parse_qs(re.search(r"GET /report\?(\S+)", reported()[0]).group(1))
        assert all(value[0].startswith("blocked:") for key, value in query.items() if key != "origin"), query
        assert lab.token not in log.read_text() and "Cookie" not in log.read_text()
        assert page.title() == title_before  # JupyterLab's page untouched


def _kernel_id(page: object) -> str:
    """The notebook's kernel id, as JupyterLab's session API names it (the page is logged in)."""
    sessions = page.evaluate("""async () => (await (await fetch('/api/sessions')).json())""")  # type: ignore[attr-defined]
    assert len(sessions) == 1, sessions
    return sessions[0]["kernel"]["id"]
