"""Output made in the sandbox cannot run script in the notebook's page: the attack, in a real JupyterLab in Chromium.

A cell writes files as an attacker in the sandbox would: an HTML page whose `<script>` and
`<img onerror>` set `window.__owned` and PUT `pwned.txt` into the server's root folder through the
Jupyter REST API with the page's own credentials (what any script in the page could do, with the
user's rights on the server), a Markdown file with the same as raw HTML and `javascript:` links, an
SVG with a `<script>` and `onload`, and a JavaScript file. Then `owdisplay` and `%read` show them,
`owdisplay --mime application/javascript` is tried, and a display request for
application/javascript is printed by hand, as any program in the box can print it. Last, every
HTML and Markdown attack of test_untrusted_output.py is shown, each rendered by JupyterLab itself
(its own Markdown parser, not the one the unit tests use).

Then: `window.__owned` stays unset and no alert is raised; `pwned.txt` never appears,
though the very same request made from the page by the test does (`canary.txt`: the attack's
request would have worked had it run); no element of the outputs has an `on*` attribute and no
link is `javascript:`; and what is harmless still shows: the HTML's table inside its sandboxed
frame, the Markdown's code block with `<img ...>` as text, the SVG as an image, and the refusals
naming the type. Last, every SVG attack, as the kernel sends it, is put inline in a page (as the
classic Notebook shows SVG) and provoked: nothing runs, nothing loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from owsandbox.kernel.display.svg import sanitised

from ..lab_browser import (
    CHROMIUM_ARGS,
    HTML,
    MARKDOWN,
    NOTE,
    STDERR,
    SVG,
    chromium_or_skip,
    code_cell,
    lab_in_chromium,
    needs_linux_processes,
    notebook_for_test_kernel,
    run_all_cells,
)
from ..waiting import wait_until
from .test_svg import ATTACKS as SVG_ATTACKS
from .test_untrusted_output import HTML_ATTACKS, MARKDOWN_ATTACKS

pytestmark = [pytest.mark.slow, pytest.mark.system]


def put_file(name: str) -> str:
    """A JavaScript expression that PUTs `name` into the server's root folder as the page's user (its
    token or its XSRF cookie); its value is the request's promise."""
    return ("(function(){var c=JSON.parse(document.getElementById('jupyter-config-data').textContent);"
            "var x=(document.cookie.match(/_xsrf=([^;]+)/)||[])[1]||'';"
            f"return fetch(c.baseUrl+'api/contents/{name}',{{method:'PUT',credentials:'same-origin',"
            "headers:{'Authorization':'token '+(c.token||''),'X-XSRFToken':x,'Content-Type':'application/json'},"
            "body:JSON.stringify({type:'file',format:'text',content:'owned'})})})()")


ATTACK = "window.__owned=(window.__owned||0)+1;" + put_file("pwned.txt")
ATTACK_HTML = f"""<!DOCTYPE html>
<h1>Quarterly report</h1>
<table id="report" style="border:1px solid teal"><tr><th>name</th><th>value</th></tr>
<tr><td>alpha</td><td>1</td></tr><tr><td>beta</td><td>2</td></tr></table>
<script>{ATTACK}</script>
<img src="x" onerror="{ATTACK}">
<svg onload="{ATTACK}"></svg>
"""
ATTACK_MARKDOWN = f"""# Notes from the box

<img src=x onerror="{ATTACK}">

<script>{ATTACK}</script>

A [link](javascript:window.__owned=1), [another](&#106;avascript:window.__owned=1) and [a third][ref].

https://example.com/`<img src=x onerror="{ATTACK}">`

```html
<img src=x onerror="{ATTACK}">
```

[ref]: javascript:window.__owned=1
"""
ATTACK_SVG = (f'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="40" onload="{ATTACK}">'
              f'<script>{ATTACK}</script><rect width="120" height="40" fill="teal"/></svg>\n')
HAND_MADE_REQUEST = "printf '\\037\\035OWD:application/javascript\\t\\t%s\\n' \"$PWD/attack.js\""


def write_files() -> str:
    return "".join(f"cat > {name} <<'EOF'\n{text.rstrip()}\nEOF\n" for name, text in (
        ("attack.html", ATTACK_HTML), ("attack.md", ATTACK_MARKDOWN), ("attack.svg", ATTACK_SVG),
        ("attack.js", ATTACK))) + "echo written"


CELLS = [
    write_files(),
    "owdisplay attack.html",
    "%read attack.html",
    "owdisplay attack.md",
    "owdisplay attack.svg",
    'owdisplay attack.js --mime application/javascript || echo "refused: $?"',
    HAND_MADE_REQUEST,
    'for f in corpus/*; do owdisplay "$f"; done',
]


