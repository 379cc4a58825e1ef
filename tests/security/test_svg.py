"""SVG from the box is made inert before it is sent: each case is a known SVG attack.

The classic Notebook, nbclassic and other front ends put an SVG display's markup into the page, so
whatever could run or load in it is an attack on the user's Jupyter session. Each attack below goes
through `owsandbox.kernel.svg` and what comes out is read twice, as XML and as the HTML parser of a
page that inlines it reads it: no script, no event handler, no foreign object, no link or reference
out of the document, nothing of the attack's code left. A harmless drawing comes out as it went in,
and an SVG that cannot be made safe is refused, never passed through.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from owsandbox.kernel.display import svg as svg_module
from owsandbox.kernel.display.svg import RefusedSvg, sanitised

from ..kernel_session import KernelSession
from .test_untrusted_output import inspect

PAYLOAD = "window.__owned=(window.__owned||0)+1"
OPEN = '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="60" height="20">'
ATTACKS = {
    "script": f"{OPEN}<script>{PAYLOAD}</script></svg>",
    "script-cdata": f"{OPEN}<script type='text/javascript'><![CDATA[{PAYLOAD}]]></script></svg>",
    "script-in-another-namespace": (f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:h="http://www.w3.org/1999/xhtml">'
                                    f"<h:script>{PAYLOAD}</h:script></svg>"),
    "onload-on-svg": f'<svg xmlns="http://www.w3.org/2000/svg" onload="{PAYLOAD}"><rect width="5" height="5"/></svg>',
    "onclick-inside": f'{OPEN}<g><rect width="60" height="20" onclick="{PAYLOAD}" OnMouseOver="{PAYLOAD}"/></g></svg>',
    "nested-svg-onload": f'{OPEN}<svg onload="{PAYLOAD}"/></svg>',
    "foreign-object": (f'{OPEN}<foreignObject width="60" height="20"><body xmlns="http://www.w3.org/1999/xhtml">'
                       f'<script>{PAYLOAD}</script><img src="x" onerror="{PAYLOAD}"/></body></foreignObject></svg>'),
    "iframe": f'{OPEN}<iframe xmlns="http://www.w3.org/1999/xhtml" src="javascript:{PAYLOAD}"/></svg>',
    "handler": f'{OPEN}<handler type="application/ecmascript" ev:event="load" '
               f'xmlns:ev="http://www.w3.org/2001/xml-events">{PAYLOAD}</handler></svg>',
    "a-javascript": f'{OPEN}<a href="javascript:{PAYLOAD}"><text y="15">click</text></a></svg>',
    "a-xlink-mixed-case": f'{OPEN}<a xlink:href="JaVaScRiPt:{PAYLOAD}"><text y="15">click</text></a></svg>',
    "a-xlink-entities": f'{OPEN}<a xlink:href="&#x20;&#106;ava&#x09;script&#x3A;{PAYLOAD}"><text>x</text></a></svg>',
    "a-xlink-whitespace": f'{OPEN}<a xlink:href="\n\tjavascript:{PAYLOAD}"><text>x</text></a></svg>',
    "a-data-html": f'{OPEN}<a href="data:text/html,&lt;script&gt;{PAYLOAD}&lt;/script&gt;"><text>x</text></a></svg>',
    "a-xml-base": f'{OPEN}<a xml:base="javascript:{PAYLOAD}//" href="#x"><text>x</text></a></svg>',
    "use-external": (f'{OPEN}<use href="http://evil.example/sprite.svg#x"/>'
                     '<use xlink:href="//evil.example/s.svg#y"/></svg>'),
    "use-data-svg": (f'{OPEN}<use href="data:image/svg+xml;base64,PHN2ZyBpZD0neCcgeG1sbnM9J2h0dHA6Ly93d3cudzMub3JnLz'
                     'IwMDAvc3ZnJz48c2NyaXB0PmFsZXJ0KDEpPC9zY3JpcHQ+PC9zdmc+#x"/></svg>'),
    "image-external": f'{OPEN}<image href="http://evil.example/track.png" width="5" height="5"/></svg>',
    "image-svg-data": f'{OPEN}<image href="data:image/svg+xml,&lt;svg onload=\'{PAYLOAD}\'/&gt;"/></svg>',
    "feimage-external": f'{OPEN}<filter id="f"><feImage xlink:href="https://evil.example/x.png"/></filter></svg>',
    "animate-href": (f'{OPEN}<a href="#ok"><animate attributeName="href" to="javascript:{PAYLOAD}" begin="0s" '
                     'fill="freeze"/><text y="15">click</text></a></svg>'),
    "animate-xlink-href-values": (f'{OPEN}<a xlink:href="#ok"><animate attributeName="xlink:href" '
                                  f'values="#ok;javascript:{PAYLOAD}" dur="0.1s" fill="freeze"/>'
                                  '<text>x</text></a></svg>'),
    "animate-href-spaced-uppercase": f'{OPEN}<a><animate attributeName=" HREF " to="javascript:{PAYLOAD}"/></a></svg>',
    "set-onmouseover": (f'{OPEN}<rect width="9" height="9"><set attributeName="onmouseover" to="{PAYLOAD}"/>'
                        '</rect></svg>'),
    "set-onload": f'{OPEN}<set attributeName="onload" to="{PAYLOAD}" begin="0s"/></svg>',
    "set-style-url": (f'{OPEN}<rect width="9" height="9"><set attributeName="style" '
                      'to="fill:url(http://evil.example/x#p)"/></rect></svg>'),
    "style-attribute-url": (f'{OPEN}<rect width="9" height="9" '
                            'style="fill: url( \'http://evil.example/p.svg#p\' )"/></svg>'),
    "style-attribute-escape": f'{OPEN}<rect width="9" height="9" style="fill:u\\72l(http://evil.example/#p)"/></svg>',
    "presentation-url": (f'{OPEN}<rect width="9" height="9" fill="URL(http://evil.example/#p)" '
                         'filter="url(//e.x/#f)"/></svg>'),
    "style-import": f"{OPEN}<style>@import url(http://evil.example/x.css); rect {{ fill: teal }}</style></svg>",
    "style-url": f"{OPEN}<style>rect {{ background: url(http://evil.example/track.png) }}</style></svg>",
    "style-comment-string": (f'{OPEN}<style>a {{ content: "/*" }} rect {{ fill: url(http://evil.example/#p) }} '
                             '/* "*/</style></svg>'),
    "style-breaks-out": f"{OPEN}<style>&lt;/style&gt;&lt;img src=x onerror={PAYLOAD}&gt;</style></svg>",
    "style-image-set": f'{OPEN}<style>rect {{ background: image-set("http://evil.example/a.png" 1x) }}</style></svg>',
    "text-breaks-out": f"{OPEN}<text>&lt;/svg&gt;&lt;img src=x onerror={PAYLOAD}&gt;</text></svg>",
    "stylesheet-instruction": f'<?xml-stylesheet href="http://evil.example/x.css"?>{OPEN}<rect width="1"/></svg>',
}
REFUSED = {
    "billion-laughs": ('<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;'
                       '&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;'
                       '&c;&c;">]><svg xmlns="http://www.w3.org/2000/svg"><text>&d;</text></svg>'),
    "external-entity": ('<!DOCTYPE svg [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
                        '<svg xmlns="http://www.w3.org/2000/svg"><text>&x;</text></svg>'),
    "undefined-entity": '<svg xmlns="http://www.w3.org/2000/svg"><text>&nbsp;&x;</text></svg>',
    "external-dtd-entity": ('<!DOCTYPE svg SYSTEM "http://evil.example/x.dtd">'
                            '<svg xmlns="http://www.w3.org/2000/svg"><text>&x;</text></svg>'),
    "not-well-formed": '<svg xmlns="http://www.w3.org/2000/svg"><rect></svg>',
    "html-root": f"<html><body><script>{PAYLOAD}</script></body></html>",
    "other-namespace-root": '<svg xmlns="http://evil.example/ns"><rect/></svg>',
    "empty": "",
}
HARMLESS = """<?xml version="1.0" encoding="utf-8" standalone="no"?>
<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">
<!-- made by a plotting library -->
<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"
     width="200" height="100" viewBox="0 0 200 100" version="1.1">
 <title>A chart</title><desc>Two bars &amp; a label</desc>
 <defs>
  <style type="text/css">*{stroke-linejoin: round} .bar > rect { fill: url(#grad) }</style>
  <linearGradient id="grad" x1="0" y1="0" x2="1" y2="1">
   <stop offset="0" stop-color="teal"/><stop offset="1" stop-color="#fff"/>
  </linearGradient>
  <path id="tick" d="M 0 0 L 0 3.5" style="stroke: #000000; stroke-width: 0.8"/>
  <clipPath id="clip"><rect x="0" y="0" width="200" height="100"/></clipPath>
  <marker id="arrow" markerWidth="4" markerHeight="4" refX="2" refY="2"><circle cx="2" cy="2" r="2"/></marker>
 </defs>
 <g class="bar" clip-path="url(#clip)">
  <rect x="10" y="20" width="30" height="70" fill="url(#grad)"/>
  <rect x="50" y="40" width="30" height="50" fill="url('#grad')"/>
  <use xlink:href="#tick" x="25" y="90"/><use href="#tick" x="65" y="90"/>
  <polyline points="0,0 10,10 20,0" fill="none" stroke="red" marker-end="url(#arrow)"/>
 </g>
 <text x="100" y="50" font-family="DejaVu Sans" xml:space="preserve">sales <tspan font-weight="bold">2024</tspan></text>
 <image width="4" height="4"
  href="data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="/>
 <circle cx="180" cy="20" r="5"><animate attributeName="r" values="5;8;5" dur="2s" repeatCount="indefinite"/></circle>
</svg>
"""
SVG_TAG = re.compile(r"\{[^}]*\}")


def shown(svg: str) -> str:
    """`svg` sanitised, checked as XML and as a page's HTML parser reads it: nothing that runs or loads."""
    out = sanitised(svg)
    for element in ET.fromstring(out).iter():
        namespace, _, local = element.tag[1:].partition("}")
        assert namespace == svg_module.SVG_NS and local in svg_module.DRAWING, element.tag
        for name, value in element.attrib.items():
            attribute = SVG_TAG.sub("", name)
            assert not attribute.lower().startswith("on"), (local, name)
            if attribute == "href":
                assert value.startswith("#") or value.startswith("data:image/png"), (local, name, value)
            assert "url(" not in value.lower().replace(" ", "") or re.fullmatch(r".*url\(['\"]?#.*", value), value
        if local in svg_module.ANIMATION:
            assert "href" not in element.get("attributeName", "").lower()
            assert not element.get("attributeName", "").strip().lower().startswith("on")
    page = inspect(out)  # as the classic Notebook puts it into the page
    findings = [found for found in page.findings if not found.startswith("<image href='data:image/png")]
    assert not findings, findings
    assert {tag for tag, _ in page.tags} <= {name.lower() for name in svg_module.DRAWING}, page.tags
    root = ET.fromstring(out)
    markup = " ".join([*(value for element in root.iter() for value in element.attrib.values()),
                       *(element.text or "" for element in root.iter(f"{{{svg_module.SVG_NS}}}style"))]).lower()
    assert "javascript" not in markup and "__owned" not in markup and "evil.example" not in markup, markup
    return out


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_svg_attack_comes_out_inert(name: str) -> None:
    out = shown(ATTACKS[name])
    assert out.startswith('<svg xmlns="http://www.w3.org/2000/svg"')


@pytest.mark.unit
def test_text_that_looks_like_markup_stays_text() -> None:
    out = shown(ATTACKS["text-breaks-out"])
    assert ET.fromstring(out).find(f"{{{svg_module.SVG_NS}}}text").text == f"</svg><img src=x onerror={PAYLOAD}>"
    assert "<img" not in out


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_svg_that_cannot_be_made_safe_is_refused_saying_why(name: str) -> None:
    with pytest.raises(RefusedSvg) as refused:
        sanitised(REFUSED[name])
    assert re.match(r"its? ", str(refused.value)), refused.value


@pytest.mark.unit
def test_a_harmless_drawing_comes_out_as_it_went_in() -> None:
    out = shown(HARMLESS)

    def parts(document: str) -> list[tuple[str, dict[str, str], str, str]]:
        return [(element.tag, dict(element.attrib), (element.text or "").strip(), (element.tail or "").strip())
                for element in ET.fromstring(document.split("-->", 1)[-1].strip()).iter()]

    assert parts(out) == parts(HARMLESS)
    assert "stroke-linejoin: round" in out and ".bar &gt; rect" in out  # the style element is kept


@pytest.mark.unit
def test_nesting_deeper_than_python_recursion_is_no_problem() -> None:
    deep = '<svg xmlns="http://www.w3.org/2000/svg">' + "<g>" * 5000 + "<rect/>" + "</g>" * 5000 + "</svg>"
    assert sanitised(deep).count("<g>") == 5000


# -- through a real kernel ------------------------------------------------------------------------

def test_owdisplay_and_read_send_the_sanitised_svg_and_refuse_a_bomb(module_kernel: KernelSession,
                                                                      module_workspace) -> None:
    attack = ATTACKS["onload-on-svg"].replace("<rect", f"<script>{PAYLOAD}</script><rect")
    (module_workspace / "attack.svg").write_text(attack)
    (module_workspace / "bomb.svg").write_text(REFUSED["billion-laughs"])
    for cell in ("owdisplay attack.svg", "%read attack.svg"):
        run = module_kernel.run(cell)
        [display] = run.of_type("display_data")
        assert display["data"]["image/svg+xml"] == ('<svg xmlns="http://www.w3.org/2000/svg"><rect width="5" '
                                                    'height="5"/></svg>')
    noted = module_kernel.run("owdisplay bomb.svg")
    assert not noted.of_type("display_data") and "bomb.svg is not shown as SVG: it declares" in noted.notes()
    refused = module_kernel.run("%read bomb.svg")
    assert refused.error["ename"] == "UsageError" and "--text shows its text" in refused.error["evalue"]
