"""The `exec` provider: any box you can run a command in with pipes — `ssh HOST`, `docker exec -i C`,
`podman exec -i C`, `kubectl exec -i POD --`.

Everything goes through that one command prefix. Every word passed after it is a plain word (no
spaces, quotes or shell syntax), so a prefix that hands its arguments to a remote shell (ssh) and one
that runs them directly (docker exec) behave alike; programs go in on stdin to `python3 -`. What it
shares with the `opensandbox` provider (the box's bootstrap, the zipapp copied in once per version,
a daemon that lingers, a relay per pipe) is in `boxed.py`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from typing import Any

from ... import settings
from ...settings import Settings, settings_of
from ..forward import ForwardBridge
from ..transport import PipeTransport
from .boxed import BoxError, ProgramBoxProvider, bootstrap_argv, bootstrap_source, missing_modules

EXEC_ENV = settings.EXEC
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")

__all__ = ["EXEC_ENV", "BoxError", "ExecProvider", "stdin_program"]


def stdin_program(args: dict[str, Any], stdin: bytes = b"") -> str:
    """The bootstrap as a program for `python3 -`, which reads its program up to the end of its stdin:
    its arguments and what it reads on stdin (`stdin`) go in with it, in front of its source."""
    return (f"import io, sys\nsys.argv[1:] = {bootstrap_argv(args)!r}\n"
            f"sys.stdin = io.TextIOWrapper(io.BytesIO({stdin!r}))\n" + bootstrap_source())


class ExecProvider(ProgramBoxProvider):
    name = "exec"
    enforcement = "the box"
    snapshots_refused = ("its box keeps its files where this machine cannot reach them (ssh, a container of its "
                         "own): the box would have to copy them itself, and nothing the box writes is trusted here")

    def __init__(self, cwd: str | os.PathLike[str] | None = None, prefix: list[str] | str | None = None,
                 python: str = "python3", key: str | None = None, linger_seconds: float = 300.0,
                 relay_silence_seconds: float = 60.0, box_cwd: str | None = None, timeout: float = 60.0,
                 settings: Settings | None = None) -> None:
        settings = settings_of(settings)
        prefix = prefix if prefix is not None else settings.exec
        self.prefix = shlex.split(prefix) if isinstance(prefix, str) else list(prefix)
        if not self.prefix:
            raise ValueError(f"the exec provider needs a command prefix (e.g. 'ssh me@host'); set {EXEC_ENV}")
        super().__init__(cwd, python=python, key=key, linger_seconds=linger_seconds,
                         relay_silence_seconds=relay_silence_seconds, box_cwd=box_cwd, timeout=timeout,
                         settings=settings)
        self.box_python = python
        self._bridge: ForwardBridge | None = None
        for word in (self.python, self.key):
            if not _PLAIN_WORD.match(word):
                raise ValueError(f"'{word}' is not a plain word; the exec provider passes only plain words")

    # -- talking to the box -----------------------------------------------------------------

    def _run_bootstrap(self, args: dict[str, Any]) -> dict[str, Any]:
        answer = self._run_program(stdin_program(args))
        if answer.get("need_runner"):  # the first time this version meets this box
            answer = self._run_program(stdin_program(args, self._upload()))
        return answer

    def _run_program(self, program: str) -> dict[str, Any]:
        argv = [*self.prefix, self.python, "-"]
        try:
            done = subprocess.run(argv, input=program.encode(), capture_output=True, timeout=self.timeout)
        except FileNotFoundError as exc:
            raise BoxError(f"cannot run {shlex.join(argv)}: {exc.strerror}") from None
        except subprocess.TimeoutExpired:
            raise BoxError(f"{shlex.join(argv)} did not answer within {self.timeout:g} s") from None
        output = done.stdout.decode(errors="replace")
        lacking = missing_modules(output, self.python)
        if lacking:
            raise BoxError(f"{lacking} ({shlex.join(argv)})")
        lines = [line for line in output.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            stderr = done.stderr.decode(errors="replace").strip()
            if self._python_not_found(done.returncode, stderr):
                raise BoxError(f"the box has no {self.python}: {shlex.join(argv)} failed "
                               f"(status {done.returncode}): {stderr[-1000:]}")
            raise BoxError(f"{shlex.join(argv)} failed (status {done.returncode}): {stderr[-1000:] or 'no message'}")
        answer = json.loads(lines[-1])
        if answer.get("error"):
            raise BoxError(answer["error"])
        return answer

    # -- the provider -----------------------------------------------------------------------

    def _started(self, answer: dict[str, Any]) -> None:
        super()._started(answer)
        # Relays start the interpreter by its path: a wrapper found on PATH (pyenv's, say) costs time on
        # every connection.
        self.box_folder = self.box_folder if _PLAIN_WORD.match(self.box_folder) else ""  # where a relay restarts it
        executable = answer.get("executable") or ""
        self.box_python = executable if _PLAIN_WORD.match(executable) else self.python
        for word in (self.socket_path, self.runner_path):
            if not _PLAIN_WORD.match(word):
                raise BoxError(f"the box's runtime folder '{word}' has characters the exec provider cannot pass")

    def open_runner(self) -> PipeTransport:
        return PipeTransport([*self.prefix, *self._relay_argv(self.box_python)])

    def execd_socket(self, hello: dict[str, Any]) -> str:
        """The box's execd socket is in the box: a local bridge runs `forward` through the prefix."""
        with self._lifecycle:
            if self._bridge is None:
                target = hello["execd"]["unix_socket"]
                if not _PLAIN_WORD.match(target):
                    raise BoxError(f"the box's execd socket '{target}' has characters the exec provider cannot pass")
                self._bridge = ForwardBridge(lambda: [*self.prefix, self.box_python, "-S", self.runner_path, "forward",
                                                      "--socket", target])
            return self._bridge.path

    def _disconnect(self) -> None:
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            bridge.close()

    def headline(self) -> list[str]:
        return [f"exec: {shlex.join(self.prefix)}", self._starts_in()]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "command": shlex.join(self.prefix), **self._box_rows()}
