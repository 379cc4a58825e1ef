"""`%preview PORT [PATH]`: a web app listening on PORT in the sandbox, shown in the notebook.

The Jupyter server that runs this kernel serves the port at `/owsandbox/preview/<kernel id>/<port>/`
(its `owsandbox.preview` extension, with the server's own login), relayed through the sandbox's execd
endpoint (a bubblewrap box's socket here; a container's through its engine's `exec -i`), so the box
needs no network. The magic checks that something listens on the port in the box
(through that same relay), records the port in the sandbox's state folder (the server serves only the
recorded ports, with a new secret for the capability path the server redirects to) and shows a link and
an inline frame. The link is a path from the page's origin (the kernel does not know the server's
address), under the server's base URL (JupyterHub's /user/NAME/), which the server's extension gives the
kernels it starts (OWSANDBOX_PREVIEW_BASE_URL); JupyterLab leaves such a path as it is (tested in
Chromium). The secret is never in the notebook: the link is the entry, which needs the server's login.
The frame is sandboxed without `allow-same-origin`, and the server adds the same sandbox to every
proxied answer, so the box's page never runs in JupyterLab's origin.

`%preview --list` shows the recorded ports; `%preview stop PORT` forgets one and cuts its open proxied
connections (the box's server keeps running: stop it in the box).
"""

from __future__ import annotations

import argparse
import html
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ...preview import headers as H
from ...preview import record
from ...preview.tunnel import TunnelRefused, close_port, probe_port
from ...terminal.locate import _GATEWAY_STEM, sandbox_key
from ..display.math_safe import no_math
from ..errors import CellError, UsageError
from .framework import MagicContext, magic, show_table

