"""The `opensandbox` provider: a sandbox that an OpenSandbox server already runs, reached only
through its execd endpoint (a URL and the headers that came with it, e.g. X-EXECD-ACCESS-TOKEN).

execd gives no shell and no `exec -i`, but its pipe sessions are a command with stdin and stdout,
which is all a provider needs (see `wstransport`). Everything goes through them:

* the box's bootstrap (`box/bootstrap.py`, run as `python3 -S -c SOURCE ARGS...`; see `boxed.py`)
  makes the private runtime folder, receives the zipapp when that version is not in the box yet,
  starts the daemon detached — or finds it serving — and prints one JSON line. execd has no "close
  stdin", so the zipapp goes in length-prefixed: the bootstrap asks for it with a line and reads
  exactly that many bytes. (OpenSandbox's execd also has `/files/upload`; the runner box's own
  execd-compatible endpoint does not, and the pipe route works with both.)
* each pipe to the daemon is a relay (`attach`) in a pipe session of its own.
* `%attach` talks to this same execd directly (`execd_endpoint`), not to the daemon's endpoint.

The daemon lingers after its last client, so a dropped connection or a restarting kernel finds it
again; `destroy()` stops it and removes its folder. The box is the OpenSandbox sandbox itself: this
provider never creates or deletes sandboxes, it only runs in one. Given a lifecycle server instead
(`OWSANDBOX_OPENSANDBOX_SERVER`), `opensandbox` makes a sandbox per kernel: see `opensandbox_lifecycle`
and `make_provider`, which picks between the two.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import time
import weakref
from collections.abc import Mapping
from typing import Any

from ...box.bootstrap import LACKING_MARK
from ...channel.endpoint import ENV_URL, ExecdEndpoint
from ...settings import Settings, settings_of
from ..wstransport import ExecdPipeTransport, ExecdTransportError
from .boxed import BoxError, ProgramBoxProvider, bootstrap_argv, bootstrap_source, missing_modules

_KEY = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")


def _endpoint(url: str | None, headers: Mapping[str, str] | None, given: Settings) -> ExecdEndpoint:
    """The endpoint from the arguments, else from OWSANDBOX_EXECD_URL (with or without a scheme),
    OWSANDBOX_EXECD_HEADERS (JSON) and OWSANDBOX_EXECD_TOKEN."""
    endpoint = ExecdEndpoint.from_env(given if url is None else dataclasses.replace(given, execd_url=url.strip()))
    if headers is not None:
        endpoint = dataclasses.replace(endpoint, headers=dict(headers))
    return endpoint


def make_provider(*args: Any, **options: Any) -> OpenSandboxProvider:
    """The `opensandbox` provider by name: one that creates its sandbox through the lifecycle API when
    given a server (`server`, or OWSANDBOX_OPENSANDBOX_SERVER), else one in the sandbox whose execd
    OWSANDBOX_EXECD_URL names. Both at once is a ValueError: they are two different ways to work."""
    from .opensandbox_lifecycle import SERVER_ENV, OpenSandboxLifecycleProvider

    given = options["settings"] = settings_of(options.get("settings"))
    if options.get("server") or given.opensandbox_server:
        if options.get("url") or given.execd_url:
            raise ValueError(f"{SERVER_ENV} and {ENV_URL} are both set: the first makes a sandbox per kernel, the "
                             "second names the execd of a sandbox that exists already; set only one")
        return OpenSandboxLifecycleProvider(*args, **options)
    return OpenSandboxProvider(*args, **options)


class OpenSandboxProvider(ProgramBoxProvider):
    name = "opensandbox"
    enforcement = "the OpenSandbox sandbox"
    network_fixed = ("an OpenSandbox sandbox has its own network, set by its server (its network policy), not by "
                     "owsandbox: its commands reach what the sandbox reaches")
    snapshots_refused = ("the files are in the OpenSandbox sandbox, not on this machine: the box would have to copy "
                         "them itself, and nothing the box writes is trusted here")

    def __init__(self, cwd: str | os.PathLike[str] | None = None, url: str | None = None,
                 headers: Mapping[str, str] | None = None, python: str = "python3", key: str | None = None,
                 linger_seconds: float = 300.0, box_cwd: str | None = None, *,
                 relay_silence_seconds: float = 60.0, runtime_dir: str | None = None, timeout: float = 60.0,
                 settings: Settings | None = None) -> None:
        settings = settings_of(settings)
        #: The execd this provider talks to: known when it is made here; a subclass that makes the
        #: sandbox sets it once the sandbox runs (`_endpoint_at_start` gives None).
        self.endpoint: ExecdEndpoint | None = self._endpoint_at_start(url, headers, settings)
        super().__init__(cwd, python=python, key=key, linger_seconds=linger_seconds,
                         relay_silence_seconds=relay_silence_seconds, box_cwd=box_cwd, timeout=timeout,
                         runtime_dir=runtime_dir, settings=settings)
        if not _KEY.match(self.key):
            raise ValueError(f"'{self.key}' cannot name a folder in the box: use letters, digits, '.', '_', '-'")
        self._transports: weakref.WeakSet[ExecdPipeTransport] = weakref.WeakSet()

    def _endpoint_at_start(self, url: str | None, headers: Mapping[str, str] | None,
                           given: Settings) -> ExecdEndpoint | None:
        """The execd endpoint, when it is known before the box runs: the one given, else the settings'."""
        return _endpoint(url, headers, given)

    @property
    def execd(self) -> ExecdEndpoint:
        """The execd endpoint of the box; BoxError before there is one (a sandbox not made yet)."""
        if self.endpoint is None:
            raise BoxError("the OpenSandbox sandbox has no execd endpoint yet: it is not created")
        return self.endpoint

    # -- talking to the box -----------------------------------------------------------------

    def _run_bootstrap(self, args: dict[str, Any]) -> dict[str, Any]:
        """Run the bootstrap in a pipe session: feed it the zipapp if it asks, return its answer."""
        # `ack`: the bootstrap waits for our line after its answer, since a released execd may
        # close the connection before the output that came just before the program's end.
        command = (f"exec {shlex.quote(self.python)} -S -c {shlex.quote(bootstrap_source())} "
                   f"{shlex.join(bootstrap_argv({**args, 'ack': True}))}")
        where = f"the OpenSandbox execd at {self.execd.describe()}"
        try:
            transport = ExecdPipeTransport(self.execd, command, open_timeout=min(self.timeout, 15.0))
        except ExecdTransportError as exc:
            raise BoxError(f"cannot use {where}: {exc}") from exc
        answer: dict[str, Any] | None = None
        deadline = time.monotonic() + self.timeout
        buffer = b""
        plain: list[bytes] = []  # lines that are not JSON: what a box without the modules says
        try:
            while True:
                chunk = transport.read(max(0.0, deadline - time.monotonic()))
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    message = _json_object(line)
                    if message is None:
                        plain.append(line)
                        if line.startswith(LACKING_MARK.encode()):
                            transport.send(b"ack\n")  # named: it may end now
                    elif message.get("need_runner"):
                        transport.send(self._upload())
                    else:
                        answer = message
                        transport.send(b"ack\n")  # it may end now
        except TimeoutError:
            raise BoxError(f"{self.python} in the box (through {where}) did not answer within "
                           f"{self.timeout:g} s") from None
        except OSError as exc:
            raise BoxError(f"the pipe session to {where} failed: {exc}") from exc
        finally:
            transport.close()
        if answer is None:
            lacking = missing_modules(b"\n".join([*plain, buffer]).decode(errors="replace"), self.python)
            if lacking:
                raise BoxError(f"{lacking} (through {where})")
            tail = transport.stderr_tail()
            status = transport.exit_code
            if self._python_not_found(status, tail):
                raise BoxError(f"the box has no {self.python}: it was not found through {where} "
                               f"(status {status}): {tail[-1000:]}")
            raise BoxError(f"{self.python} in the box (through {where}) failed (status {status}): "
                           f"{tail[-1000:] or 'no message'}")
        if answer.get("error"):
            raise BoxError(f"{answer['error']} (in the box, through {where})")
        return answer

    # -- the provider -----------------------------------------------------------------------

    def open_runner(self) -> ExecdPipeTransport:
        command = shlex.join(self._relay_argv(self.python))
        with self._lifecycle:  # not while the daemon is being restarted: wait for the new one
            transport = ExecdPipeTransport(self.execd, f"exec {command}")
            self._transports.add(transport)
        return transport

    def execd_endpoint(self, hello: dict[str, Any]) -> ExecdEndpoint:
        """%attach uses the sandbox's own execd, the one this provider already talks to."""
        return self.execd

    def execd_socket(self, hello: dict[str, Any]) -> str:
        raise BoxError("an OpenSandbox box is reached through its execd URL, not a socket here: "
                       "use execd_endpoint()")

    def _disconnect(self) -> None:
        for transport in list(self._transports):
            transport.close()

    def headline(self) -> list[str]:
        return ["OpenSandbox", f"execd at {self.execd.describe()}", self._starts_in()]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "endpoint": self.execd.describe(), **self._box_rows()}


def _json_object(line: bytes) -> dict[str, Any] | None:
    if not line.startswith(b"{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
