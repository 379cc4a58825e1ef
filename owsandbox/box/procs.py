"""One-shot commands of the runner protocol (`proc.run`), run inside the sandbox.

Unlike the persistent shells, `proc.run` executes a single argv without any shell, so nothing in it
is expanded or interpreted, and answers with its exit code and its stdout and stderr kept apart. The
command runs in a session of its own so that a timeout can kill everything it started, and its output
is drained by threads with a cap, so a noisy command can neither exhaust memory nor block on a full
pipe. Standard library only: this module is copied into the sandbox.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import IO

from ..protocol import FS_ERROR, INVALID_PARAMS, RunnerError
from ..protocol import messages as M
from ..protocol.methods import PROC_RUN
from . import procstat
from .files.ops import resolve_path
from .params import finite, handles

OUTPUT_CAP_BYTES = 4 * 1024 * 1024
KILL_GRACE_S = 1.0  # between SIGTERM and SIGKILL on a timeout
PIPE_GRACE_S = 2.0  # how long output is still collected after the command itself has exited

_READ_CHUNK = 64 * 1024


class _Capture:
    """Drains one pipe in a thread, keeping its first `cap` bytes and discarding the rest."""

    def __init__(self, pipe: IO[bytes], cap: int) -> None:
        self._pipe = pipe
        self._cap = cap
        self._parts: list[bytes] = []
        self._size = 0
        self._truncated = False
        self._abandoned = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, name="proc-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        fd = self._pipe.fileno()
        try:
            while chunk := os.read(fd, _READ_CHUNK):
                self._keep(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                self._pipe.close()

    def _keep(self, chunk: bytes) -> None:
        with self._lock:
            if self._abandoned:
                return
            room = self._cap - self._size
            if len(chunk) > room:
                self._truncated = True
                chunk = chunk[:room]
            if chunk:
                self._parts.append(chunk)
                self._size += len(chunk)

    def finish(self, deadline: float) -> tuple[str, bool]:
        """The output collected by `deadline` (EOF, or the deadline if a leftover background process
        still holds the pipe open; the thread then keeps draining and discarding) and whether it was cut."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._abandoned = True
            data = b"".join(self._parts)
            truncated = self._truncated
        return data.decode("utf-8", errors="replace"), truncated


@handles(PROC_RUN)
def proc_run(params: M.ProcParams, base: str) -> M.ProcResult:
    """Runs `argv` to completion (or until `timeout_s`) and returns its exit code and output."""
    argv = _argv_param(params["argv"])
    cwd = _cwd_param(params.get("cwd"), base)
    env = _env_param(params.get("env"))
    stdin_data = _stdin_param(params.get("stdin"))
    timeout = _timeout_param(params.get("timeout_s"))
    started = time.monotonic()
    process = _start(argv, cwd, env, feed_stdin=stdin_data is not None)
    assert process.stdout is not None and process.stderr is not None
    try:
        stdout = _Capture(process.stdout, OUTPUT_CAP_BYTES)
        stderr = _Capture(process.stderr, OUTPUT_CAP_BYTES)
        if process.stdin is not None and stdin_data is not None:
            _feed(process.stdin, stdin_data)
        timed_out = _wait(process, timeout)
    finally:
        if process.poll() is None:  # interrupted by an error: never leave the command running
            _kill_group(process)
    deadline = time.monotonic() + PIPE_GRACE_S
    out_text, out_cut = stdout.finish(deadline)
    err_text, err_cut = stderr.finish(deadline)
    return M.ProcResult(exit_code=process.returncode, stdout=out_text, stderr=err_text, timed_out=timed_out,
                        stdout_truncated=out_cut, stderr_truncated=err_cut,
                        duration_ms=round((time.monotonic() - started) * 1000))


# ---------------------------------------------------------------- params


def _argv_param(argv: list[str]) -> list[str]:
    if not argv:
        raise RunnerError(INVALID_PARAMS, "param 'argv' must not be empty")
    if not argv[0]:
        raise RunnerError(INVALID_PARAMS, "param 'argv' must start with a program name, not ''")
    if any("\0" in arg for arg in argv):
        raise RunnerError(INVALID_PARAMS, "param 'argv' must not contain a NUL character")
    return argv


def _cwd_param(cwd: str | None, base: str) -> str:
    if cwd is None:
        return base
    if not cwd or "\0" in cwd:
        raise RunnerError(INVALID_PARAMS, "param 'cwd' must be a non-empty path without NUL characters")
    folder = resolve_path(cwd, base)
    if not os.path.isdir(folder):
        raise RunnerError(FS_ERROR, f"no such folder: {folder} (param 'cwd')", {"path": folder})
    return folder


def _env_param(extra: dict[str, str] | None) -> dict[str, str]:
    extra = extra or {}
    for key, value in extra.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise RunnerError(INVALID_PARAMS, f"param 'env' has an invalid variable: {key!r}")
    return {**os.environ, **extra}


def _stdin_param(text: str | None) -> bytes | None:
    if text is None:
        return None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RunnerError(INVALID_PARAMS, f"param 'stdin' is not valid Unicode: {exc}") from exc


def _timeout_param(timeout: float | None) -> float | None:
    timeout = finite("timeout_s", timeout)
    if timeout is not None and not timeout > 0:
        raise RunnerError(INVALID_PARAMS, f"param 'timeout_s' must be greater than 0, not {timeout}")
    return timeout


# ---------------------------------------------------------------- running


def _start(argv: list[str], cwd: str, env: dict[str, str], feed_stdin: bool) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.PIPE if feed_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
    except OSError as exc:
        raise RunnerError(FS_ERROR, f"cannot run {argv[0]!r}: {exc.strerror or exc}",
                          {"path": argv[0]}) from exc
    except ValueError as exc:
        raise RunnerError(INVALID_PARAMS, f"cannot run {argv[0]!r}: {exc}") from exc


def _feed(pipe: IO[bytes], data: bytes) -> None:
    """Writes `data` to the command's stdin from a thread (so a command that does not read cannot
    block us), then closes it."""

    def write() -> None:
        with contextlib.suppress(OSError):
            pipe.write(data)
        with contextlib.suppress(OSError):
            pipe.close()

    threading.Thread(target=write, name="proc-stdin", daemon=True).start()


def _wait(process: subprocess.Popen[bytes], timeout: float | None) -> bool:
    """Waits for the command; on timeout kills its process group. True if it timed out."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        return True
    return False


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the command's whole process group, SIGKILL to what is left after KILL_GRACE_S."""
    group = process.pid  # start_new_session: the command leads its own group
    _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        if process.poll() is not None and not _group_exists(group):
            break
        time.sleep(0.02)
    else:
        _signal_group(group, signal.SIGKILL)
    process.wait()


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def _group_exists(group: int) -> bool:
    """True while the group has a live member. Zombies do not count: kill(2) still finds them, and a
    container's PID 1 may take its time to reap the orphans of a killed command."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not os.path.isdir("/proc/self"):  # no /proc: trust kill(2)
        return True
    return bool(procstat.members("pgrp", group))


HANDLERS = {PROC_RUN: proc_run}
