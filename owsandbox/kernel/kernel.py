"""The owsandbox kernel: every cell runs as shell commands on a named, persistent bash in a sandbox.

A cell becomes `shell.run` on the current shell (default `main`), on a terminal unless `%terminal off`.
Its live output arrives on the runner's pump thread and is shown as `stream` messages, stdout and
stderr apart and in the order written, batched for a few milliseconds; the record fills in whatever
the live view missed. A command that waits for input (`shell.input_wanted`) is answered through
Jupyter's stdin channel when the client allows it (`stdin.py`), and gets end-of-input otherwise.
Stop (an `interrupt_request`, or SIGINT from a client that signals) becomes `shell.interrupt`: the
command ends (and its open prompt with it), the shell and its variables stay; a Stop that comes
before the cell's command has started ends it all the same (`stops.py`). A non-zero exit status
is an error reply with exactly one `error` output, so a notebook run stops at a failing cell (the
errors, by name, are in `errors.py`). Magics live in `magics/`, found through the kernel's table
(`magics/table.py`); a cell magic below the first line is refused (`magics/placement.py`); output handling
is in `cell/` (records to outputs in `cell/output.py`, terminal text in `cell/terminal_text.py`); the bash
completeness check and tab completion in `editing/`. Every output leaves through `cell/outbox.py`: the
box's text filtered for a terminal (`display/box_text.py`) and counted against the cell's output limit
(`cell/budget.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ipykernel._version import kernel_protocol_version
from ipykernel.kernelbase import Kernel

from .. import __version__
from .. import protocol as P
from ..host.api import SandboxAPI
from ..protocol import messages as M
from ..terminal.locate import kernel_key
from .cell.budget import Withheld
from .cell.hints import network_hint
from .cell.limit_names import named_limit
from .cell.outbox import Outbox
from .cell.output import DEFAULT_OUTPUT_LIMIT, CellOutput, Display, InputWanted, Notice, Stream
from .cell.pacing import pacer_from_env
from .cell.run import cell_run
from .display import box_text
from .display.rich import BoxDisplayIds
from .editing.stdin import CellPrompts, StdinChannel
from .errors import CellError, UsageError
from .history import CellHistory
from .magics.framework import ParsedCell, RunOnShell, parse_cell
from .magics.shells import terminal_settings
from .sandbox import Sandbox, SandboxUnavailable
from .stops import CellStops
from .teaching.recording import Recorder, session_stem
from .usage import UsageMeter, cell_usage

if TYPE_CHECKING:  # imported where first used: a kernel's start does not wait for them (benchmarks/kernel_start.py)
    from .attach.session import AttachManager
    from .editing.completion import CompletionContext
    from .magics.preview import PreviewBox
    from .magics.table import MagicTable

log = logging.getLogger(__name__)

_LEAVE = re.compile(r"\s*(exit|logout)(\s+0)?\s*;?\s*\Z")  # a cell that only leaves the shell
BATCH_SECONDS = 0.03  # live output is gathered this long before it goes out as one message
ERROR_CHARS = 10_000  # of an error's message (it may quote the box); the cell's one error is never withheld
MAX_MATCHES, MATCH_CHARS = 1000, 4096  # of a completion reply (the box's words): more is no help at a cursor
INSPECT_CHARS = 100_000  # of an inspection reply (the box's help text)
RED, RESET = "\x1b[31m", "\x1b[0m"


class OwSandboxKernel(Kernel):
    implementation = "owsandbox"
    implementation_version = __version__
    language = "bash"
    language_version = "5"
    language_info = {
        "name": "bash",
        "mimetype": "text/x-sh",
        "file_extension": ".sh",
        "codemirror_mode": "shell",
        "pygments_lexer": "bash",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sandbox = Sandbox(key=self._kernel_key())  # reads the settings: an invalid one is said to every cell
        self.sandbox.start_in_background()
        self._configured = configured = self.sandbox.settings
        pacer = pacer_from_env(configured)  # one for the kernel, subshells included (%output rate)
        self.settings: dict[str, Any] = {"shell": "main", "timeout": None, "output_limit": DEFAULT_OUTPUT_LIMIT,
                                         "pacer": pacer}
        self.outbox = Outbox(lambda *message: self._send_raw(*message), lambda: self.settings["output_limit"], pacer)
        self.recorder = Recorder(lambda: self.sandbox.host_cwd, self._terminal_size, session_stem(),
                                 settings=configured)  # %record
        self.outbox.watch(self.recorder.saw)
        self._magics: MagicTable | None = None  # built when a cell first needs it (`magics`)
        self._made_lock = threading.Lock()
        self._stops = {"": CellStops()}  # what a Stop ends, per lane: the main shell's cells, and each subshell's
        self._stops_lock = threading.Lock()
        self._displays = BoxDisplayIds()  # the ids `owdisplay --id` gave, in a namespace of their own
        self.history = CellHistory()
        self._attach: AttachManager | None = None  # made by the first %attach or completion (`attach`)
        self._said_where = False
        self.stdin = StdinChannel(self.session, lambda: self.stdin_socket, self.log)
        self._subshells: dict[str, dict[str, Any]] = {}  # kernel subshell id → its settings, its own shell's name
        self._subshells_made = 0
        self._subshells_lock = threading.Lock()
        self._usage = UsageMeter()
        self._usage_lock = threading.Lock()
        self._cell_usage: dict[str, dict[str, Any]] = {}  # a running cell's msg_id -> what its command used

    # -- made when first needed ------------------------------------------------------------------

    @property
    def magics(self) -> MagicTable:
        """Every magic the kernel knows (magics/table.py), built when a cell or a completion first asks:
        their modules are imported then, not while the kernel starts."""
        with self._made_lock:
            if self._magics is None:
                from .magics.table import all_magics

                self._magics = all_magics()
            return self._magics

    @property
    def attach(self) -> AttachManager:
        """The programs `%attach` runs (attach/session.py), made when first asked for."""
        with self._made_lock:
            if self._attach is None:
                from .attach.session import AttachManager

                self._attach = AttachManager(self._attach_display, self._runner_call, self._execd_endpoint,
                                             self._attach_registry, self._configured)
            return self._attach

    # -- usage (JupyterLab's Kernel Usage panel) ------------------------------------------------

    async def usage_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Answered with the sandbox's figures (usage.py), not the kernel process's; before the sandbox
        runs, or if it cannot say, with ipykernel's own answer."""
        try:
            reply = await asyncio.get_running_loop().run_in_executor(None, self._usage_reply)
        except (SandboxUnavailable, P.RunnerError, TimeoutError) as exc:
            log.debug("usage_request: the sandbox's figures are not to be had: %s", exc)
            await super().usage_request(stream, ident, parent)
            return
        self.session.send(stream, "usage_reply", reply, parent, ident)

    def _count_usage(self, parent: dict[str, Any], said: Any) -> None:
        """Keeps what a cell's command used for its execute_reply's metadata (`finish_metadata`); a cell
        that runs more than one command (a `%%shell` cell after line magics) has the highest peak and the
        sum of their CPU seconds."""
        figures = cell_usage(said)
        msg_id = parent.get("header", {}).get("msg_id")
        if figures is None or not msg_id:
            return
        before = self._cell_usage.get(msg_id)
        if before is not None:
            cpu = (None if before["cpu_seconds"] is None or figures["cpu_seconds"] is None
                   else round(before["cpu_seconds"] + figures["cpu_seconds"], 3))
            figures = {"peak_memory_bytes": max(before["peak_memory_bytes"], figures["peak_memory_bytes"]),
                       "cpu_seconds": cpu}
        self._cell_usage[msg_id] = figures

    def finish_metadata(self, parent: dict[str, Any], metadata: dict[str, Any],
                        reply_content: dict[str, Any]) -> dict[str, Any]:
        """The execute_reply's metadata: `owsandbox.usage` holds what the cell's command used in the box
        (`peak_memory_bytes`, `cpu_seconds`; README "Execute reply metadata"); a cell that ran no command
        in the box (a magic alone, or one refused) has none."""
        metadata = super().finish_metadata(parent, metadata, reply_content)
        figures = self._cell_usage.pop(parent.get("header", {}).get("msg_id"), None)
        if figures is not None:
            metadata.setdefault("owsandbox", {})["usage"] = figures
        return metadata

    def _usage_reply(self) -> dict[str, Any]:
        if not self.sandbox.ready:
            raise SandboxUnavailable("the sandbox is not running yet")
        provider = self.sandbox.wait(0).provider
        limits = getattr(provider, "limits", None)
        with self._usage_lock:
            return self._usage.reply(self.box.usage(), time.monotonic(), provider.name,
                                     getattr(limits, "memory", None), getattr(limits, "cpu", None))

    # -- kernel subshells (ipykernel 7, JEP 91) --------------------------------------------------

    def settings_for(self, parent: dict[str, Any] | None) -> dict[str, Any]:
        """The settings a request of `parent` runs with: the kernel's, or, from a kernel subshell, that
        subshell's own, whose cells run on a named shell of its own (`subshell-N`, its own folder and
        variables) at the same time as the main shell's. ipykernel runs each subshell's requests on a
        thread of its own; the shells, files, limits and network of the sandbox are shared."""
        subshell = str(((parent or {}).get("header") or {}).get("subshell_id") or "")
        if not subshell:
            return self.settings
        with self._subshells_lock:
            found = self._subshells.get(subshell)
            if found is None:
                self._subshells_made += 1
                found = self._subshells[subshell] = {**self.settings, "shell": f"subshell-{self._subshells_made}",
                                                     "subshell_id": subshell}
            return found

    def _lane(self, subshell: str) -> CellStops:
        with self._stops_lock:
            return self._stops.setdefault(subshell, CellStops())

    def stops_for(self, parent: dict[str, Any] | None) -> CellStops:
        """What a Stop ends for the cells of `parent`'s lane: the main shell's, or its kernel subshell's."""
        return self._lane(str(((parent or {}).get("header") or {}).get("subshell_id") or ""))

    def subshell_shells(self) -> dict[str, str]:
        """The named shell of each kernel subshell that has run a request, by shell name → subshell id."""
        with self._subshells_lock:
            return {settings["shell"]: subshell for subshell, settings in self._subshells.items()}

    async def delete_subshell_request(self, socket: Any, ident: Any, parent: dict[str, Any]) -> None:
        """The subshell goes (ipykernel), and so does its shell in the sandbox, with what runs on it."""
        subshell = str(parent.get("content", {}).get("subshell_id") or "")
        await super().delete_subshell_request(socket, ident, parent)
        with self._subshells_lock:
            settings = self._subshells.pop(subshell, None)
        if subshell:
            with self._stops_lock:
                self._stops.pop(subshell, None)
        if settings is not None and self.sandbox.ready:
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.box.close_shell, settings["shell"])
            except (P.RunnerError, TimeoutError, SandboxUnavailable) as exc:
                log.warning("could not close shell %s of a deleted subshell: %s", settings["shell"], exc)

    def _kernel_key(self) -> str | None:
        """The kernel's id, which every client keeps across a restart: from its connection file
        (`kernel-<id>.json`, a gateway's `kernel-<id>_<random>.json`, or a digest of its path for
        jupyter_client's temporary `tmpXXXX.json`); KERNEL_ID only for a kernel without one."""
        connection_file = getattr(self.parent, "connection_file", "") or ""
        if not connection_file and not os.environ.get("KERNEL_ID"):
            return None
        return kernel_key(connection_file)  # as `owsandbox shell` finds it

    # -- what %attach needs -----------------------------------------------------------------

    def _attach_display(self, parent: dict[str, Any], data: dict[str, Any], display_id: str, update: bool) -> None:
        self._send(parent, "update_display_data" if update else "display_data",
                   {"data": data, "metadata": {}, "transient": {"display_id": display_id}},
                   Withheld("the live view of an attached program", "%records prints its records"),
                   frame_of=display_id)

    def _runner_call(self, method: str, params: dict[str, Any], timeout: float = 30.0) -> Any:
        return self.sandbox.client.call(method, params, timeout=timeout)

    @property
    def box(self) -> SandboxAPI:
        """The current sandbox's calls (a restart of the box changes the client underneath)."""
        return SandboxAPI(self._runner_call)

    def _execd_endpoint(self) -> Any:
        workspace = self.sandbox.wait()
        hello = workspace.client.hello
        if not hello.get("execd"):
            raise UsageError("this sandbox's runner has no execd endpoint; use --url")
        return workspace.provider.execd_endpoint(hello)

    def _attach_registry(self) -> str:
        return self.sandbox.client.hello["attach_registry"]

    # -- kernel_info ------------------------------------------------------------------------

    @property
    def banner(self) -> str:  # type: ignore[override]
        return (f"owsandbox {__version__}: bash in a sandbox (provider {self.sandbox.provider_name}; "
                f"{self.sandbox.isolation_note()}).\n"
                "Cells run on persistent shells; %magics lists the magics.")

    @property
    def kernel_info(self) -> dict[str, Any]:
        """The base class's fields, made here: its own property imports ipykernel.debugger to offer a
        debugger wherever debugpy is installed, and that import costs about a second of CPU and prints
        debugpy's "frozen modules" warning on the kernel's stderr (`jupyter console`, `jupyter execute`).
        This kernel has no debugger, so it never imports debugpy."""
        return {"protocol_version": kernel_protocol_version, "implementation": self.implementation,
                "implementation_version": self.implementation_version, "language_info": self.language_info,
                "banner": self.banner, "help_links": self.help_links,
                "supported_features": ["kernel subshells"] if self._supports_kernel_subshells else []}

    # -- sending ----------------------------------------------------------------------------

    def _send(self, parent: dict[str, Any], msg_type: str, content: dict[str, Any], withheld: Withheld | None = None,
              frame_of: str | None = None, counted: bool = False) -> None:
        """Send on iopub with an explicit parent, safe from any thread, through the outbox (outbox.py):
        box text filtered, and counted against the cell's output limit."""
        self.outbox.send(parent, msg_type, content, withheld, frame_of, counted)

    def _send_raw(self, parent: dict[str, Any], msg_type: str, content: dict[str, Any]) -> None:
        """The wire, for the outbox alone: nothing else may skip its checks."""
        self.session.send(self.iopub_socket, msg_type, content, parent=parent, ident=self._topic(msg_type))

    def _stream(self, parent: dict[str, Any], text: str, name: str = "stdout", withheld: Withheld | None = None,
                counted: bool = False) -> None:
        if text:
            self._send(parent, "stream", {"name": name, "text": text}, withheld, counted=counted)

    def _note(self, parent: dict[str, Any], text: str, counted: bool = False) -> None:
        """A note of the kernel's own (see notes.py): plain and dimmed, not on stderr."""
        self.outbox.note(parent, text, counted)

    def _error_reply(self, parent: dict[str, Any], ename: str, evalue: str) -> dict[str, Any]:
        if len(evalue) > ERROR_CHARS:
            evalue = evalue[:ERROR_CHARS] + f"… ({len(evalue) - ERROR_CHARS} more characters)"
        traceback = [f"{RED}{ename}{RESET}: {evalue}"]
        self._send(parent, "error", {"ename": ename, "evalue": evalue, "traceback": traceback})
        return {"status": "error", "execution_count": self.execution_count, "ename": ename, "evalue": evalue,
                "traceback": traceback}

    # -- execute ----------------------------------------------------------------------------

    async def do_execute(self, code: str, silent: bool, store_history: bool = True,
                         user_expressions: dict[str, Any] | None = None, allow_stdin: bool = False) -> dict[str, Any]:
        parent = self.get_parent("shell")
        reply: dict[str, Any] | None = None
        said = self.recorder.cell_note()  # a course's recording starting (OWSANDBOX_RECORD), or one that ended
        if said:
            self._note(parent, said)
        if not silent:  # a client's own silent requests are not the session's cells
            self.recorder.cell_started(parent, self.execution_count, code)
        self.stops_for(parent).cell_began(_sent_at(parent))
        try:
            reply = await self._execute(parent, code, store_history, allow_stdin)
        finally:
            self.stops_for(parent).cell_ended()
            await self._after_cell(parent)
            self.outbox.end_cell(parent)
            self.recorder.cell_ended(parent, reply)
        return box_text.clean("execute_reply", reply)

    async def _after_cell(self, parent: dict[str, Any]) -> None:
        """What the host does once a cell has ended (box-made git settings moved aside): said in one note."""
        if not self.sandbox.ready:
            return
        provider = self.sandbox.wait(0).provider
        try:
            said = await asyncio.get_running_loop().run_in_executor(None, provider.after_cell)
        except Exception:  # noqa: BLE001 - the cell's own reply goes out whatever this says
            self.log.exception("the check after the cell failed")
            return
        if said:
            self._note(parent, said)

    def _terminal_size(self) -> tuple[int, int]:
        setup = terminal_settings(self.settings, self.settings["shell"])
        return setup.cols, setup.rows

    def run_quietly(self, shell: str, code: str, parent: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run `code` on `shell` and return its result, showing none of its output (`%%check`'s tests, whose
        report the kernel reads): on pipes, with no prompt answered, and stopped by Stop and the cell time
        limit as the cell of `parent` is. Called from a magic's worker thread."""
        client = self.sandbox.client
        stops = self.stops_for(parent)
        params = cell_run(shell, code, self.sandbox.cwd, output_limit=1_000_000,
                          timeout_s=self.settings["timeout"], terminal=None, stdin=False)
        call = self._start_run(client, shell, params, stops)
        try:
            result = client.wait(call)
        finally:
            stops.ended(shell, call.request_id)
        return result

    async def _execute(self, parent: dict[str, Any], code: str, store_history: bool,
                       allow_stdin: bool) -> dict[str, Any]:
        stdin = _CellStdin(allow_stdin, self._parent_ident["shell"])  # where an input_request goes
        ok = {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}
        if store_history:
            self.history.add(self.execution_count, code)
        try:
            if self.stops_for(parent).before_start:  # a Stop sent after this cell came before it (stops.py)
                raise CellError("Interrupted", "interrupted by user before it started: nothing ran")
            await self._say_where_once(parent)
            parsed = parse_cell(code)
            if parsed is None or parsed.cell is None:
                self._refuse_misplaced(code, code if parsed is None else parsed.rest)
            if parsed is None:
                try:
                    await self._run_cell(parent, self.settings_for(parent)["shell"], code, stdin)
                except CellError as err:
                    if err.ename != "ShellExited" or not _LEAVE.match(code):
                        raise
                    # `exit` typed as a cell leaves the console, as it would close a terminal.
                    self._note(parent, err.evalue)
                    ok["payload"] = [{"source": "ask_exit", "keepkernel": False}]
                return ok
            context = _Context(self, parent)
            target = await self._run_magics(context, parsed)
            ok["payload"] = context.payloads
            if target is not None:
                self._refuse_misplaced(code, target.code)  # a %%shell cell's body is a cell too
                await self._run_cell(parent, target.shell, target.code, stdin)
            return ok
        except CellError as err:
            return self._error_reply(parent, err.ename, err.evalue)
        except UsageError as err:
            return self._error_reply(parent, "UsageError", str(err))
        except SandboxUnavailable as err:
            return self._error_reply(parent, "SandboxUnavailable", str(err))
        except P.RunnerError as err:
            return self._error_reply(parent, err.cell_name, err.message)
        except asyncio.CancelledError:
            return self._error_reply(parent, "Interrupted", "the cell was interrupted")
        except Exception as exc:  # noqa: BLE001 - every request gets a reply
            self.log.exception("cell failed")
            return self._error_reply(parent, "KernelError", f"{type(exc).__name__}: {exc}")

    def _refuse_misplaced(self, code: str, shell_text: str) -> None:
        """A known cell magic on a line of `shell_text` (the part of `code` that goes to bash) is a
        UsageError naming it and its line in the cell (placement.py), before anything runs."""
        if "%%" not in shell_text:
            return  # no line can be one: most cells, which then need neither the check nor the magics' table
        from .magics.placement import refuse_misplaced_cell_magic

        cells = [found.name for found in self.magics.values() if found.kind == "cell"]
        refuse_misplaced_cell_magic(shell_text, cells, code.count("\n") - shell_text.count("\n") + 1)

    async def _say_where_once(self, parent: dict[str, Any]) -> None:
        """The first cell says where commands run, in one line (JupyterLab shows no banner)."""
        if self._said_where:
            return
        if not self.sandbox.ready:
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.sandbox.wait)
            except SandboxUnavailable:
                return  # the cell itself says why
        self._said_where = True
        self._note(parent, f"[sandbox: {' · '.join(self.sandbox.headline())}]")

    async def _run_magics(self, context: _Context, parsed: ParsedCell) -> RunOnShell | None:
        loop = asyncio.get_running_loop()
        if parsed.cell is not None:
            name, args, body = parsed.cell
            found = self.magics.find("cell", name)
            return await loop.run_in_executor(None, found.run, context, args, body)
        for name, args in parsed.lines:
            found = self.magics.find("line", name)
            await loop.run_in_executor(None, found.run, context, args, "")
            self.outbox.budget(context.parent).limit = context.settings["output_limit"]  # %output limit, at once
        if parsed.rest.strip():
            return RunOnShell(context.settings["shell"], parsed.rest)
        return None

    async def _run_cell(self, parent: dict[str, Any], shell: str, code: str, stdin: _CellStdin | None = None) -> None:
        """Run `code` on `shell`, showing its output live; raises CellError for a failure."""
        if not code.strip():
            return
        loop = asyncio.get_running_loop()
        # Only the first cells may have to wait for the sandbox; the others skip the thread hop.
        workspace = self.sandbox.wait(0) if self.sandbox.ready else await loop.run_in_executor(None, self.sandbox.wait)
        client = workspace.client
        wake = asyncio.Event()
        settings = self.settings_for(parent)
        setup = terminal_settings(settings, shell)
        output = CellOutput(terminal=setup.terminal, budget=self.outbox.budget(parent))
        stdin = stdin or _CellStdin(False, b"")
        prompts = self._prompts(parent, shell, stdin, client)

        def woken(show: Callable[[Any], None]) -> Callable[[Any], None]:
            def on_frame(frame: Any) -> None:
                show(frame)
                loop.call_soon_threadsafe(wake.set)
            return on_frame

        params = cell_run(shell, code, self.sandbox.cwd, output_limit=settings["output_limit"],
                          timeout_s=settings["timeout"], terminal=setup, stdin=stdin.allowed)
        provider = workspace.provider
        counted = provider.limit_counters()
        stops = self.stops_for(parent)
        call = self._start_run(client, shell, params, stops, on_output=woken(output.live),
                               on_input_wanted=woken(output.input_wanted))
        finished = asyncio.wrap_future(call)  # its answer, awaited here (a cancelled cell leaves the call be)
        finished.add_done_callback(lambda _: wake.set())
        try:
            while True:
                await self._news(wake, output)
                wake.clear()
                ended = finished.done()  # a prompt that came with the end is asked of nobody
                await self._show(parent, output, shell, None if ended else prompts)
                if ended:
                    break
                # What comes next is gathered for BATCH_SECONDS into one message, unless the command ends first.
                await asyncio.wait((finished,), timeout=BATCH_SECONDS)
        finally:
            prompts.close()  # the command has ended (or the cell was cancelled): its open prompt too
            stops.ended(shell, call.request_id)
            finished.cancel()  # a cell cancelled first stops awaiting: the call's answer, when it comes, goes nowhere
        result = finished.result()  # the call's RunnerError, raised
        self._count_usage(parent, result.get("usage"))
        output.finish(result)
        await self._show(parent, output, shell)
        hit = named_limit(result, counted, provider.limit_counters(), provider.limit_report())
        if hit is not None:
            raise CellError(*hit)
        hint = network_hint(result, provider.network_state())
        if hint is not None:
            self._note(parent, hint)
        self._raise_for(result, shell)

    @staticmethod
    def _raise_for(result: dict[str, Any], shell: str) -> None:
        """How the command ended (the result's `outcome`, set where it happened) as the cell's error."""
        outcome = result.get("outcome", P.OUTCOME_EXIT)
        error = result.get("error") or ""
        if outcome == P.OUTCOME_TIMEOUT:
            raise CellError("TimedOut", error or "the command timed out")
        if outcome == P.OUTCOME_INTERRUPT:
            raise CellError("Interrupted", error or "interrupted by user")
        if outcome == P.OUTCOME_SHELL_EXITED:
            raise CellError("ShellExited", f"the shell '{shell}' exited (status {result.get('exit_code')}); the next "
                                           f"cell starts a new shell in {result.get('cwd')} (variables are gone)")
        if error:
            raise CellError("SandboxError", error)
        status = result.get("exit_code")
        if status not in (0, None):
            raise CellError("ExitStatus", f"the command exited with status {status}")

    @staticmethod
    async def _news(wake: asyncio.Event, output: CellOutput) -> None:
        """Wait for frames, or until the unfinished line that `output` holds back is due to show."""
        due = output.hold_deadline()
        if due is None:
            await wake.wait()
            return
        try:
            await asyncio.wait_for(wake.wait(), max(due - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
            pass

    def _prompts(self, parent: dict[str, Any], shell: str, stdin: _CellStdin, client: Any) -> CellPrompts:
        """The cell's prompts: asked on the stdin channel of the client that sent the cell, answered
        with `shell.input` on the shell it runs on."""

        def ask(prompt: str, password: bool, cancelled: threading.Event) -> str | None:
            value = self.stdin.ask(prompt, password, parent, stdin.ident, cancelled)
            self.recorder.answered(parent, prompt, value, password)  # a password's answer is never kept
            return value

        def send_input(params: dict[str, Any]) -> None:
            try:
                SandboxAPI.over(client).give_input({"shell": shell, **params})
            except (P.RunnerError, TimeoutError) as exc:  # the command ended meanwhile: nothing reads
                self.log.debug("shell.input on %s: %s", shell, exc)

        return CellPrompts(stdin.allowed, ask, send_input)

    async def _show(self, parent: dict[str, Any], output: CellOutput, shell: str,
                    prompts: CellPrompts | None = None) -> None:
        for event in output.take():
            if isinstance(event, InputWanted):
                if prompts is not None:  # after the command ended, nothing reads an answer
                    prompts.wanted(event.prompt, event.password)
            elif isinstance(event, Stream):
                self._stream(parent, event.text, event.name, counted=True)
            elif isinstance(event, Notice):
                self._note(parent, event.text, counted=True)
            elif isinstance(event, Display):
                await asyncio.get_running_loop().run_in_executor(None, self._display_file, parent, event, shell)

    def _display_file(self, parent: dict[str, Any], event: Display, shell: str) -> None:
        """An `owdisplay` request of the box: its file shown, or a note saying why not. Whatever the
        file holds, the cell goes on: an error here would end the cell and lose its running command."""
        from .display.rich import mime_for, rich_bundle
        from .magics.files import read_whole

        context = _Context(self, parent)
        try:
            mime = mime_for(event.path, event.mime)
            bundle = rich_bundle(read_whole(context, event.path, None), mime, event.path)
        except (UsageError, P.RunnerError) as exc:
            self._note(parent, f"owdisplay: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - the box's bytes: any failure is a note, never the cell's
            self.log.warning("owdisplay %s failed", event.path, exc_info=True)
            self._note(parent, f"owdisplay: {event.path[:200]} is not shown ({type(exc).__name__})")
            return
        display_id = self._displays.box_id(event.display_id)
        update = display_id is not None and self._displays.seen(display_id)
        try:
            context.display(bundle, display_id=display_id, update=update,
                            withheld=Withheld(f"the display of {event.path}",
                                              "show it in a cell of its own, or raise %output limit"))
        except Exception as exc:  # noqa: BLE001 - as above: a display the wire cannot carry is a note
            self.log.warning("owdisplay %s could not be sent", event.path, exc_info=True)
            self._note(parent, f"owdisplay: {event.path[:200]} is not shown ({type(exc).__name__})")

    # -- Stop -------------------------------------------------------------------------------

    async def interrupt_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Message-mode interrupts stop the running commands instead of signalling the kernel: from a
        kernel subshell (its id in the request's header), only that subshell's cell."""
        subshell = (parent.get("header") or {}).get("subshell_id")
        self._interrupt_running(_sent_at(parent), str(subshell) if subshell else None)
        self.session.send(stream, "interrupt_reply", {"status": "ok"}, parent, ident=ident)

    def pre_handler_hook(self) -> None:
        # A client that signals (interrupt_mode "signal", or Ctrl-C in a terminal) stops the command too.
        if threading.current_thread() is threading.main_thread():
            self.saved_sigint_handler = signal.signal(signal.SIGINT, self._on_sigint)

    def post_handler_hook(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self.saved_sigint_handler)

    def _on_sigint(self, _signum: int, _frame: Any) -> None:
        self._interrupt_running()

    def _interrupt_running(self, sent: datetime | None = None, subshell: str | None = None) -> None:
        """Stop the executing cells (stops.py), or the one of kernel subshell `subshell`: send
        `shell.interrupt` for each of their runs and return at once (nothing waits for it: each cell's own
        reply says how it ended); what they have not started yet never starts. `sent`: when the Stop was
        sent (its message's date), else now."""
        when = sent or datetime.now(timezone.utc)
        if subshell is None:
            if self._attach is not None:  # none was made: nothing waits
                self._attach.cancel_waits()
            with self._stops_lock:
                lanes = list(self._stops.values())
        else:
            lanes = [self._lane(subshell)]
        runs = [run for lane in lanes for run in lane.stop(when)]
        if runs and self.sandbox.ready:
            self._interrupt_runs(self.sandbox.client, runs)

    def _interrupt_runs(self, client: Any, runs: list[tuple[str, str]]) -> None:
        for shell, request_id in runs:
            try:
                SandboxAPI.over(client).interrupt(shell, request_id)
            except P.RunnerError as exc:
                log.warning("could not stop the command on shell %s: %s", shell, exc)

    def _start_run(self, client: Any, shell: str, params: M.RunParams, stops: CellStops, **handlers: Any) -> Any:
        """`shell.run` for the cell, unless a Stop came for it first (CellError "Interrupted"); a Stop
        that comes while it is being sent is carried to it here."""
        if stops.before_start:
            raise CellError("Interrupted", "interrupted by user before it started: nothing ran")
        call = SandboxAPI.over(client).start_run(params, **handlers)
        if stops.started(shell, call.request_id):
            self._interrupt_runs(client, [(shell, call.request_id)])
        return call

    # -- is_complete, complete, inspect -----------------------------------------------------

    async def do_is_complete(self, code: str) -> dict[str, Any]:
        from .editing.completeness import check

        status, indent = check(code)
        reply: dict[str, Any] = {"status": status}
        if status == "incomplete":
            reply["indent"] = indent
        return reply

    def _completion_context(self) -> CompletionContext:
        from .editing.completion import CompletionContext

        shell = self.settings_for(self.get_parent("shell"))["shell"]
        return CompletionContext(shell=shell, box=self.box, folder=lambda: self.shell_folder(shell),
                                 history=self.history.codes(200), magics=self.magics,
                                 attach_words=self.attach.words)

    async def do_complete(self, code: str, cursor_pos: int) -> dict[str, Any]:
        from .editing.completion import complete

        loop = asyncio.get_running_loop()
        try:
            matches, start, end = await loop.run_in_executor(None, complete, self._completion_context(), code,
                                                             cursor_pos)
        except (SandboxUnavailable, P.RunnerError, TimeoutError) as exc:
            log.debug("completion failed: %s", exc)
            matches, start, end = [], cursor_pos, cursor_pos
        kept = [match for match in matches if isinstance(match, str) and len(match) <= MATCH_CHARS][:MAX_MATCHES]
        return {"status": "ok", "matches": box_text.clean_matches(kept), "cursor_start": start, "cursor_end": end,
                "metadata": {}}

    async def do_inspect(self, code: str, cursor_pos: int, detail_level: int = 0,
                         omit_sections: Any = ()) -> dict[str, Any]:
        from .editing.completion import inspect_word

        loop = asyncio.get_running_loop()
        try:
            text = await loop.run_in_executor(None, inspect_word, self._completion_context(), code, cursor_pos)
        except (SandboxUnavailable, P.RunnerError, TimeoutError) as exc:
            log.debug("inspection failed: %s", exc)
            text = ""
        if len(text) > INSPECT_CHARS:
            text = text[:INSPECT_CHARS] + f"\n… ({len(text) - INSPECT_CHARS} more characters)"
        data = {"text/plain": text} if text else {}
        return box_text.clean("inspect_reply", {"status": "ok", "found": bool(text), "data": data, "metadata": {}})

    # -- history (the console's up-arrow, %history-like clients) -----------------------------

    async def do_history(self, hist_access_type: str, output: bool, raw: bool, session: int | None = None,
                         start: int | None = None, stop: int | None = None, n: int | None = None,
                         pattern: str | None = None, unique: bool = False) -> dict[str, Any]:
        entries = self.history.query(hist_access_type, session, start, stop, n, pattern, unique)
        if output:
            entries = [(s, line, (code, None)) for s, line, code in entries]
        return {"status": "ok", "history": entries}

    # -- shutdown ---------------------------------------------------------------------------

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        self.recorder.stop("the kernel restarted" if restart else "the kernel shut down")
        if self._attach is not None:
            await loop.run_in_executor(None, self._attach.close)  # programs keep running; cursors are saved
        await loop.run_in_executor(None, self.sandbox.close, restart)
        return {"status": "ok", "restart": restart}

    def end_for_good(self, why: str) -> None:
        """Nothing can restart this kernel (its launcher is gone, or a gateway gave it up): its sandbox
        ends now rather than lingering for a kernel that will not come (ending.py), a start under way
        included. Called on a thread of its own, maybe while `do_shutdown` is closing the sandbox (then
        this waits for that close)."""
        self.recorder.stop(why)
        self.sandbox.end()

    def end_terminated(self) -> None:
        """SIGTERM (ending.py): a close of the sandbox under way finishes; none is begun."""
        self.recorder.stop("the kernel was sent SIGTERM")
        self.sandbox.settle()

    def shell_folder(self, shell: str) -> str:
        try:
            return self.sandbox.folder_of(shell)
        except SandboxUnavailable:
            return self.sandbox.cwd


class _CellStdin:
    """Whether the cell's client answers input requests, and its socket identity on the stdin channel."""

    def __init__(self, allowed: bool, ident: Any) -> None:
        self.allowed = allowed
        self.ident = ident


class _Context:
    """What a magic may touch: the sandbox, the settings, and this cell's outputs."""

    def __init__(self, kernel: OwSandboxKernel, parent: dict[str, Any]) -> None:
        self.kernel = kernel
        self.parent = parent
        self.settings = kernel.settings_for(parent)
        self.magics = kernel.magics
        self.payloads: list[dict[str, Any]] = []  # for the execute reply (the pager)

    def call(self, method: str, params: dict[str, Any], timeout: float = 60.0) -> Any:
        client = self.kernel.sandbox.client
        if params.get("shell") and self.kernel.sandbox.known_folder(params["shell"]) is None:
            # A shell that has not run a cell yet would start in the workspace, where the daemon is.
            params = {key: value for key, value in params.items() if key != "shell"}
        return client.call(method, params, timeout=timeout)

    @property
    def box(self) -> SandboxAPI:
        return SandboxAPI(self.call)

    def stream(self, text: str, name: str = "stdout", withheld: Withheld | None = None) -> None:
        self.kernel._stream(self.parent, text, name, withheld)

    def note(self, text: str) -> None:
        """A line of the kernel's own (a paging footer, a hint): dimmed, not on stderr."""
        self.kernel._note(self.parent, text)

    def display(self, data: dict[str, Any], metadata: dict[str, Any] | None = None,
                display_id: str | None = None, update: bool = False, withheld: Withheld | None = None) -> None:
        content: dict[str, Any] = {"data": data, "metadata": metadata or {}}
        if display_id is not None:
            content["transient"] = {"display_id": display_id}
        self.kernel._send(self.parent, "update_display_data" if update else "display_data", content, withheld)

    @property
    def attach(self) -> AttachManager:
        return self.kernel.attach

    @property
    def sandbox(self) -> Sandbox:
        return self.kernel.sandbox

    @property
    def recorder(self) -> Recorder:
        return self.kernel.recorder

    def run_quietly(self, shell: str, code: str) -> dict[str, Any]:
        """`%%check`'s tests on `shell`, their output kept from the notebook (see OwSandboxKernel.run_quietly)."""
        return self.kernel.run_quietly(shell, code, self.parent)

    def shell_folder(self) -> str:
        return self.kernel.shell_folder(self.settings["shell"])

    def result(self, text: str) -> None:
        """A magic's answer with a setting (`%terminal`, `%record`, `%timeout`): printed, as every magic's
        answer is, never the cell's value (Out[n]), so a magic's output looks the same whatever it says."""
        self.stream(text if text.endswith("\n") else text + "\n")

    def clear(self) -> None:
        self.kernel._send(self.parent, "clear_output", {"wait": False})

    def page(self, text: str, withheld: Withheld | None = None) -> None:
        shown = self.kernel.outbox.page(self.parent, text, withheld or Withheld())
        self.payloads.append({"source": "page", "data": {"text/plain": shown}, "start": 0})

    def subshell_shells(self) -> dict[str, str]:
        return self.kernel.subshell_shells()

    def usage(self) -> dict[str, Any]:
        return self.kernel._usage_reply()

    def set_network(self, on: bool) -> str:
        """`%network on|off`: the provider switches the running box's network (`Provider.set_network`), and
        the next cell's first line says where commands run again, with the network as it is now."""
        said = self.kernel.sandbox.wait().provider.set_network(on)
        self.kernel._said_where = False
        return said

    def terminal_open(self) -> dict[str, Any]:
        """`%terminal open`: the command (and in JupyterLab the button) that opens a terminal in this sandbox."""
        from .magics.terminal_open import terminal_open

        return terminal_open(getattr(self.kernel.parent, "connection_file", "") or None,
                             self.kernel.sandbox.wait().provider.name, self.kernel.sandbox.settings)

    def preview_box(self) -> PreviewBox:
        """`%preview`: this kernel's connection file, its sandbox's provider and execd endpoint."""
        from .magics.preview import PreviewBox

        return PreviewBox(getattr(self.kernel.parent, "connection_file", "") or None,
                          self.kernel.sandbox.wait().provider, self.kernel._execd_endpoint,
                          self.kernel.sandbox.settings.preview_base_url)

    def describe_sandbox(self) -> dict[str, Any]:
        timeout = self.settings["timeout"]
        shell = self.settings["shell"]
        return {**self.kernel.sandbox.describe(), "current shell": shell,
                "terminal": terminal_settings(self.settings, shell).describe(shell).split(": ", 1)[1],
                "cell time limit": "off" if timeout is None else f"{timeout:g} s",
                "output limit": f"{self.settings['output_limit']:,} characters"}


def _sent_at(message: dict[str, Any]) -> datetime | None:
    """When the client sent `message` (its header's date, which jupyter_client parses), if it says."""
    date = message.get("header", {}).get("date")
    if isinstance(date, str):
        try:
            date = datetime.fromisoformat(date)
        except ValueError:
            return None
    return date if isinstance(date, datetime) else None
