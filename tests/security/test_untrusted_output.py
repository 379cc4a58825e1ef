"""Rich output from the sandbox is an attack until shown otherwise: each test is the exploit it guards against.

A file in the box (or a display line printed by any program there) reaches the notebook's page as
display_data, where JupyterLab runs the scripts of trusted outputs, and outputs of the running
session are trusted. The unit tests feed owsandbox.kernel.untrusted the attacks (script, onerror,
javascript: links, iframes, objects, raw HTML in Markdown, types that are code) and look at what
a browser would be given: HTML parsed as a browser parses it, Markdown rendered by a CommonMark
renderer that lets raw HTML and every link scheme through (mistune, told to be as unsafe as a
trusted JupyterLab output), so that only this module stands between the file and the page.
The kernel tests do the same through a real kernel: `owdisplay x.html`, `%read x.html`, a
Markdown file, `owdisplay --mime application/javascript`, and a display line printed by hand.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from owsandbox.box.shell.lines import DISPLAY_TYPES
from owsandbox.kernel.display import untrusted

from ..fuzz_budget import examples
from ..kernel_session import KernelSession
from ..steps import lines_run

ALERT = "alert(document.cookie)"
MARKDOWN_TAGS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "em", "strong", "code", "pre", "a", "img", "ul", "ol",
                 "li", "blockquote", "hr", "br", "table", "thead", "tbody", "tr", "th", "td", "del", "s"}
URL_ATTRIBUTES = {"href", "src", "action", "formaction", "data", "xlink:href", "background", "poster", "srcset"}
REFUSED = ["application/javascript", "text/javascript", "application/x-javascript", "application/ecmascript",
           "application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json", "text/latex",
           "text/html; charset=utf-8", "application/vnd.plotly.v1+json", "text/vnd.jupyter.html", "image/svg",
           "application/xhtml+xml", "image/svg+xml ; x=1", "text/x-python", "application/pdf"]


# -- what a browser would be given --------------------------------------------------------------

def scheme_of(url: str) -> str:
    """The scheme a browser finds in `url` (an attribute value, entities already decoded), '' for none."""
    cleaned = re.sub(r"[\x00-\x20\x7f]", "", url)
    found = re.match(r"([A-Za-z][A-Za-z0-9+.\-]*):", cleaned)
    return found.group(1).lower() if found else ""


class Inspector(HTMLParser):
    """Parses HTML as a browser would and lists what could run: scripts, handlers, plugin elements,
    frames that may run script, and URLs with a scheme that is code. `tags`: every element seen."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.findings: list[str] = []
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.texts: dict[str, list[str]] = {}
        self._open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        self.tags.append((tag, values))
        if tag not in ("br", "hr", "img", "meta", "input"):
            self._open.append(tag)
        if tag in ("script", "object", "embed", "applet", "base", "form", "link", "meta", "frame", "frameset"):
            self.findings.append(f"<{tag}>")
        if tag == "iframe":
            if "sandbox" not in values or {"allow-scripts", "allow-same-origin"} & set(values["sandbox"].split()):
                self.findings.append(f"<iframe sandbox={values.get('sandbox')!r}>")
            if "src" in values:
                self.findings.append("<iframe src>")
        for name, value in values.items():
            if name.startswith("on"):
                self.findings.append(f"<{tag} {name}>")
            if name in URL_ATTRIBUTES and scheme_of(value) not in ("", "http", "https", "mailto"):
                if not (tag == "img" and name == "src" and value.startswith("data:image/")):
                    self.findings.append(f"<{tag} {name}={value[:40]!r}>")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if self._open and self._open[-1] == tag:
            self._open.pop()

    def handle_endtag(self, tag: str) -> None:
        if tag in self._open:
            while self._open.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        for tag in self._open:
            self.texts.setdefault(tag, []).append(data)

    def text(self, tag: str) -> str:
        return "".join(self.texts.get(tag, []))


def inspect(markup: str) -> Inspector:
    inspector = Inspector()
    inspector.feed(markup)
    inspector.close()
    return inspector


def render_markdown(source: str) -> str:
    """`source` as HTML by a CommonMark renderer with raw HTML and every link scheme let through."""
    mistune = pytest.importorskip("mistune")

    class Renderer(mistune.HTMLRenderer):  # type: ignore[misc, name-defined]
        def block_code(self, code: str, info: str | None = None) -> str:
            # mistune 3.1 fails on an info string that is all white space once decoded ("```&#9;")
            return super().block_code(code, info if info and info.split() else None)

    renderer = Renderer(escape=False, allow_harmful_protocols=True)
    return mistune.create_markdown(renderer=renderer, plugins=["table", "strikethrough", "url"])(source)