# A network of its own, and a state folder here where the server finds how to reach the box (bwrap: the
# host's execd socket; a container: the engine's exec relay, host/providers/container_door.py).
PREVIEW_PROVIDERS = ("bwrap", "container")
_SERVER_KERNEL_ID = re.compile(r"kernel-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
FRAME_HEIGHT = 420


@dataclass
class PreviewBox:
    """What `%preview` needs of the kernel: its connection file, its sandbox's provider and the execd
    endpoint (a callable, as the box may have been restarted)."""

    connection_file: str | None
    provider: Any
    endpoint: Any
    base_url: str  # the base URL of the Jupyter server that started the kernel, if it loaded owsandbox.preview


def kernel_id(connection_file: str | None) -> str:
    """The id the Jupyter server knows this kernel by; CellError when no Jupyter server runs it."""
    if not connection_file:
        raise CellError("NoPreview", "this kernel has no connection file, so no Jupyter server can find its "
                                     "sandbox: %preview needs a kernel started by a Jupyter server (JupyterLab, "
                                     "Notebook)")
    stem = os.path.splitext(os.path.basename(connection_file))[0]
    if _GATEWAY_STEM.fullmatch(stem):
        raise CellError("NoPreview", "this kernel runs under a kernel gateway (Enterprise Gateway): %preview is "
                                     "served by the Jupyter server that runs the kernel, and the notebook's server "
                                     "does not run it. Run the kernel from JupyterLab's own server to preview")
    found = _SERVER_KERNEL_ID.fullmatch(sandbox_key(connection_file))
    if found is None:
        raise CellError("NoPreview", f"this kernel was not started by a Jupyter server (its connection file is "
                                     f"{os.path.basename(connection_file)}, not kernel-<id>.json): %preview is "
                                     "served by the Jupyter server that runs the kernel")
    return found.group(1)


def _state_dir(box: PreviewBox) -> str:
    name = getattr(box.provider, "name", "?")
    if name == "local":
        raise CellError("NoPreview", "the local provider has no network of its own: its ports are this machine's, "
                                     "and %preview serves only a sandbox's own ports. Use the bwrap or container "
                                     "provider")
    if name not in PREVIEW_PROVIDERS:
        raise CellError("NoPreview", f"%preview reaches a bwrap or container sandbox on the machine of the Jupyter "
                                     f"server; this kernel's is {name}, whose execd endpoint the server cannot reach "
                                     "(it is the kernel's own bridge). Not supported yet")
    state_dir = getattr(box.provider, "state_dir", None)
    if not state_dir:
        raise CellError("NoPreview", "this sandbox keeps no state folder for the server to find it by")
    return str(state_dir)


def _base_url(box: PreviewBox) -> str:
    if not box.base_url.startswith("/"):
        raise CellError("NoPreview", "the Jupyter server that started this kernel has not loaded the owsandbox.preview "
                                     "extension, which serves previews (`jupyter server extension list` shows it; "
                                     "`jupyter server extension enable owsandbox.preview`, then restart the server)")
    return box.base_url


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise UsageError(f"%preview: '{text}' is not a port (a whole number 1..65535)")
    return int(text)


def _path(text: str) -> str:
    if any(ch in text for ch in "\r\n\t ") or text.startswith("//") or "://" in text:
        raise UsageError(f"%preview: '{text}' is not a path in the box's server (such as docs/index.html)")
    return quote(text.lstrip("/"), safe="/?=&%#.-_~+:@!$'()*,;")


def _endpoint(box: PreviewBox) -> tuple[str, dict[str, str]]:
    endpoint = box.endpoint()
    if not endpoint.unix_socket:
        raise CellError("NoPreview", "this sandbox's execd endpoint is not a socket on this machine")
    return endpoint.unix_socket, dict(endpoint.headers)


def start(ctx: MagicContext, box: PreviewBox, port: int, path: str) -> None:
    kid = kernel_id(box.connection_file)
    state_dir = _state_dir(box)
    sock_path, headers = _endpoint(box)
    try:
        probe_port(sock_path, headers, port)
    except TunnelRefused as exc:
        raise CellError("NoPreview", f"port {port} in the sandbox: {exc}. Start the server in the box first "
                                     "(a port of this machine is not reachable from here)") from None
    except OSError as exc:
        raise CellError("NoPreview", f"the sandbox's execd endpoint does not answer: {exc}") from None
    base_url = _base_url(box)
    record.add(state_dir, port, path)
    url = f"{H.base_path(base_url, kid, port)}/{path}"
    ctx.display(page(url, port), display_id=f"owsandbox-preview-{port}")


def page(url: str, port: int) -> dict[str, str]:
    """The link and the sandboxed frame (text/html) and the path (text/plain). The URL is a path from the
    page's origin (the kernel does not know the server's address), with the server's base URL (JupyterHub's
    /user/NAME/ included), which the server's extension gave the kernel."""
    text = f"port {port} of the sandbox, served by this notebook's Jupyter server at {url}\n"
    return {"text/plain": text, "text/html": no_math(frame(url, port))}


def frame(url: str, port: int) -> str:
    """A link to `url` (a new tab, itself sandboxed by the server's CSP) and a sandboxed frame: scripts,
    forms and pop-ups run, but in an opaque origin, never JupyterLab's."""
    escaped = html.escape(url, quote=True)
    return (f'<p><a href="{escaped}" target="_blank" rel="noopener noreferrer">Open port {port} of the sandbox '
            f'in a new tab</a> <code>{html.escape(url)}</code></p>'
            f'<iframe src="{escaped}" sandbox="{H.SANDBOX}" referrerpolicy="no-referrer" '
            f'style="width:100%;height:{FRAME_HEIGHT}px;border:1px solid #ccc" title="port {port} of the sandbox">'
            "</iframe>")


def _configure(parser: Any) -> None:
    parser.add_argument("port", nargs="?", help="the port a server listens on in the sandbox; or 'stop'")
    parser.add_argument("path", nargs="?", default="", help="a path on that server (stop: the port)")
    parser.add_argument("--list", action="store_true", help="the ports previewed now")


@magic("preview", "line", "Show a web app listening on PORT in the sandbox, as a link and a frame served by the "
       "Jupyter server (--list: the ports previewed; stop PORT: forget one and cut its connections).",
       _configure, usage="%preview PORT [PATH] | %preview --list | %preview stop PORT")
def _preview(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    box: PreviewBox = ctx.preview_box()
    if args.list:
        if args.port is not None:
            raise UsageError("%preview --list takes no port")
        _list(ctx, box)
        return
    if args.port is None:
        raise UsageError("%preview: give a PORT (a server listening in the sandbox), --list, or stop PORT")
    if args.port == "stop":
        if not args.path:
            raise UsageError("%preview stop: give the PORT to stop previewing")
        _stop(ctx, box, _port(args.path))
        return
    start(ctx, box, _port(args.port), _path(args.path))


def _list(ctx: MagicContext, box: PreviewBox) -> None:
    kid = kernel_id(box.connection_file)
    ports = record.read(_state_dir(box))
    if not ports:
        ctx.stream("no port is previewed (%preview PORT starts one)\n")
        return
    base_url = box.base_url if box.base_url.startswith("/") else "/"
    show_table(ctx, ["port", "served at"], [[str(port), f"{H.base_path(base_url, kid, port)}/{info.get('path', '')}"]
                                            for port, info in sorted(ports.items())])


def _stop(ctx: MagicContext, box: PreviewBox, port: int) -> None:
    state_dir = _state_dir(box)
    if not record.remove(state_dir, port):
        raise CellError("NoPreview", f"port {port} is not previewed (%preview --list shows the ones that are)")
    sock_path, headers = _endpoint(box)
    try:
        closed = close_port(sock_path, headers, port)
    except (TunnelRefused, OSError, ValueError) as exc:
        raise CellError("NoPreview", f"port {port} is no longer served, but its open connections could not be "
                                     f"cut: {exc}") from None
    ctx.stream(f"port {port} is no longer previewed ({closed} open connection(s) cut); the server in the sandbox "
               "still runs: stop it there\n")


PREVIEW_MAGICS = (_preview,)
