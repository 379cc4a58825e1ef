"""The daemon's methods: which handler answers each, with its params checked, and how it is answered.

Control requests (hello, resume, interrupt, list) are answered at once on the connection's thread,
straight to that connection and never kept, so Stop never waits behind work. Work requests run on
threads of their own (at most `MAX_WORKERS` at once) and every answer goes through the records: it
gets a `seq`, is kept until acknowledged and is replayed on `session.resume`; a request id seen twice
runs once. A `shell.run` on a shell that is already up starts without a thread hop. Notifications
(`session.ack`, `$/ping`) are never answered.

A Stop is never lost: a `shell.run` is tracked from the moment its request is read, so a
`shell.interrupt` that comes while the run still waits for its shell (a new bash starting, a thread
to run on) marks it, and the run is then answered as interrupted without being given to bash.

The modules of the file, process and usage methods and of completion are imported at their method's
first request (`HANDLED_IN`): a box that only runs cells, as most do for most of their life, never
holds them (they and what they import were about half a MiB of an idle daemon's memory).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from .. import protocol as P
from ..protocol import messages as M
from ..protocol.methods import (
    BOX_USAGE,
    FS_LIST,
    FS_MKDIR,
    FS_READ,
    FS_REMOVE,
    FS_SEARCH,
    FS_STAT,
    FS_WRITE,
    HELLO,
    PROC_RUN,
    SESSION_ACK,
    SESSION_RESUME,
    SHELL_CLOSE,
    SHELL_COMPLETE,
    SHELL_INPUT,
    SHELL_INSPECT,
    SHELL_INTERRUPT,
    SHELL_LIST,
    SHELL_RUN,
)
from ..protocol.shapes import ShapeError, parse
from .log import getLogger
from .outbox import ANSWERED, NEW, Records
from .params import Handler, at_least, finite, parsed
from .server import Connection
from .shell.bash import Command, Shell
from .shell.registry import ShellRegistry
from .shell.terminal import DEFAULT_COLS, DEFAULT_ROWS

log = getLogger(__name__)

MAX_WORKERS = 64
DEFERRED = object()  # a work handler's value when the answer comes later (a shell's command, when done)

#: The module (of this package) whose `HANDLERS` answers each file, process and usage method. fs.search
#: is `files.search`'s, not `files.ops'`: a regex can hold the GIL for minutes, so it runs in a child.
HANDLED_IN = {FS_READ: "files.ops", FS_WRITE: "files.ops", FS_STAT: "files.ops", FS_LIST: "files.ops",
              FS_MKDIR: "files.ops", FS_REMOVE: "files.ops", FS_SEARCH: "files.search", PROC_RUN: "procs",
              BOX_USAGE: "usage"}

ControlHandler = Callable[[Connection, dict[str, Any]], Any]
WorkHandler = Callable[[Any, dict[str, Any]], Any]
NOT_STARTED_ERROR = "interrupted by user before it started: nothing ran"


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


class _Run:
    """A `shell.run` read and not yet answered: its shell's name, and once given to the shell, the
    shell and its command; or, when a Stop came first, `stopped`. Its lock orders the two: a run is
    given to its shell under it, and a Stop marks or stops it under it."""

    __slots__ = ("shell_name", "lock", "shell", "command", "stopped")

    def __init__(self, shell_name: str) -> None:
        self.shell_name = shell_name
        self.lock = threading.Lock()
        self.shell: Shell | None = None
        self.command: Command | None = None
        self.stopped = False


class Dispatcher:
    """`handle(conn, message)` for each message the socket server reads.

    `describe()` gives the daemon's facts for `runner.hello`; `send_live` sends to the current client
    (shell output, and the answers to work)."""

    def __init__(self, records: Records, shells: ShellRegistry, send_live: Callable[[bytes], None],
                 describe: Callable[[], dict[str, Any]], instance_id: str) -> None:
        self.records = records
        self.shells = shells
        self._send_live = send_live
        self._describe = describe
        self.instance_id = instance_id
        self._workers = threading.BoundedSemaphore(MAX_WORKERS)
        self._runs: dict[Any, _Run] = {}  # shell.run requests not yet answered, by request id
        self._runs_lock = threading.Lock()
        self._control: dict[str, ControlHandler] = {
            HELLO: lambda _conn, p: self._hello(p),
            SESSION_RESUME: self._resume,
            SHELL_INTERRUPT: lambda _conn, p: self._shell_interrupt(p),
            SHELL_LIST: lambda _conn, _p: M.ListShellsResult(shells=self.shells.describe()),
        }
        self._work: dict[str, WorkHandler] = {method: self._in_folder(method) for method in HANDLED_IN}
        self._work.update({
            SHELL_RUN: self._shell_run,
            SHELL_CLOSE: lambda _id, p: self._shell_close(p),
            SHELL_INPUT: lambda _id, p: self._shell_input(p),
            SHELL_COMPLETE: lambda _id, p: self._shell_complete(p, "shell_complete"),
            SHELL_INSPECT: lambda _id, p: self._shell_complete(p, "shell_inspect"),
        })

    # -- routing ----------------------------------------------------------------------------

    def handle(self, conn: Connection, message: dict[str, Any]) -> None:
        """Called by the connection's reader for each message. What goes wrong in one request is that
        request's error, and the reader lives on: one that died would leave the client waiting on an
        open connection for ever."""
        try:
            self._route(conn, message)
        except Exception as exc:  # noqa: BLE001 - the daemon keeps serving
            request_id = message.get("id")
            log.exception("request %s (%s) failed", request_id, message.get("method"))
            if request_id is None:
                return
            error = P.error(request_id, P.INTERNAL_ERROR, f"the sandbox's daemon failed on this request: "
                                                          f"{type(exc).__name__}: {exc}")
            state, frame = self.records.answer_unanswered(request_id, error)
            self._forget_run(request_id)
            if frame is not None:
                self._send_live(frame)
            elif state is None:  # not work (a control request): answered where it came from
                conn.send(P.encode(error))

    def _route(self, conn: Connection, message: dict[str, Any]) -> None:
        method = message.get("method")
        request_id = message.get("id")
        raw_params = message.get("params", {})
        if not isinstance(method, str):
            if "result" not in message and "error" not in message:
                conn.send(P.encode(P.error(request_id, P.INVALID_REQUEST, "a request needs a 'method' string")))
            return
        if not isinstance(raw_params, dict):
            if request_id is not None:
                conn.send(P.encode(P.error(request_id, P.INVALID_PARAMS, "'params' must be an object")))
            return
        if request_id is None:
            self._notification(method, raw_params)
            return
        control = self._control.get(method)
        if control is not None:
            self._answer_now(conn, request_id, control, raw_params)
            return
        state, replay = self.records.begin(request_id)
        if state == ANSWERED:
            if replay is None:  # answered, but the answer is no longer kept: say so, run nothing
                replay = P.encode(P.error(request_id, P.UNKNOWN_TASK,
                                          f"request '{request_id}' already ran and its answer is no longer kept; "
                                          "its outcome is unknown"))
            conn.send(replay)
            return
        if state != NEW:
            return  # running already: its answer comes when it is done
        handler = self._work.get(method)
        if handler is None:
            self._answer(request_id, err=P.RunnerError(P.METHOD_NOT_FOUND, f"unknown method '{method}'"))
            return
        if method == SHELL_RUN:
            self._track_run(request_id, raw_params)
            if self._try_run_inline(request_id, raw_params):
                return
        try:
            threading.Thread(target=self._run_handler, args=(request_id, handler, raw_params), daemon=True).start()
        except RuntimeError as exc:  # the connection's reader must live on, and the request be answered
            log.error("request %s: no thread to run it: %s", request_id, exc)
            self._answer(request_id, err=P.RunnerError(
                P.INTERNAL_ERROR, f"the sandbox's daemon could not start a thread for this request ({exc}): its "
                "memory limit leaves it no room; restart the kernel with a larger one"))

    def _notification(self, method: str, raw_params: dict[str, Any]) -> None:
        if method == SESSION_ACK:
            try:
                self.records.ack(parse(M.AckParams, raw_params)["seq"])
            except ShapeError as exc:  # a notification is never answered: nothing to tell
                log.warning("session.ack ignored: %s", exc)
        # A ping (`methods.PING`) and unknown notifications need nothing: a ping only keeps the relay awake.

    def _answer_now(self, conn: Connection, request_id: Any, handler: ControlHandler,
                    raw_params: dict[str, Any]) -> None:
        try:
            conn.send(P.encode(P.result(request_id, handler(conn, raw_params))))
        except P.RunnerError as err:
            conn.send(P.encode(P.error(request_id, err.code, err.message, err.data)))
        except Exception as exc:  # noqa: BLE001
            log.exception("request %s failed", request_id)
            conn.send(P.encode(P.error(request_id, P.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")))

    def _run_handler(self, request_id: Any, handler: WorkHandler, raw_params: dict[str, Any]) -> None:
        with self._workers:
            try:
                value = handler(request_id, raw_params)
            except P.RunnerError as err:
                self._answer(request_id, err=err)
            except Exception as exc:  # noqa: BLE001 - the daemon keeps serving
                log.exception("request %s failed", request_id)
                self._answer(request_id, err=P.RunnerError(P.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"))
            else:
                if value is not DEFERRED:
                    self._answer(request_id, value)

    def _answer(self, request_id: Any, value: Any = None, err: P.RunnerError | None = None) -> None:
        """The answer to work: kept in the records, then sent to whoever is connected now."""
        message = P.error(request_id, err.code, err.message, err.data) if err else P.result(request_id, value)
        frame = self.records.answer(request_id, message)
        self._forget_run(request_id)  # after the records: a Stop that finds neither is told "ended" by them
        self._send_live(frame)

    def _in_folder(self, method: str) -> WorkHandler:
        """A file or process method's handler: its params parsed as its method's shape, then it runs given
        the folder its relative paths start from."""

        def run(_id: Any, raw: dict[str, Any]) -> Any:
            handler = handler_of(method)
            p: M.FolderParams = parsed(handler.shape, raw)
            return handler.typed(p, self._base_folder(p))

        return run

    # -- control ----------------------------------------------------------------------------

    def _hello(self, raw: dict[str, Any]) -> dict[str, Any]:
        version = parsed(M.HelloParams, raw)["protocol_version"]
        if version != P.PROTOCOL_VERSION:
            raise P.RunnerError(P.VERSION_MISMATCH,
                                f"this runner speaks protocol version {P.PROTOCOL_VERSION}, the client {version}")
        return self._describe()

    def _resume(self, conn: Connection, raw: dict[str, Any]) -> M.ResumeResult:
        frames, gap = self.records.replay(parsed(M.ResumeParams, raw)["last_seq"])
        for frame in frames:
            conn.send(frame)
        return M.ResumeResult(instance_id=self.instance_id, replayed=len(frames), gap=gap)

    def _shell_interrupt(self, raw: dict[str, Any]) -> M.InterruptResult:
        """Stop the `shell.run` with request id `id` on `shell`, or without `id` the one running there
        (else the latest waiting to start). The answer says what happened: `state` "running" (it is
        being stopped: SIGINT, then escalation), "not started" (it never runs; its own answer says
        so), "ended" (it had ended already), "unknown" (no such request), "idle" (no `id`, nothing
        running or waiting on the shell); `interrupted` is true for the first two."""
        p = parsed(M.InterruptParams, raw)
        name = _given(p.get("shell"), "main")
        request_id = p.get("id")
        with self._runs_lock:
            if request_id is not None:
                found = self._runs.get(_run_key(request_id))
                runs = [found] if found is not None else []
            else:
                runs = [run for run in self._runs.values() if run.shell_name == name]
        if request_id is not None and not runs:
            state = "ended" if self.records.state(request_id) == ANSWERED else "unknown"
            return M.InterruptResult(shell=name, interrupted=False, state=state)
        if not runs:
            self.shells.named(name)  # UNKNOWN_SHELL for a shell that is not up
            return M.InterruptResult(shell=name, interrupted=False, state="idle")
        run = next((run for run in runs if run.command is not None), runs[-1])
        with run.lock:
            shell, command = run.shell, run.command
            if command is None:
                run.stopped = True
                return M.InterruptResult(shell=name, interrupted=True, state="not started")
        assert shell is not None
        if shell.interrupt(command):
            return M.InterruptResult(shell=name, interrupted=True, state="running")
        return M.InterruptResult(shell=name, interrupted=False, state="ended")

    def _track_run(self, request_id: Any, p: dict[str, Any]) -> None:
        name = p.get("shell", "main")
        key = _run_key(request_id)
        if isinstance(name, str) and key is not None:
            with self._runs_lock:
                self._runs[key] = _Run(name)

    def _forget_run(self, request_id: Any) -> None:
        key = _run_key(request_id)
        if key is not None:
            with self._runs_lock:
                self._runs.pop(key, None)

    # -- work -------------------------------------------------------------------------------

    def _base_folder(self, p: M.FolderParams) -> str:
        """The folder of the shell named in `p` (its last one, if it has exited), else the daemon's."""
        name = p.get("shell")
        if name is None:
            return self.shells.cwd
        folder = self.shells.folder(name)
        if folder is None:
            raise P.RunnerError(P.UNKNOWN_SHELL, f"no shell named '{name}'")
        return folder

    @staticmethod
    def _run_params(raw: dict[str, Any]) -> tuple[str, str, str | None, dict[str, Any]]:
        p = parsed(M.RunParams, raw)
        options = {"timeout_s": at_least("timeout_s", finite("timeout_s", p.get("timeout_s")), 0),
                   "output_limit": p.get("output_limit"),
                   "terminal": _given(p.get("terminal"), False),
                   "stdin": _given(p.get("stdin"), False),
                   "cols": _given(p.get("cols"), DEFAULT_COLS), "rows": _given(p.get("rows"), DEFAULT_ROWS),
                   "merge": p.get("stderr") == "merge"}
        for size in ("cols", "rows"):
            if not 2 <= options[size] <= 1000:
                raise P.RunnerError(P.INVALID_PARAMS, f"param '{size}' must be between 2 and 1000")
        if options["output_limit"] is not None and options["output_limit"] < 2:
            raise P.RunnerError(P.INVALID_PARAMS, "param 'output_limit' must be at least 2")
        return _given(p.get("shell"), "main"), p["command"], p.get("cwd"), options

    def _try_run_inline(self, request_id: Any, p: dict[str, Any]) -> bool:
        """Start a command on a shell that is already up without a thread hop; False to go the long way."""
        try:
            name, command, _cwd, options = self._run_params(p)
        except P.RunnerError as err:
            self._answer(request_id, err=err)
            return True
        shell = self.shells.running(name)
        if shell is None:
            return False
        try:
            self._start(request_id, shell, command, options)
        except P.RunnerError as err:
            if err.code == P.SHELL_EXITED:
                return False  # it ended just now, nothing given to it: the long way starts a new one
            self._answer(request_id, err=err)
        return True

    def _shell_run(self, request_id: Any, p: dict[str, Any]) -> object:
        name, command, cwd, options = self._run_params(p)
        self._start(request_id, self.shells.start(name, cwd), command, options)  # its RunnerError is the answer
        return DEFERRED

    def _start(self, request_id: Any, shell: Shell, command: str, options: dict[str, Any]) -> None:
        """Give `shell` the request's command, its live frames and its answer sent as they come; raises
        RunnerError when the shell cannot take it (busy, or gone)."""
        name = shell.name

        def on_live(method: str, fields: dict[str, Any]) -> None:
            """A live frame of the shell's, of the kind `method` names (`messages.LIVE_SHAPES`), for this request."""
            self._send_live(P.encode(P.notification(method, {"id": request_id, "shell": name, **fields})))

        def on_done(result: M.RunResult) -> None:
            self._answer(request_id, result)

        key = _run_key(request_id)
        with self._runs_lock:
            run = self._runs.get(key) if key is not None else None
        if run is None:
            shell.run(command, on_done, on_live, **options)
            return
        with run.lock:
            if run.stopped:
                on_done(shell.not_run(command, NOT_STARTED_ERROR))
                return
            run.command = shell.run(command, on_done, on_live, **options)
            run.shell = shell

    def _shell_input(self, raw: dict[str, Any]) -> M.InputResult:
        p = parsed(M.InputParams, raw)
        name = _given(p.get("shell"), "main")
        text = None if p.get("eof") else p.get("text")
        if text is None and not p.get("eof"):
            raise P.RunnerError(P.INVALID_PARAMS, "missing param 'text'")
        self.shells.named(name).write_input(text)
        return M.InputResult(shell=name, written=True)

    def _shell_close(self, raw: dict[str, Any]) -> M.CloseResult:
        name = parsed(M.ShellParams, raw)["shell"]
        self.shells.close(name)
        return M.CloseResult(shell=name, closed=True)

    def _shell_complete(self, p: dict[str, Any], which: str) -> Any:
        """Completion or inspection (`which`: complete.py's function) for a shell, by a fresh bash in its
        folder, with the functions and aliases the shell writes if it is idle; a shell not started yet
        has the defaults."""
        from .shell import complete

        answer: Callable[[dict[str, Any], str, Callable[[], str | None]], Any] = getattr(complete, which)
        name = _given(parsed(M.ShellNameParams, p).get("shell"), "main")
        shell = self.shells.running(name)
        cwd = self.shells.folder(name) or self.shells.cwd

        def definitions() -> str | None:
            if shell is None:
                return None
            shell.write_definitions()
            return shell.definitions_path

        return answer(p, cwd, definitions)


def handler_of(method: str) -> Handler:
    """The handler of a file, process or usage method, its module imported if it was not yet."""
    module = importlib.import_module(f"{__package__}.{HANDLED_IN[method]}")
    handler: Handler = module.HANDLERS[method]
    return handler


def _run_key(request_id: Any) -> Any:
    """A request id as a key of the runs (as the ledger keys it: 1 and "1" differ); None for one
    that cannot be a key."""
    return (type(request_id).__name__, request_id) if isinstance(request_id, (str, int)) else None