def shown_markdown(source: str) -> Inspector:
    """What the page would get for a Markdown file from the box; fails on anything that could run."""
    return rendered_safely(untrusted.markdown_text(source))


def rendered_safely(markdown: str) -> Inspector:
    """`markdown` rendered; fails on anything that could run."""
    rendered = render_markdown(markdown)
    found = inspect(rendered)
    assert not found.findings, (found.findings, rendered)
    assert {tag for tag, _ in found.tags} <= MARKDOWN_TAGS, rendered  # no element from raw HTML
    return found


def frame_of(markup: str) -> dict[str, str]:
    """The attributes of the one element `markup` is, which must be a frame that may run nothing."""
    found = inspect(markup)
    assert [tag for tag, _ in found.tags] == ["iframe"], markup[:300]
    assert not found.findings, found.findings
    attributes = found.tags[0][1]
    assert attributes["sandbox"] == ""  # no allow-scripts, no allow-same-origin: nothing runs, opaque origin
    assert set(attributes) == {"sandbox", "srcdoc", "style", "title", "referrerpolicy"}
    return attributes


# -- types ----------------------------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("mime", REFUSED)
def test_a_type_that_could_run_code_is_refused_naming_it_and_the_allowed_ones(mime: str) -> None:
    with pytest.raises(untrusted.RefusedType) as refused:
        untrusted.check_type(mime)
    message = str(refused.value)
    assert repr(mime) in message
    for allowed in untrusted.ALLOWED_TYPES:
        assert allowed in message


@pytest.mark.unit
def test_only_types_that_show_as_images_text_or_framed_html_are_allowed() -> None:
    assert set(untrusted.ALLOWED_TYPES) == {"image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp",
                                            "image/svg+xml", "text/html", "text/markdown", "application/json",
                                            "text/plain"}
    assert untrusted.check_type(" Text/HTML ") == "text/html"


@pytest.mark.unit
def test_the_box_refuses_the_same_types_the_kernel_does() -> None:
    assert DISPLAY_TYPES == untrusted.ALLOWED_TYPES


# -- HTML -----------------------------------------------------------------------------------------

HTML_ATTACKS = [
    f"<script>{ALERT}</script>",
    f'<img src="x" onerror="{ALERT}">',
    f"<svg onload='{ALERT}'></svg>",
    f'<a href="javascript:{ALERT}">click</a>',
    f'<iframe src="javascript:{ALERT}"></iframe>',
    f'<iframe srcdoc="<script>{ALERT}</script>"></iframe>',
    f'<object data="data:text/html,<script>{ALERT}</script>"></object>',
    f'<embed src="data:text/html,<script>{ALERT}</script>">',
    f'<meta http-equiv="refresh" content="0;url=javascript:{ALERT}">',
    f'<form action="javascript:{ALERT}"><button>go</button></form>',
    f'<base href="javascript:{ALERT}//">',
    f'"></iframe><script>{ALERT}</script>',  # trying to close the frame's attribute and the frame
    f"&quot;></iframe><img src=x onerror={ALERT}>",
    f"<details open ontoggle='{ALERT}'>",
    f"<style>@import 'javascript:{ALERT}';</style>",
]


@pytest.mark.unit
@pytest.mark.parametrize("document", HTML_ATTACKS)
def test_html_from_the_box_is_shown_in_a_frame_where_no_script_runs(document: str) -> None:
    frame = frame_of(untrusted.html_frame(document, "x.html"))
    assert frame["srcdoc"].endswith(document)  # the document itself, whole, inside
    head = inspect(frame["srcdoc"].removesuffix(document))
    assert [tag for tag, _ in head.tags] == ["meta", "style"]
    policy = head.tags[0][1]
    assert policy["http-equiv"] == "Content-Security-Policy"
    assert "default-src 'none'" in policy["content"] and "script-src" not in policy["content"]


