"""`fs.search` in a child process with a deadline, so that the daemon never blocks on a search.

Python's `re` holds the GIL for as long as one match takes, and a pattern that backtracks
catastrophically (`(a+)+$` on a line of 36 `a` and a `b`) takes minutes. Run in the daemon, such a
search would freeze every thread of it: the cells of every shell, `shell.list` and Stop. So the daemon
runs the whole tree walk in a child Python instead: the request goes in as JSON on the child's stdin,
the answer (or the error) comes back as JSON on its stdout, the daemon waits for it in select() (off
the GIL), reads at most a bounded amount, and kills and reaps the child when the deadline passes.
The child also arms a timer that kills it a little after the deadline, so it cannot outlive a daemon
that died. Results and errors are the very ones `fsops.fs_search` gives in-process.
Standard library only: this module is copied into the sandbox.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import IO, Any

from ...protocol import DEFAULT_MAX_FRAME_BYTES, FS_ERROR, INTERNAL_ERROR, INVALID_PARAMS, RunnerError
from ...protocol import messages as M
from ...protocol.methods import FS_SEARCH
from ..params import finite, handles
from . import ops as fsops

DEFAULT_TIMEOUT_S = 30.0  # a search gets as long as a cell without a %timeout gets
MAX_TIMEOUT_S = 24 * 3600.0
ANSWER_CAP_BYTES = DEFAULT_MAX_FRAME_BYTES  # a bigger answer could not travel as one frame anyway
STDERR_CAP_BYTES = 8 * 1024
SELF_KILL_GRACE_S = 5.0  # the child's own timer fires this long after the daemon's deadline

_READ_CHUNK = 64 * 1024
_WRITE_CHUNK = 64 * 1024
# The child is started with -S like the daemon; the stdlib comes first on its path (the folder holding
# the box package, a zipapp or a source tree, last) and the working folder ('') not at all, so no
# file in the user's folder can stand in for a module.
_BOOT = ("import sys\n"
         "sys.path = [p for p in sys.path if p] + [sys.argv[1]]\n"
         "from {package}.search import child_main\n"
         "sys.exit(child_main())\n")


# ---------------------------------------------------------------- the daemon's side


@handles(FS_SEARCH)
def fs_search_in_child(params: M.SearchParams, base: str) -> M.SearchResult:
    """`fs.search`, run in a child process that is killed after `timeout_s` (default 30 s)."""
    timeout = _timeout_param(params.get("timeout_s"))
    try:
        return run_in_child(FS_SEARCH, params, base, timeout)
    except _DeadlinePassed:
        raise RunnerError(
            FS_ERROR,
            f"the search took longer than {timeout:g} s and was stopped: the pattern may backtrack "
            f"catastrophically (nested repeats such as '(a+)+' on a long line), or there is too much to "
            f"search; simplify the pattern, or narrow the path or the file name glob",
            {"path": _root_for_message(params.get("path"), base), "timeout_s": timeout}) from None


def _timeout_param(timeout: float | None) -> float:
    """The deadline in seconds; a very long one is cut to MAX_TIMEOUT_S, which the timers can hold."""
    timeout = finite("timeout_s", timeout)
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if not timeout > 0:
        raise RunnerError(INVALID_PARAMS, f"param 'timeout_s' must be greater than 0, not {timeout}")
    return float(min(timeout, MAX_TIMEOUT_S))


def _root_for_message(path: str | None, base: str) -> str:
    return fsops.resolve_path(path or ".", base)


class _DeadlinePassed(Exception):
    """The child was still working when its time was up (it has been killed and reaped)."""


def run_in_child(method: str, params: Any, base: str, timeout: float) -> Any:
    """The result of `fsops.HANDLERS[method](params, base)` computed in a child process (which parses
    `params` as the method's shape again: a handler called with a dict does); its RunnerError is raised
    here. Raises _DeadlinePassed after `timeout` seconds; the child never outlives this call."""
    request = json.dumps({"method": method, "params": params, "base": base, "timeout_s": timeout},
                         ensure_ascii=True).encode("ascii")
    deadline = time.monotonic() + timeout
    try:
        child = subprocess.Popen(child_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, close_fds=True)
    except OSError as exc:
        raise RunnerError(INTERNAL_ERROR, f"cannot start the process for {method}: {exc.strerror or exc}") from exc
    try:
        out, err = _exchange(child, request, deadline, method)
        with contextlib.suppress(subprocess.TimeoutExpired):  # its pipes closed: it is on its way out
            child.wait(max(0.0, deadline - time.monotonic()) + 1.0)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()  # reaped: no zombie stays behind
        for pipe in (child.stdin, child.stdout, child.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
    return _decode_answer(out, err, child.returncode, method)


def child_argv() -> list[str]:
    """How to start this module as a child: the same Python, with the folder (or zipapp) that holds
    the box package, whether the daemon runs from the zipapp (`python3 -S runner.pyz serve`), as
    `python -m owsandbox.box` or from an installed `owsandbox` command."""
    package = __package__ or "owsandbox.box.files"
    root = os.path.abspath(__file__)
    for _ in range(len(package.split(".")) + 1):  # this file, then one folder per package level
        root = os.path.dirname(root)
    return [sys.executable or "python3", "-S", "-c", _BOOT.format(package=package), root]


def _exchange(child: subprocess.Popen[bytes], request: bytes, deadline: float, method: str) -> tuple[bytes, bytes]:
    """Feeds `request` to the child and reads its stdout (up to ANSWER_CAP_BYTES) and stderr (up to
    STDERR_CAP_BYTES) until both close, waiting in select() so that no lock is held meanwhile."""
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    out = bytearray()
    err = bytearray()
    pending = memoryview(request)
    os.set_blocking(child.stdin.fileno(), False)
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdin, selectors.EVENT_WRITE)
        selector.register(child.stdout, selectors.EVENT_READ)
        selector.register(child.stderr, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _DeadlinePassed
            for key, _events in selector.select(remaining):
                pipe: IO[bytes] = key.fileobj  # type: ignore[assignment]
                if pipe is child.stdin:
                    pending = _write_some(selector, pipe, pending)
                    continue
                chunk = os.read(pipe.fileno(), _READ_CHUNK)
                if not chunk:
                    selector.unregister(pipe)
                elif pipe is child.stdout:
                    out += chunk
                    if len(out) > ANSWER_CAP_BYTES:
                        raise RunnerError(FS_ERROR, f"the answer to {method} is larger than "
                                                    f"{ANSWER_CAP_BYTES // (1024 * 1024)} MiB; ask for fewer "
                                                    f"matches (max_matches) or narrow the path")
                else:
                    err += chunk[:max(0, STDERR_CAP_BYTES - len(err))]
    return bytes(out), bytes(err)


def _write_some(selector: selectors.BaseSelector, pipe: IO[bytes], pending: memoryview) -> memoryview:
    """Writes what the pipe takes now; closes it once all is written or the child stopped reading."""
    try:
        pending = pending[os.write(pipe.fileno(), pending[:_WRITE_CHUNK]):]
    except BlockingIOError:
        return pending
    except OSError:  # the child is gone: what it said on stdout/stderr tells why
        pending = pending[:0]
    if not pending:
        selector.unregister(pipe)
        with contextlib.suppress(OSError):
            pipe.close()
    return pending


def _decode_answer(out: bytes, err: bytes, status: int | None, method: str) -> Any:
    try:
        answer = json.loads(out.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        answer = None
    if isinstance(answer, dict) and "result" in answer:
        return answer["result"]
    failure = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(failure, dict) and isinstance(failure.get("code"), int) and isinstance(failure.get("message"), str):
        raise RunnerError(failure["code"], failure["message"], failure.get("data"))
    how = f"was killed by signal {-status}" if status is not None and status < 0 else f"exited with status {status}"
    said = err.decode("utf-8", errors="replace").strip()
    raise RunnerError(INTERNAL_ERROR, f"the process for {method} {how} without an answer"
                                      + (f": {said[-2000:]}" if said else ""))


# ---------------------------------------------------------------- the child's side


def child_main() -> int:
    """Reads one request on stdin, runs it, writes `{"result": ...}` or `{"error": {...}}` on stdout."""
    request = json.loads(sys.stdin.buffer.read().decode("ascii"))
    timeout = float(request["timeout_s"])
    # SIGALRM's default action ends the process, even in the middle of a match and without this
    # process's help: it cannot outlive a daemon that died before killing it.
    signal.setitimer(signal.ITIMER_REAL, timeout + SELF_KILL_GRACE_S)
    try:
        answer: dict[str, Any] = {"result": fsops.HANDLERS[request["method"]](request["params"], request["base"])}
    except RunnerError as exc:
        answer = {"error": exc.to_json()}
    except Exception as exc:  # noqa: BLE001 - answered as the daemon answers any handler's failure
        answer = {"error": {"code": INTERNAL_ERROR, "message": f"{type(exc).__name__}: {exc}"}}
    sys.stdout.buffer.write(json.dumps(answer, ensure_ascii=True, separators=(",", ":")).encode("ascii"))
    sys.stdout.buffer.flush()
    return 0


HANDLERS = {FS_SEARCH: fs_search_in_child}
