"""What passes the preview proxy, without I/O: the headers and query of a request on their way into the
box, the headers of the box's answer on their way out, and the policy every answer carries.

Box content is untrusted: it must never run in JupyterLab's origin nor see the Jupyter server's
credentials. So the request loses the server's cookies, `Authorization`, `X-XSRFToken` and the
`token` query parameter (and the hop-by-hop headers, which are the proxy's own); the answer loses the
box's `Set-Cookie` (a cookie set on the server's origin would be the server's) and gains
`Content-Security-Policy: sandbox allow-scripts allow-forms allow-popups`, which makes a page of the
box an opaque origin even when opened in a tab of its own, and `frame-ancestors 'self'`, so that only
the server's own pages frame it; and `Referrer-Policy: no-referrer`, so that the preview's path (its
capability) is never sent elsewhere. The box's own policies are kept: they can only restrict further.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import unquote_plus, urlsplit

SANDBOX = "allow-scripts allow-forms allow-popups"  # the iframe's sandbox attribute and the CSP's, the same
CSP = f"sandbox {SANDBOX}; frame-ancestors 'self'"
PREFIX = "/owsandbox/preview"
# The Jupyter server's credentials, and what only concerns one hop (RFC 9110 7.6.1), never relayed.
_REQUEST_DROPPED = {"cookie", "authorization", "x-xsrftoken", "x-csrftoken", "proxy-authorization",
                    "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
                    "upgrade", "host", "content-length", "expect"}
_RESPONSE_DROPPED = {"set-cookie", "set-cookie2", "referrer-policy", "connection", "keep-alive", "proxy-connection",
                     "te", "trailer", "transfer-encoding", "upgrade", "content-length", "server", "date"}
_WEBSOCKET_KEPT = {"sec-websocket-key", "sec-websocket-version", "sec-websocket-protocol",
                   "sec-websocket-extensions"}
_WEBSOCKET_ANSWER_KEPT = {"sec-websocket-accept", "sec-websocket-protocol", "sec-websocket-extensions"}


def base_path(base_url: str, kernel_id: str, port: int) -> str:
    """The path a preview is served at, under the server's base_url (JupyterHub's `/user/NAME/`, say)."""
    return f"{base_url.rstrip('/')}{PREFIX}/{kernel_id}/{port}"


def request_headers(headers: Iterable[tuple[str, str]], port: int, websocket: bool = False) -> list[tuple[str, str]]:
    """The headers to send to the box's port: the client's without the server's credentials and the
    hop-by-hop ones, `Host` naming the box's port, and for a WebSocket the handshake's own."""
    kept = [("Host", f"127.0.0.1:{port}")]
    for name, value in headers:
        lower = name.lower()
        if lower in _REQUEST_DROPPED or (lower.startswith("sec-websocket-") and lower not in _WEBSOCKET_KEPT):
            continue
        if lower.startswith("sec-websocket-") and not websocket:
            continue
        kept.append((name, value))
    if websocket:
        kept += [("Connection", "Upgrade"), ("Upgrade", "websocket")]
    else:
        kept.append(("Connection", "close"))
    return kept


def request_target(path: str, query: str) -> str:
    """The target to ask the box for: `path` in the box, the query without the server's `token`."""
    # Each part kept as it was written (a server may tell %20 from +); a name is compared decoded, as the
    # Jupyter server reads it.
    kept = [part for part in query.split("&") if part and unquote_plus(part.partition("=")[0]) != "token"]
    target = path if path.startswith("/") else "/" + path
    return target + ("?" + "&".join(kept) if kept else "")


def response_headers(headers: Iterable[tuple[str, str]], prefix: str, port: int,
                     websocket: bool = False) -> list[tuple[str, str]]:
    """The box's answer's headers as the browser gets them: no cookies, no hop-by-hop headers, a
    `Location` in the box moved under `prefix`, and the sandbox policy."""
    kept = []
    for name, value in headers:
        lower = name.lower()
        if lower in _RESPONSE_DROPPED or (lower.startswith("sec-websocket-") and lower not in _WEBSOCKET_ANSWER_KEPT):
            continue
        if lower == "location":
            value = location(value, prefix, port)
        kept.append((name, value))
    kept.append(("Content-Security-Policy", CSP))
    kept.append(("Referrer-Policy", "no-referrer"))
    if not any(name.lower() == "access-control-allow-origin" for name, _ in kept):
        # The page's origin is opaque (`null`): its fetch() of its own server is cross-origin. It sends no
        # credential (the capability is the path), so every origin may read what the path gives.
        kept.append(("Access-Control-Allow-Origin", "*"))  # the path's capability never leaves in a Referer
    if websocket:
        kept += [("Connection", "Upgrade"), ("Upgrade", "websocket")]
    return kept


def location(value: str, prefix: str, port: int) -> str:
    """A redirect of the box's, under the preview's path: `/x` and `http://127.0.0.1:PORT/x` (or
    localhost) become `PREFIX/x`; a relative one stays, and one elsewhere is left as it is (the
    browser goes there as for any link)."""
    if value.startswith("/") and not value.startswith("//"):
        return prefix + value
    parts = urlsplit(value)
    if parts.scheme in ("http", "https") and parts.hostname in ("127.0.0.1", "localhost", "::1") \
            and (parts.port or 80) == port:
        return prefix + (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return value


def websocket_head(target: str, headers: list[tuple[str, str]]) -> bytes:
    """The WebSocket handshake request to write to the box's port."""
    lines = [f"GET {target} HTTP/1.1"] + [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_answer_head(head: bytes) -> tuple[int, str, list[tuple[str, str]]]:
    """(status, reason, headers) of an HTTP answer's head (up to its blank line); ValueError if it is none."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name.strip() or name != name.strip():
            raise ValueError(f"a malformed header line in the box's answer: {line[:80]!r}")
        headers.append((name, value.strip()))
    return int(parts[1]), parts[2] if len(parts) > 2 else "", headers


def answer_head(status: int, reason: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason or 'Switching Protocols'}"] + [f"{n}: {v}" for n, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
