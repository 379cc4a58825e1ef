"""SVG from the box, made inert before it is sent: what is left draws and does nothing else.

Why: JupyterLab shows image/svg+xml as an <img>, where no script of it runs, but the classic
Notebook, nbclassic and other front ends put the SVG's markup into the page itself, where its
`<script>`, its `onload`, a `javascript:` link, a `<foreignObject>` full of HTML and an
`<animate>` that writes `href` all run with the user's rights on the Jupyter server. External
references (`<use href="http://...">`, `<image href="http://...">`, `url(http://...)` in a style)
load from anywhere, and an entity declared in the document can expand without end.

So the SVG is parsed as XML with expat (standard library), refusing a document type with a subset
of its own (where entities are declared) and any entity it does not know, and written anew from an
allow-list: SVG elements that draw (shapes, text, gradients, patterns, filters, markers, clips,
masks, `<style>`, animation), with the attributes they had except:

* every `on*` event attribute, and attributes in other namespaces (`xml:base` included);
* `href` and `xlink:href` but a same-document `#fragment`, or a `data:image/png|jpeg|gif|webp` URL
  on `<image>` and `<feImage>`;
* a value or a style with a `url(...)` other than `url(#fragment)`, a CSS escape, `@import` or a
  function that fetches (`image-set(`, `image(`, `cross-fade(`, `element(`, `src(`) or runs
  (`expression(`, `-moz-binding`, `behavior`);
* an `<animate>`/`<set>` (and friends) whose `attributeName` is an `href`, an `on*` or `style`.

Elements outside the list (`script`, `foreignObject`, `iframe`, `handler`, anything unknown or in
another namespace) go with everything inside them; comments and processing instructions go too. An
SVG that does not parse, or whose root is not `<svg>`, is refused (`RefusedSvg` says why), never
passed through. Nothing is recursive: the box chooses how deeply the document nests.
"""

from __future__ import annotations

import html
import re
import xml.parsers.expat as expat
from dataclasses import dataclass, field

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
XML_NS = "http://www.w3.org/XML/1998/namespace"

DRAWING = frozenset("""
    svg g defs desc title symbol use switch view a
    path rect circle ellipse line polyline polygon text tspan textPath image
    linearGradient radialGradient stop pattern clipPath mask marker style
    filter feBlend feColorMatrix feComponentTransfer feComposite feConvolveMatrix feDiffuseLighting
    feDisplacementMap feDistantLight feDropShadow feFlood feFuncA feFuncB feFuncG feFuncR feGaussianBlur
    feImage feMerge feMergeNode feMorphology feOffset fePointLight feSpecularLighting feSpotLight feTile
    feTurbulence
    animate animateMotion animateTransform set mpath
""".split())
ANIMATION = frozenset({"animate", "animateMotion", "animateTransform", "set"})
IMAGES = frozenset({"image", "feImage"})  # the elements whose href may be a data: image
_RASTER = re.compile(r"data:image/(?:png|jpeg|gif|webp)[;,]", re.IGNORECASE)
_URL = re.compile(r"url\s*\(\s*['\"]?", re.IGNORECASE)  # up to where the reference's target starts
_CSS_UNSAFE = ("\\", "@import", "@font-face", "@namespace", "image-set(", "image(", "cross-fade(", "element(",
               "src(", "expression(", "-moz-binding", "behavior")
_SPACE = " \t\n\r\f"


class RefusedSvg(ValueError):
    """An SVG that is not shown: it does not parse, declares entities, or is no SVG at all."""


@dataclass
class _Element:
    name: str  # the local name
    attributes: dict[str, str]  # (prefix:)name as written back → value
    children: list[_Element | str] = field(default_factory=list)


def sanitised(svg: str) -> str:
    """`svg` written anew with only what draws (see the module); RefusedSvg when it cannot be."""
    root = _parse(svg)
    return _serialise(root)


# -- reading --------------------------------------------------------------------------------------

