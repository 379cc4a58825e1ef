"""The preview proxy: `/owsandbox/preview/<kernel id>/<port>/…` of the Jupyter server, relayed to the port
in that kernel's sandbox.

The entry, `/owsandbox/preview/<kernel id>/<port>/PATH`, needs the server's own login (`JupyterHandler`:
without a token or login, a page goes to the login page and anything else gets 403), and answers with a
redirect to `…/<port>/~SECRET/PATH`, the preview's capability path: the box's page runs in an opaque
origin (the sandbox), whose requests carry none of the server's cookies, so its images, scripts, forms,
`fetch()` and WebSockets are let through by the secret in their path (a new one at each `%preview`,
kept in the host's record, compared in constant time, never sent on in a Referer).

The kernel's sandbox is found from what the host owns, as the sandbox terminal finds it
(`terminal.locate`): the server's kernel manager names the kernel's connection file, which gives the
sandbox key and its private state folder; there, a bubblewrap box's execd socket the host made and the
token in the host's record, or a container's door (`host/providers/container_door.py`: the engine's
`exec -i` relay the kernel's own bridge runs, started here per connection). A port is served only
while the kernel's `%preview` has it in the record (`record.py`). The box's answer is streamed (256 KiB
at a time, each written and flushed before the next is read), so a large file never sits in the
server's memory; a WebSocket is relayed as bytes once both handshakes are done.
What is relayed is filtered both ways by `headers.py`.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import JupyterHandler
from tornado import httputil, web
from tornado.http1connection import HTTP1Connection, HTTP1ConnectionParameters
from tornado.iostream import IOStream, StreamClosedError

from ..host.providers.container_door import ContainerDoor
from ..terminal import locate
from . import headers as H
from . import record
from .tunnel import TunnelRefused, open_command_stream, open_tunnel_stream

CHUNK_BYTES = 256 * 1024
MAX_ANSWER_HEAD_BYTES = 64 * 1024
ROUTE = r"/owsandbox/preview/([^/]+)/([0-9]+)(/.*)?"
_CAPABILITY = re.compile(r"/~([A-Za-z0-9_-]{16,64})(/.*)?")


class PreviewHandler(JupyterHandler):
    """One request to a previewed port, any method; a WebSocket upgrade too."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")

    def set_default_headers(self) -> None:
        super().set_default_headers()
        # Even the server's own error pages here carry the sandbox: they may quote the box's words.
        self.set_header("Content-Security-Policy", H.CSP)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """The refusal in plain words (what the frame shows), not the server's HTML page."""
        error = kwargs.get("exc_info", (None, None, None))[1]
        said = self._reason
        if isinstance(error, web.HTTPError) and error.log_message:
            said = error.log_message % error.args  # tornado doubles a bare message's %
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"{status_code} {self._reason}: {said}\n")

    def check_xsrf_cookie(self) -> None:
        """The box's pages post to the box's app, never to the server's API: they cannot know the
        server's XSRF cookie (they run in an opaque origin), and they get no credential of the server's."""
        return

    @allow_unauthenticated  # the preview's own capability, or the server's login: see _proxy
    async def get(self, kernel_id: str, port: str, path: str | None) -> None:
        await self._proxy(kernel_id, port, path)

    head = post = put = delete = patch = options = get  # every method is proxied alike

    # -- finding the box --------------------------------------------------------------------

    def _endpoint(self, kernel_id: str, port: int) -> tuple[Any, str]:
        """The execd endpoint of kernel `kernel_id`'s sandbox and the preview's secret, once `port` is
        known to be previewed."""
        try:
            connection_file = self.kernel_manager.get_kernel(kernel_id).connection_file
        except (AttributeError, KeyError):
            raise web.HTTPError(404, f"no running kernel {kernel_id} in this server: a preview is served by the "
                                     "Jupyter server that runs the kernel") from None
        if not connection_file:
            raise web.HTTPError(404, f"kernel {kernel_id} has no connection file to find its sandbox by")
        try:
            folder = locate.state_folder(locate.sandbox_key(str(connection_file)))
            endpoint = locate.door_in(folder)
            previewed = record.read(folder)
        except (locate.NoSandbox, RuntimeError) as exc:
            raise web.HTTPError(404, f"kernel {kernel_id} has no sandbox this server can reach: {exc}") from None
        if port not in previewed:
            raise web.HTTPError(404, f"port {port} of kernel {kernel_id}'s sandbox is not previewed: run "
                                     f"%preview {port} in its notebook")
        secret = previewed[port].get("secret")
        if not isinstance(secret, str) or not secret:
            raise web.HTTPError(404, f"port {port} was previewed by an older owsandbox: run %preview {port} again")
        return endpoint, secret

    async def _tunnel(self, endpoint: Any, kernel_id: str, port: int) -> IOStream:
        try:
            if isinstance(endpoint, ContainerDoor):  # the engine's exec, as the kernel's own bridge runs it
                stream = await open_command_stream(endpoint.argv(), endpoint.env(), endpoint.headers, port)
            else:
                stream = await open_tunnel_stream(endpoint.unix_socket, endpoint.headers, port)
        except TunnelRefused as exc:
            raise web.HTTPError(502 if exc.status != 504 else 504, f"port {port} in the sandbox: {exc}") from None
        except OSError as exc:
            raise web.HTTPError(502, f"kernel {kernel_id}'s sandbox does not answer ({exc}): it has ended "
                                     "or is ending") from None
        return stream

    # -- relaying ---------------------------------------------------------------------------

    async def _proxy(self, kernel_id: str, port_text: str, path: str | None) -> None:
        """Relay the request, if it may be: under the preview's capability path (`~SECRET/…`), which the
        box's page keeps for its own relative URLs, or, for the entry without it, with the server's login,
        answered by a redirect to the capability path. The page runs in an opaque origin (the sandbox), so
        its requests carry none of the server's cookies: the path is what lets its images, scripts,
        `fetch()` and WebSockets through, and only someone logged in to the server is sent there."""
        port = int(port_text)
        if not 0 < port < 65536:
            raise web.HTTPError(400, f"{port_text} is not a port (1..65535)")
        if not self.current_user and not (path or "").startswith("/~"):
            if self.request.method in ("GET", "HEAD"):
                web.authenticated(_nothing)(self)  # redirects to the server's login page
                return
            raise web.HTTPError(403, "a preview needs the server's login")
        endpoint, secret = self._endpoint(kernel_id, port)
        prefix = H.base_path(self.base_url, kernel_id, port)
        capability = _CAPABILITY.fullmatch(path or "")
        if capability is None:  # the entry, logged in: on to the capability path
            query = H.request_target("/", self.request.query)[1:]
            self.redirect(f"{prefix}/~{secret}{path or '/'}{query}", status=302 if self.request.method in
                          ("GET", "HEAD") else 307)
            return
        if not hmac.compare_digest(capability.group(1).encode(), secret.encode()):
            raise web.HTTPError(403, f"this preview of port {port} has ended or was started again: run %preview "
                                     f"{port} and follow its new link")
        prefix += f"/~{secret}"
        if self.request.method == "OPTIONS" and "Access-Control-Request-Method" in self.request.headers:
            self._preflight()
            return
        target = H.request_target(capability.group(2) or "/", self.request.query)
        stream = await self._tunnel(endpoint, kernel_id, port)
        try:
            if self.request.headers.get("Upgrade", "").lower() == "websocket" and self.request.method == "GET":
                await self._websocket(stream, port, prefix, target)
            else:
                await self._http(stream, port, prefix, target)
        finally:
            stream.close()

    def _preflight(self) -> None:
        """A CORS preflight of the box's page (whose origin is opaque, `null`, so its `fetch()` to its own
        server is cross-origin): allowed, as the capability path is the credential and none is sent."""
        self.set_status(204)
        self.set_header("Access-Control-Allow-Origin", "*")
        self.set_header("Access-Control-Allow-Methods", self.request.headers["Access-Control-Request-Method"])
        asked = self.request.headers.get("Access-Control-Request-Headers")
        if asked:
            self.set_header("Access-Control-Allow-Headers", asked)
        self.set_header("Access-Control-Max-Age", "600")
        self.finish()

    async def _http(self, stream: IOStream, port: int, prefix: str, target: str) -> None:
        conn = HTTP1Connection(stream, True, HTTP1ConnectionParameters(
            no_keep_alive=True, decompress=False, chunk_size=CHUNK_BYTES,
            max_header_size=MAX_ANSWER_HEAD_BYTES, max_body_size=1 << 62))
        sent = httputil.HTTPHeaders()
        for name, value in H.request_headers(self.request.headers.get_all(), port):
            sent.add(name, value)
        body = self.request.body or b""
        if body or self.request.method in ("POST", "PUT", "PATCH"):
            sent["Content-Length"] = str(len(body))
        answer = _Answer(self, prefix, port)
        try:
            await conn.write_headers(httputil.RequestStartLine(self.request.method, target, "HTTP/1.1"), sent)
            if body:
                await conn.write(body)
            conn.finish()
            await conn.read_response(answer)
        except (StreamClosedError, httputil.HTTPInputError) as exc:
            if not answer.started:
                raise web.HTTPError(502, f"port {port} in the sandbox closed the connection without an answer "
                                         f"({exc})") from None
            self.request.connection.close()  # cut short: the client sees a truncated answer, never a whole one
            return
        if answer.started and not self._finished:
            self.finish()

    async def _websocket(self, stream: IOStream, port: int, prefix: str, target: str) -> None:
        sent = H.request_headers(self.request.headers.get_all(), port, websocket=True)
        try:
            await stream.write(H.websocket_head(target, sent))
            head = await stream.read_until(b"\r\n\r\n", max_bytes=MAX_ANSWER_HEAD_BYTES)
            status, reason, got = H.parse_answer_head(head[:-4])
        except (StreamClosedError, ValueError) as exc:
            raise web.HTTPError(502, f"port {port} in the sandbox did not answer the WebSocket handshake "
                                     f"({exc})") from None
        if status != 101:
            raise web.HTTPError(502, f"port {port} in the sandbox refused the WebSocket ({status} {reason})")
        client = self.detach()
        await client.write(H.answer_head(101, reason, H.response_headers(got, prefix, port, websocket=True)))
        await asyncio.gather(_pump(stream, client), _pump(client, stream))