@needs_linux_processes
@pytest.mark.timeout(600)  # a hang guard (155 s with two test runs at once); its waits scale with the load
def test_box_output_runs_no_script_in_jupyterlab(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with lab_in_chromium(tmp_path, "xss.png") as (lab, page):
        notebook = notebook_for_test_kernel(lab.root, "xss.ipynb", {
            "cells": [code_cell(source) for source in CELLS], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
        corpus = lab.root / "corpus"  # every attack of the unit tests, each rendered by JupyterLab itself
        corpus.mkdir()
        for number, source in enumerate(MARKDOWN_ATTACKS):
            (corpus / f"{number:03}.md").write_text(source)
        for number, document in enumerate(HTML_ATTACKS):
            (corpus / f"{number:03}.html").write_text(document)
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        lab.open(page, "xss.ipynb")
        run_all_cells(page, len(CELLS), notebook["metadata"]["kernelspec"]["display_name"])
        cells = page.locator(".jp-NotebookPanel .jp-Notebook .jp-CodeCell")
        outputs = page.locator(".jp-NotebookPanel .jp-OutputArea")

        # What is harmless still shows: the table, in a frame that may run no script, from owdisplay and %read.
        for index in (1, 2):
            frame = cells.nth(index).locator(f"{HTML} iframe")
            expect(frame).to_have_count(1)
            expect(frame).to_have_attribute("sandbox", "")
            rows = cells.nth(index).frame_locator("iframe").locator("table#report tr")
            expect(rows).to_have_count(3)
            expect(rows.nth(1).locator("td").first).to_have_text("alpha")
        # Markdown: raw HTML shown as text, the code block's text kept, no javascript: link.
        markdown = cells.nth(3).locator(MARKDOWN)
        expect(markdown.locator("h1")).to_contain_text("Notes from the box")
        expect(markdown.locator("pre code")).to_contain_text('<img src=x onerror="window.__owned')
        expect(markdown.locator("p").filter(has_text="<script>")).to_have_count(1)
        # SVG: an image, which runs no script.
        expect(cells.nth(4).locator(f"{SVG} img")).to_have_attribute("src", _starts("data:image/svg+xml"))
        # --mime application/javascript: refused in the box, and a hand-made request refused by the kernel.
        expect(cells.nth(5).locator(STDERR)).to_contain_text("application/javascript")
        expect(cells.nth(5).locator(STDERR)).to_contain_text("image/png")
        expect(cells.nth(6).locator(NOTE)).to_contain_text("application/javascript")  # the kernel's refusal
        expect(outputs.locator('[data-mime-type="application/javascript"]')).to_have_count(0)
        shown = cells.nth(7).locator(f"{HTML}, {MARKDOWN}")
        expect(shown).to_have_count(len(MARKDOWN_ATTACKS) + len(HTML_ATTACKS))
        expect(cells.nth(7).locator(f"{HTML} iframe[sandbox='']")).to_have_count(len(HTML_ATTACKS))

        # Nothing ran: no flag, no handler attributes in the page, no javascript: link.
        assert page.evaluate("window.__owned") is None
        assert not dialogs, dialogs
        assert outputs.locator("[onerror], [onload], script").count() == 0
        protocols = outputs.locator("a").evaluate_all("links => links.map(a => a.protocol)")
        assert "javascript:" not in protocols, protocols

        # The attack's request would have worked: the same request from the page makes canary.txt.
        assert page.evaluate(f"async () => (await {put_file('canary.txt')}).status") == 201
        wait_until((lab.root / "canary.txt").exists, 10, "the canary PUT to make its file", interval=0.05)
        assert not (lab.root / "pwned.txt").exists(), "a script from the sandbox wrote pwned.txt"
        lab.remember_processes()


# Fire every event a handler could wait for at every element of the SVGs, then click each link as a user would.
PROVOKE = """() => {
  for (const element of document.querySelectorAll('svg, svg *')) {
    for (const type of ['load', 'click', 'mouseover', 'mouseenter', 'mousedown', 'focus', 'activate', 'begin']) {
      element.dispatchEvent(new MouseEvent(type, {bubbles: true, cancelable: true, view: window}));
    }
  }
}"""


def _svg_page_in_chromium(svgs: list[str]) -> tuple[int, list[str], list[str]]:
    """The SVGs inline in one page (as the classic Notebook shows image/svg+xml), provoked: how often the
    attack's code ran, the dialogs raised, and the requests made (all aborted)."""
    chromium = chromium_or_skip()
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            requests: list[str] = []
            dialogs: list[str] = []
            page.route("**/*", lambda route: (requests.append(route.request.url), route.abort()))
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.set_content("<!DOCTYPE html><html><body>" + "".join(f"<div>{svg}</div>" for svg in svgs)
                             + "</body></html>")
            page.evaluate(PROVOKE)
            for link in page.locator("svg a").all():
                try:
                    link.click(force=True, no_wait_after=True, timeout=2000)
                except PlaywrightError:  # nothing of it is drawn where a user could click
                    pass
            page.wait_for_timeout(500)  # let the animations that begin at once (0.1 s long) run to their end
            page.evaluate(PROVOKE)
            return int(page.evaluate("window.__owned || 0")), dialogs, requests
        finally:
            browser.close()


@pytest.mark.timeout(120)
def test_sanitised_svg_inline_in_a_page_runs_no_script_and_loads_nothing() -> None:
    """The classic Notebook and other front ends put image/svg+xml into the page as markup. Every SVG
    attack of test_svg.py, as the kernel sends it, inline in one Chromium page with its events fired and
    its links clicked: nothing runs and nothing is fetched. The same page with the attacks as the box
    wrote them runs them, so the page would have shown an attack that worked."""
    owned, dialogs, requests = _svg_page_in_chromium([sanitised(svg) for svg in SVG_ATTACKS.values()])
    assert (owned, dialogs, requests) == (0, [], [])
    owned, _, requests = _svg_page_in_chromium(list(SVG_ATTACKS.values()))
    assert owned > 0 and any("evil.example" in url for url in requests), (owned, requests)


def _starts(prefix: str):
    import re

    return re.compile("^" + re.escape(prefix))


__all__ = ["ATTACK", "json"]
