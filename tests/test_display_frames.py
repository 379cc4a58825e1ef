"""A framed HTML display (owdisplay of a .html file) is as tall as its content in Chromium: no inner scrollbar.

The frame runs no script, so it cannot size itself; the kernel estimates its height from the document
(owsandbox/kernel/display/untrusted.py). Here each kind of document that estimate knows (a pandas
table with borders, a plain table, paragraphs, headings, lists, preformatted lines) is laid out by
Chromium in a frame as the kernel makes it, and its content must fit: the frame is drawn once at a
few pixels' height to measure the content, then the kernel's height is compared with it.
"""

from __future__ import annotations

import re

import pytest

from owsandbox.kernel.display.untrusted import FRAME_MAX_PX, html_frame

from .lab_browser import CHROMIUM_ARGS, chromium_or_skip

pytestmark = [pytest.mark.system]


def _table(rows: int, border: bool) -> str:
    head = '<table border="1" class="dataframe">' if border else "<table>"
    body = "".join(f"<tr><td>{n}</td><td>value {n}</td><td>{n * 3.14:.2f}</td></tr>" for n in range(rows))
    return f"{head}<thead><tr><th></th><th>a</th><th>b</th></tr></thead><tbody>{body}</tbody></table>"


DOCUMENTS = {
    "pandas table": _table(5, True), "long pandas table": _table(20, True), "plain table": _table(10, False),
    "paragraphs": "<p>one</p><p>two</p><p>three</p>", "heading": "<h1>Title</h1><p>text</p>",
    "small headings": "<h3>x</h3><p>y</p><p>z</p>", "report": "<h2>Report</h2><p>Some text</p>" + _table(6, True),
    "list": "<ul>" + "".join(f"<li>item {n}</li>" for n in range(8)) + "</ul>",
    "pre": "<pre>" + "\n".join(f"line {n}" for n in range(12)) + "</pre>", "text": "just text",
}


def test_a_framed_html_display_is_as_tall_as_its_content() -> None:
    from playwright.sync_api import sync_playwright

    chromium = chromium_or_skip()
    short = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 800})
            for name, document in DOCUMENTS.items():
                made = html_frame(document, name)
                height = int(re.search(r"height:(\d+)px", made)[1])
                page.set_content("<body style='margin:0'>" + made.replace(f"height:{height}px", "height:4px")
                                 + "</body>")
                # This document's own frame (page.frames may still list the one set_content just replaced)
                frame = page.wait_for_selector("iframe").content_frame()
                assert frame is not None
                frame.wait_for_load_state()
                content = frame.evaluate("document.documentElement.scrollHeight")
                assert height <= FRAME_MAX_PX
                if content > height or height - content > 48:  # short: a scrollbar; far too tall: blank
                    short[name] = (height, content)
        finally:
            browser.close()
    assert not short, f"(frame height, content height) in px: {short}"