@pytest.mark.unit
def test_a_framed_document_keeps_its_tables_styles_and_data_images() -> None:
    pixel = "data:image/png;base64,iVBORw0KGgo="
    document = (f"<!DOCTYPE html><style>td {{ color: teal }}</style><table style='border:1px solid'><tr><td>a</td>"
                f"</tr></table><img src='{pixel}' height=40>")
    frame = frame_of(untrusted.html_frame(document, "report.html"))
    inner = inspect(frame["srcdoc"])
    assert [tag for tag, _ in inner.tags] == ["meta", "style", "style", "table", "tr", "td", "img"]  # one doctype
    assert frame["srcdoc"].startswith("<!DOCTYPE html>") and frame["srcdoc"].count("<!DOCTYPE") == 1
    assert inner.text("td") == "a" and inner.tags[-1][1]["src"] == pixel
    assert frame["title"] == "report.html"


@pytest.mark.unit
def test_a_frame_is_as_tall_as_its_content_within_bounds() -> None:
    def height(document: str) -> int:
        return int(re.search(r"height:(\d+)px", frame_of(untrusted.html_frame(document, "t"))["style"])[1])

    rows = "".join(f"<tr><td>{n}</td></tr>" for n in range(10))
    assert height("<b>one line</b>") == untrusted.FRAME_MIN_PX
    assert untrusted.FRAME_MIN_PX < height(f"<table>{rows}</table>") < untrusted.FRAME_MAX_PX
    assert height(f"<table>{rows * 100}</table>") == untrusted.FRAME_MAX_PX
    assert height("<img src='data:image/png;base64,AA' height=300>") >= 300


# -- Markdown -------------------------------------------------------------------------------------

MARKDOWN_ATTACKS = [
    f"<img src=x onerror={ALERT}>",
    f"<script>{ALERT}</script>",
    f"text <img src=x onerror={ALERT}> inline",
    f"<div>\n\n<img src=x onerror={ALERT}>\n\n</div>",
    f"<!-- x --><iframe src=javascript:{ALERT}></iframe>",
    f"<object data='data:text/html,<script>{ALERT}</script>'></object>",
    f"\\<img src=x onerror={ALERT}>",
    f"\\\\<img src=x onerror={ALERT}>",
    f"[click](javascript:{ALERT})",
    f"[click](JavaScript:{ALERT} 'title')",
    f"[click]( <javascript:{ALERT}> )",
    f"[click](&#106;avascript:{ALERT})",
    f"[click](&#x6A;&#x61;vascript&colon;{ALERT})",
    f"[click](java&#9;script:{ALERT})",
    f"[click](&#1;javascript:{ALERT})",
    f"[click](javascript\\:{ALERT})",
    f"[click](vbscript:{ALERT})",
    "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    f"![pic](javascript:{ALERT})",
    f"[click][ref]\n\n[ref]: javascript:{ALERT}",
    f"[click][ref]\n\n[ref]:\n  &#106;avascript:{ALERT}",
    f"<javascript:{ALERT}>",
    f"https://example.com/`<img src=x onerror={ALERT}>`",
    f"`code` <img src=x onerror={ALERT}> `more`",
    f"``<img src=x onerror={ALERT}>``",
    f"\\`<img src=x onerror={ALERT}>`",
    f"```\ncode\n```~~\n<img src=x onerror={ALERT}>\n```",
    f"- item\n\n  ```\n<img src=x onerror={ALERT}>\n  ```",
    f"> ```\n> x\n```\n<img src=x onerror={ALERT}>",
    f"para\n    <img src=x onerror={ALERT}>",
    f"| a | b |\n|---|---|\n| <img src=x onerror={ALERT}> | `<b>` |",
    f"[a `b](javascript:{ALERT})` c",
    f"[x](`<img/src=x/onerror={ALERT}>`)",
    f"$<img src=x onerror={ALERT}>$",
    "[ok](https://example.com/a) [mail](mailto:a@example.com) [rel](notes/b.md)",
]


@pytest.mark.unit
@pytest.mark.parametrize("source", MARKDOWN_ATTACKS)
def test_markdown_from_the_box_has_no_raw_html_and_no_script_links(source: str) -> None:
    shown_markdown(source)


@pytest.mark.unit
def test_markdown_raw_html_shows_as_text() -> None:
    found = shown_markdown(f"# Notes\n\nbefore <img src=x onerror={ALERT}> after\n")
    assert found.text("h1") == "Notes"
    assert found.text("p") == f"before <img src=x onerror={ALERT}> after"


CODE = f"<img src=x onerror={ALERT}> & <b>*not* _emphasis_</b> `tick` $x$ \\ [l](javascript:x)"