class _Answer(httputil.HTTPMessageDelegate):
    """The box's answer, written to the handler as it comes: headers filtered, each chunk flushed
    (the connection's reader waits for that flush before reading on, which bounds memory)."""

    def __init__(self, handler: PreviewHandler, prefix: str, port: int) -> None:
        self.handler = handler
        self.prefix = prefix
        self.port = port
        self.started = False

    def headers_received(self, start_line: Any, headers: httputil.HTTPHeaders) -> None:
        handler = self.handler
        handler.clear()
        handler.set_status(start_line.code, start_line.reason or "Unknown")
        handler.clear_header("Content-Type")
        for name, value in H.response_headers(headers.get_all(), self.prefix, self.port):
            if name == "Content-Security-Policy":
                handler.set_header(name, value)
            else:
                handler.add_header(name, value)
        self.started = True

    async def data_received(self, chunk: bytes) -> None:
        self.handler.write(chunk)
        await self.handler.flush()

    def finish(self) -> None:
        pass

    def on_connection_close(self) -> None:
        pass


def _nothing(_handler: Any) -> None:
    return None


async def _pump(source: IOStream, sink: IOStream) -> None:
    try:
        while True:
            data = await source.read_bytes(CHUNK_BYTES, partial=True)
            await sink.write(data)
    except StreamClosedError:
        pass
    finally:
        sink.close()
        source.close()
