"""Where execd listens and what every request to it must carry.

An endpoint is either an HTTP origin (`http://host:44772`, optionally with a path prefix when execd
sits behind a proxy route) or the path of a Unix socket (the runner's box serves execd's API on
one). Both the HTTP control calls and the WebSocket use the same endpoint, so the address and the
headers (the access token, or whatever the OpenSandbox server handed out with the endpoint) are
decided once, here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .. import settings
from .errors import ExecdError

TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"
ENV_URL = settings.EXECD_URL
ENV_HEADERS = settings.EXECD_HEADERS

# The Host name used for requests over a Unix socket, where there is no host to name.
UNIX_HOST = "localhost"


def headers_from_json(text: str) -> dict[str, str]:
    """OWSANDBOX_EXECD_HEADERS's headers: a JSON object of names to string values ({} for "")."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ExecdError(f"{ENV_HEADERS} must be a JSON object of header names and values: {exc}") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ExecdError(f'{ENV_HEADERS} must be a JSON object of header names and string values, '
                         f'such as {{"OpenSandbox-Ingress-To": "..."}}')
    return dict(value)


@dataclass(frozen=True)
class ExecdEndpoint:
    """An execd address: `origin` (http[s]://host:port[/prefix]) or `unix_socket` (a path), and headers.

    Exactly one of `origin` and `unix_socket` is given. `headers` go on every request, the
    WebSocket handshake included.
    """

    origin: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    unix_socket: str | None = None

    def __post_init__(self) -> None:
        if (self.origin is None) == (self.unix_socket is None):
            raise ExecdError("an execd endpoint needs exactly one of origin (http://host:port) and unix_socket")
        if self.origin is not None and "://" not in self.origin:
            # OpenSandbox's lifecycle API answers an endpoint as host[:port][/path] without a scheme
            # (`host:port/proxy/44772`, or `.../sandboxes/{id}/proxy/44772` through the server).
            object.__setattr__(self, "origin", "http://" + self.origin)
        if self.origin is not None:
            parts = urlsplit(self.origin)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ExecdError(f"an execd origin looks like http://host:port, not {self.origin!r}")
            if parts.query or parts.fragment:
                raise ExecdError(f"an execd origin has no query or fragment: {self.origin!r}")
            object.__setattr__(self, "origin", self.origin.rstrip("/"))
        object.__setattr__(self, "headers", dict(self.headers))

    @classmethod
    def from_env(cls, environ: settings.Settings | Mapping[str, str] | None = None) -> ExecdEndpoint:
        """The endpoint named by OWSANDBOX_EXECD_URL (`http://host:port[/prefix]`, `host:port[/prefix]`
        as OpenSandbox's lifecycle API gives it, or `unix:/path/to/socket`), with the headers of
        OWSANDBOX_EXECD_HEADERS (a JSON object: the routing headers the lifecycle API hands out with
        the endpoint, `OPEN-SANDBOX-API-KEY` through the server's proxy, ...) and OWSANDBOX_EXECD_TOKEN,
        if set, sent as X-EXECD-ACCESS-TOKEN. `environ`: the settings, or the variables to read them from
        (None: this process's)."""
        given = settings.settings_of(environ)
        url = given.execd_url
        if not url:
            raise ExecdError(f"{ENV_URL} is not set (http://host:port, or unix:/path/to/socket)")
        headers = headers_from_json(given.execd_headers)
        token = given.execd_token
        if token:
            headers = {k: v for k, v in headers.items() if k.lower() != TOKEN_HEADER.lower()}
            headers[TOKEN_HEADER] = token
        if url.startswith("unix:"):
            path = url[len("unix:"):]
            if path.startswith("//"):  # unix:///abs/path
                path = path[2:]
            if not path:
                raise ExecdError(f"{ENV_URL}={url!r} names no socket path")
            return cls(unix_socket=path, headers=headers)
        return cls(origin=url, headers=headers)

    @property
    def has_token(self) -> bool:
        return any(name.lower() == TOKEN_HEADER.lower() for name in self.headers)

    def describe(self) -> str:
        """The address for messages: the origin or `unix:<path>` (never the headers)."""
        return self.origin if self.origin is not None else f"unix:{self.unix_socket}"

    def http_path(self, path: str) -> str:
        """The request target for an API path (`/pty/…`), the origin's path prefix included."""
        prefix = urlsplit(self.origin).path if self.origin is not None else ""
        return prefix.rstrip("/") + path

    def websocket_uri(self, path_and_query: str) -> str:
        """The ws:// or wss:// URI for an API path; over a Unix socket the host is nominal."""
        if self.origin is None:
            return f"ws://{UNIX_HOST}{path_and_query}"
        parts = urlsplit(self.origin)
        scheme = "wss" if parts.scheme == "https" else "ws"
        return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}{path_and_query}"

    def __repr__(self) -> str:  # the headers carry the token: name them, never show their values
        names = ", ".join(sorted(self.headers)) or "none"
        return f"ExecdEndpoint({self.describe()!r}, headers: {names})"