@pytest.mark.unit
@pytest.mark.parametrize("source", [
    f"```html\n{CODE}\n```",
    f"~~~\n{CODE}\n~~~",
    f"````\n{CODE}\n```\n{CODE}\n````",
    f"  ```\n  {CODE}\n  ```",
    f"text\n\n    {CODE}\n",
    f"```\n{CODE}",  # never closed: code to the end
])
def test_markdown_code_blocks_keep_their_text(source: str) -> None:
    found = shown_markdown(source)
    assert found.text("code").rstrip("\n") == (f"{CODE}\n```\n{CODE}" if "````" in source else CODE)
    if source.startswith("```html"):
        assert ("code", {"class": "language-html"}) in found.tags


@pytest.mark.unit
@pytest.mark.parametrize(("source", "code"), [
    (f"run `{CODE.replace('`', '')}` now", CODE.replace("`", "")),
    ("two ``a ` b`` ticks", "a ` b"),
    ("` <script> `", "<script>"),
    ("a `<b>\nc` d", "<b> c"),
])
def test_markdown_code_spans_keep_their_text(source: str, code: str) -> None:
    found = shown_markdown(source)
    assert found.text("code") == code


@pytest.mark.unit
def test_markdown_keeps_safe_links_and_defuses_the_others() -> None:
    found = shown_markdown("[a](https://example.com/x) [b](mailto:a@example.com) [c](notes.md) [d](#part) "
                           f"[e](javascript:{ALERT}) ![f](plot.png)")
    hrefs = [attributes.get("href") or attributes.get("src") for tag, attributes in found.tags if tag in ("a", "img")]
    assert hrefs == ["https://example.com/x", "mailto:a@example.com", "notes.md", "#part",
                     f"#javascript:{ALERT}", "plot.png"]


@pytest.mark.unit
def test_markdown_text_outside_code_is_left_alone() -> None:
    source = "# Title\n\n* one\n* two\n\n> quoted **bold**\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n1 > 0 & 2 > 1\n"
    assert untrusted.markdown_text(source) == source


FRAGMENTS = ["`", "``", "```", "~~~", "\n", "\n\n", "    ", "\t", " ", "\\", "<", ">", "&", "#", ";", "x",
             f"<img src=x onerror={ALERT}>", f"<script>{ALERT}</script>", "<!--", "-->", "<a href='javascript:x'>",
             "[", "]", "(", ")", "](", "]:", "![", "javascript:", "JaVaScRiPt:", "&#106;", "&#x3a;", "&colon;",
             "&#9;", "data:", "vbscript:", "http://a.b/", "www.a.b/", "> ", "- ", "1. ", "|", "---", "*", "_", "$",
             "<javascript:x>", "'", '"']


@pytest.mark.unit
@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join))
def test_no_markdown_made_of_attack_pieces_renders_anything_that_runs(source: str) -> None:
    shown_markdown(source)


@pytest.mark.unit
def test_a_long_obfuscated_target_is_defused_without_scanning_for_ever() -> None:
    source = "[x](" + "&#9;" * 5000 + f"javascript:{ALERT})"
    assert untrusted.markdown_text(source).startswith("[x](#")
    many = "[x](a) " * 50_000
    assert untrusted.markdown_text(many) == many


@pytest.mark.unit
@pytest.mark.parametrize("piece", ["<img ", "<pre", "\\", "<", "` `` ", "](", "](&", "```\n", "    x\n\n",
                                   "\\" * 50 + "<", "`" * 3 + "x"])