def _parse(svg: str) -> _Element:
    parser = expat.ParserCreate(namespace_separator=" ")
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    stack: list[_Element | None] = []  # None: inside an element that is dropped
    roots: list[_Element] = []

    def refuse(why: str) -> None:
        raise RefusedSvg(why)

    def doctype(_name: str, _system: str | None, _public: str | None, internal_subset: int) -> None:
        if internal_subset:
            refuse("it declares a document type of its own (where entities can expand without end)")

    def start(name: str, attributes: dict[str, str]) -> None:
        namespace, _, local = name.rpartition(" ")
        parent_dropped = bool(stack) and stack[-1] is None
        if parent_dropped or namespace not in ("", SVG_NS) or local not in DRAWING:
            if not stack and not roots:
                where = f" in the namespace {namespace!r}" if namespace not in ("", SVG_NS) else ""
                refuse(f"its root element is <{local}>{where}, not SVG's <svg>")
            stack.append(None)
            return
        if not stack and not roots and local != "svg":
            refuse(f"its root element is <{local}>, not SVG's <svg>")
        element = _element(local, attributes)
        if element is None:
            stack.append(None)
            return
        parent = stack[-1] if stack else None
        if parent is not None:
            parent.children.append(element)
        elif not stack:
            roots.append(element)
        stack.append(element)

    def end(_name: str) -> None:
        stack.pop()

    def text(data: str) -> None:
        if stack and stack[-1] is not None:
            stack[-1].children.append(data)

    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = lambda *_: refuse("it declares an entity")
    parser.SkippedEntityHandler = lambda name, _is_parameter: refuse(f"it refers to an entity it does not define "
                                                                     f"(&{name};)")
    parser.ExternalEntityRefHandler = lambda *_: refuse("it refers to an external entity")
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = text
    try:
        parser.Parse(svg, True)
    except expat.ExpatError as exc:
        raise RefusedSvg(f"it is not well-formed XML ({exc})") from None
    if not roots:
        raise RefusedSvg("it has no <svg> element")
    return roots[0]


def _element(local: str, attributes: dict[str, str]) -> _Element | None:
    """The element with the attributes that stay; None when the element itself goes."""
    kept: dict[str, str] = {}
    for name, value in attributes.items():
        namespace, _, attribute = name.rpartition(" ")
        if namespace == XLINK_NS:
            written = "xlink:" + attribute
        elif namespace == XML_NS and attribute in ("space", "lang"):
            written = "xml:" + attribute
        elif namespace == "":
            written = attribute
        else:
            continue  # other namespaces (xml:base, inkscape:..., ...): nothing that draws needs them
        if attribute.lower().startswith("on"):
            continue
        if attribute == "href":
            safe = _safe_href(value, local)
            if safe is not None:
                kept[written] = safe
            continue
        if local in ANIMATION and attribute == "attributeName" and _animates_the_unsafe(value):
            return None
        if _harmless_css(value):
            kept[written] = value
    return _Element(local, kept)


def _safe_href(value: str, local: str) -> str | None:
    target = value.strip(_SPACE)
    if target.startswith("#") and not any(ord(char) < 0x20 for char in target):
        return target
    if local in IMAGES and _RASTER.match(target):
        return target
    return None


def _animates_the_unsafe(name: str) -> bool:
    """Whether an animation writes an attribute that could run or load something: any href (whatever
    its prefix), an event handler, a style."""
    attribute = name.strip(_SPACE).rpartition(":")[2].lower()
    return attribute == "href" or attribute.startswith("on") or attribute == "style"


def _harmless_css(css: str) -> bool:
    """Whether `css` (a style, or any attribute value, which SVG reads as CSS) can neither fetch nor run
    anything: only `url(#fragment)` references. Read as written, comments and all: a comment cannot
    make a reference a browser would follow out of letters that are not there (it ends a token), and
    text hidden in what looks like a comment, which a browser may read as a string, is read too."""
    lowered = css.lower()
    if any(unsafe in lowered for unsafe in _CSS_UNSAFE):
        return False
    return all(css.startswith("#", found.end()) for found in _URL.finditer(css))


# -- writing --------------------------------------------------------------------------------------

def _serialise(root: _Element) -> str:
    uses_xlink = False
    out: list[str] = []
    work: list[_Element | str | tuple[str]] = [root]  # a tuple: the end tag of an element already opened
    while work:
        item = work.pop()
        if isinstance(item, tuple):
            out.append(f"</{item[0]}>")
            continue
        if isinstance(item, str):
            out.append(html.escape(item, quote=False))
            continue
        children = item.children
        if item.name == "style":
            css = "".join(child for child in children if isinstance(child, str))
            if not _harmless_css(css) or "<" in css:
                continue  # a style that could fetch, or that HTML could read as markup: it goes whole
            children = [css]
        attributes = "".join(f' {name}="{html.escape(value, quote=True)}"' for name, value in item.attributes.items())
        uses_xlink = uses_xlink or any(name.startswith("xlink:") for name in item.attributes)
        if item is root:
            attributes = f' xmlns="{SVG_NS}"' + attributes
        if not children:
            out.append(f"<{item.name}{attributes}/>")
            continue
        out.append(f"<{item.name}{attributes}>")
        work.append((item.name,))
        work.extend(reversed(children))
    if uses_xlink:
        out[0] = out[0].replace(f' xmlns="{SVG_NS}"', f' xmlns="{SVG_NS}" xmlns:xlink="{XLINK_NS}"', 1)
    return "".join(out)