def test_a_file_made_to_be_slow_to_make_safe_is_not(piece: str) -> None:
    """The box chooses the file (up to 16 MiB): every pass is linear, so the kernel is not held up. Counted in
    lines of untrusted.py run, a few per character (the seconds: benchmarks/cores_bench.py)."""
    text = piece * (400_000 // len(piece))
    steps = lines_run(untrusted, untrusted.markdown_text, text)
    steps += lines_run(untrusted, untrusted.html_frame, text, "slow")
    assert steps < 20 * len(text), "quadratic somewhere"


# -- through a real kernel ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def box_folder(module_workspace: Path) -> Path:
    return module_workspace


@pytest.fixture(scope="module")
def kernel(module_kernel):
    return module_kernel


ATTACK_PAGE = (f"<h1>report</h1><table id='t'><tr><td>alpha</td></tr></table><script>{ALERT}</script>"
               f"<img src=x onerror=\"{ALERT}\">")


def displays(run: Any) -> list[dict[str, Any]]:
    return run.of_type("display_data") + run.of_type("update_display_data")


@pytest.mark.parametrize("cell", ["owdisplay attack.html", "%read attack.html", "owdisplay attack.html --id a",
                                  "owdisplay attack.txt --mime text/html", "owdisplay attack.txt --mime TEXT/HTML"])
def test_kernel_shows_box_html_only_in_a_frame_where_no_script_runs(kernel: KernelSession, box_folder: Path,
                                                                    cell: str) -> None:
    (box_folder / "attack.html").write_text(ATTACK_PAGE)
    (box_folder / "attack.txt").write_text(ATTACK_PAGE)
    run = kernel.run(cell)
    assert run.status == "ok", run.outputs
    [shown] = displays(run)
    assert set(shown["data"]) == {"text/html", "text/plain"}
    frame = frame_of(shown["data"]["text/html"])
    assert frame["srcdoc"].endswith(ATTACK_PAGE)
    assert "<script" not in shown["data"]["text/plain"]


@pytest.mark.parametrize("cell", ["owdisplay attack.md", "%read attack.md",
                                  "owdisplay attack.txt --mime text/markdown"])
def test_kernel_shows_box_markdown_without_its_raw_html(kernel: KernelSession, box_folder: Path, cell: str) -> None:
    source = (f"# Notes\n\n<img src=x onerror=\"{ALERT}\">\n\n[link](javascript:{ALERT})\n\n"
              f"```html\n<script>{ALERT}</script>\n```\n")
    (box_folder / "attack.md").write_text(source)
    (box_folder / "attack.txt").write_text(source)
    run = kernel.run(cell)
    assert run.status == "ok", run.outputs
    [shown] = displays(run)
    assert shown["data"]["text/plain"] == source
    found = rendered_safely(shown["data"]["text/markdown"])  # as the kernel sent it
    assert found.text("code").strip() == f"<script>{ALERT}</script>"
    assert f"<img src=x onerror=\"{ALERT}\">" in found.text("p")


@pytest.mark.parametrize("mime", ["application/javascript", "text/javascript",
                                  "application/vnd.jupyter.widget-view+json", "text/latex"])
def test_owdisplay_refuses_a_type_that_could_run_code(kernel: KernelSession, box_folder: Path, mime: str) -> None:
    (box_folder / "attack.js").write_text(ALERT)
    run = kernel.run(f"owdisplay attack.js --mime {mime}")
    assert run.status == "error" and run.error["ename"] == "ExitStatus"
    assert not displays(run)
    message = run.text("stderr")
    assert mime in message and "image/png" in message and "text/markdown" in message


@pytest.mark.parametrize("mime", ["application/javascript", "application/vnd.jupyter.widget-view+json", "text/latex",
                                  "text/html;x=1"])
def test_the_kernel_refuses_such_a_type_even_when_the_box_asks_for_it_by_hand(kernel: KernelSession, box_folder: Path,
                                                                           mime: str) -> None:
    (box_folder / "attack.js").write_text(ALERT)
    run = kernel.run(f"printf '\\037\\035OWD:%s\\t\\t%s\\n' '{mime}' \"$PWD/attack.js\"; echo after")
    assert not displays(run), run.outputs
    assert run.text() == "after\n"
    message = run.notes()
    assert f"owdisplay: type {mime!r} is not shown" in message and "allowed types: image/png" in message


def test_tables_the_kernel_makes_escape_the_names_the_box_chose(kernel: KernelSession, box_folder: Path) -> None:
    name = f"<img src=x onerror={ALERT}>.txt"
    (box_folder / "listing").mkdir(exist_ok=True)
    (box_folder / "listing" / name).write_text("x")
    [shown] = displays(kernel.run("%ls listing"))
    found = inspect(shown["data"]["text/html"])
    assert not found.findings and {tag for tag, _ in found.tags} <= {"div", "table", "thead", "tbody", "tr", "th", "td",
                                                                    "p"}  # the div: kept out of math typesetting
    assert name in found.text("td")


def test_box_svg_is_sent_without_what_could_run_in_a_page_that_inlines_it(kernel: KernelSession,
                                                                        box_folder: Path) -> None:
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" onload="{ALERT}"><script>{ALERT}</script></svg>'
    (box_folder / "attack.svg").write_text(svg)
    for cell in ("owdisplay attack.svg", "%read attack.svg"):  # every SVG attack: test_svg.py
        [shown] = displays(kernel.run(cell))
        assert shown["data"]["image/svg+xml"] == '<svg xmlns="http://www.w3.org/2000/svg"/>'
        assert shown["data"]["text/plain"].startswith("<image/svg+xml: ")
