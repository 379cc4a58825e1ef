"""The shapes of the runner protocol's messages: params, results and live frames, as typed dicts.

Frames stay plain JSON objects on the wire and dicts in memory (the box runs on the standard library
of any Python 3, and a frame is decoded once); these types name their fields for both ends and for
a type checker, and the literals name every stream and outcome. Optional fields are `NotRequired`.
"""

from __future__ import annotations

import sys
from typing import Any, Literal, NamedTuple, TypedDict

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # pragma: no cover - Python 3.10: the box's own code never reads this at run time
    NotRequired = Any  # type: ignore[assignment]

#: Where a piece of a command's output came from. `stdout`/`stderr` are pipes; a command run with
#: `terminal: true` prints to a terminal, whose text arrives as `stdout` (or `stderr` when apart).
Stream = Literal["stdout", "stderr"]
#: The channels the box reads a shell on, before they become a `Stream`.
Channel = Literal["stdout", "stderr", "tty-out", "tty-err"]
#: A record that is not plain output: a line `owsandbox` itself put in the output (`note`) and a rich
#: output a command asked for with `owdisplay` (`display`).
RecordKind = Literal["data", "note", "display"]
#: What a live frame carries: a stream's output, a note of the box's own, or an `owdisplay` request.
LiveStream = Literal["stdout", "stderr", "note", "display"]

# How a command ended: `shell.run`'s result field `outcome`, set where it happened.
OUTCOME_EXIT = "exit"  # the command ran to its end; `exit_code` says how
OUTCOME_INTERRUPT = "interrupt"  # stopped by shell.interrupt (Stop)
OUTCOME_TIMEOUT = "timeout"  # stopped at its timeout_s
OUTCOME_SHELL_EXITED = "shell_exited"  # the shell itself ended (exit, set -e, a signal); `cwd` is its last folder
Outcome = Literal["exit", "interrupt", "timeout", "shell_exited"]

RESTARTED_MESSAGE = "the sandbox restarted; the outcome of this command is unknown"


class ShellInfo(TypedDict):
    """One entry of `shell.list` and of `Hello.shells`."""

    name: str
    cwd: str
    busy: bool


class Usage(TypedDict):
    """`box.usage`'s result: the daemon and every process below it, as the box's /proc shows them."""

    memory_bytes: int  # proportional set size, summed
    cpu_seconds: float  # CPU time, the reaped children's included, since each process started
    processes: int
    cpus: int  # the CPUs the box may run on


class Hello(TypedDict):
    """`runner.hello`'s result: the box describes itself."""

    protocol_version: int
    runner_version: str
    instance_id: str  # a new one after every start of the daemon: how the host sees a restart
    pid: int
    os: str
    machine: str
    python: str
    shell: str
    cwd: str
    shells: list[ShellInfo]
    last_seq: int
    max_frame_bytes: int
    output_limit: int
    log_dir: str
    attach_registry: str
    uptime_s: float
    execd: dict[str, Any] | None


class RunParams(TypedDict):
    """`shell.run`'s params."""

    shell: NotRequired[str]  # "main" when absent
    command: str
    cwd: NotRequired[str]  # for a shell that starts with this call
    timeout_s: NotRequired[float]
    output_limit: NotRequired[int]
    terminal: NotRequired[bool]
    stdin: NotRequired[bool]  # whether the caller answers prompts (`shell.input_wanted`)
    stderr: NotRequired[Literal["apart", "merge"]]
    cols: NotRequired[int]
    rows: NotRequired[int]


class RunResult(TypedDict):
    """`shell.run`'s result."""

    shell: str
    command: str
    cwd: str  # the shell's folder after the command: the box owns this fact
    exit_code: int | None
    outcome: Outcome
    output: str
    timed_out: bool
    truncated: bool
    duration_ms: float
    output_bytes: int
    output_chars: int
    error: NotRequired[str]
    log_path: NotRequired[str]
    tail_chars: NotRequired[int]
    segments: NotRequired[list[Any]]
    usage: NotRequired[CommandUsage]  # what the command used (box/shell/cellusage.py)


class CommandUsage(TypedDict):
    """What one command used, measured by the box on its shell's process tree (box/shell/cellusage.py)."""

    peak_memory_bytes: int  # the most resident memory the tree held at once, as sampled
    cpu_seconds: float | None  # CPU time of the tree during the command; None when the shell ended with it
    samples: int  # the readings the peak is the highest of


class OutputFrame(TypedDict):
    """`shell.output`: a piece of the live output of the command started by request `id`. `offset`
    counts the characters of the command's output before it (the kernel sees a gap by it), `seq`
    the frames of the command (1, 2, ...)."""

    id: Any
    shell: str
    stream: LiveStream
    text: str
    offset: int
    seq: NotRequired[int]


class ProgressFrame(TypedDict):
    """`shell.progress`: the command of request `id` has printed nothing for a while and still runs."""

    id: Any
    shell: str
    elapsed_s: float
    output_bytes: int


class InputWanted(TypedDict):
    """`shell.input_wanted`: the command of request `id` waits for its terminal, showing `prompt`."""

    id: Any
    shell: str
    prompt: str
    password: bool  # echo is off: answer without showing it


class InputParams(TypedDict):
    """`shell.input`'s params: text typed into the waiting command, or its end of input."""

    shell: NotRequired[str]  # "main" when absent
    text: NotRequired[str]  # required unless `eof`
    eof: NotRequired[bool]


class HelloParams(TypedDict):
    protocol_version: int


class ResumeParams(TypedDict):
    last_seq: int


class ShellParams(TypedDict):
    """`shell.close`'s params."""

    shell: str


class ShellNameParams(TypedDict):
    """`shell.complete`'s and `shell.inspect`'s: the shell they ask about ("main" when absent); the
    rest of their params are read by the completion itself."""

    shell: NotRequired[str]


class InterruptParams(TypedDict):
    """`shell.interrupt`'s params: the `shell.run` of request `id` on `shell`, else whatever runs there."""

    shell: NotRequired[str]  # "main" when absent
    id: NotRequired[Any]


class AckParams(TypedDict):
    """`session.ack`: every answer up to `seq` arrived."""

    seq: int


class InterruptResult(TypedDict):
    shell: str
    interrupted: bool
    state: Literal["running", "not started", "ended", "unknown", "idle"]


class InputResult(TypedDict):
    shell: str
    written: bool


class CloseResult(TypedDict):
    shell: str
    closed: bool


class ListShellsResult(TypedDict):
    shells: list[ShellInfo]


class CompleteResult(TypedDict):
    matches: list[str]


class InspectResult(TypedDict):
    text: str


class FolderParams(TypedDict):
    """What every file and process method may name: the shell whose folder a relative path starts
    from (its last folder, if it has exited); the daemon's own folder when absent."""

    shell: NotRequired[str]


class UsageParams(FolderParams):
    """`box.usage`'s params: none of its own."""


class ReadParams(FolderParams):
    """`fs.read`'s params: a page by lines (1-based), or by bytes; not both."""

    path: str
    offset_line: NotRequired[int]  # 1 when absent
    limit_lines: NotRequired[int]  # 2000 when absent
    offset_bytes: NotRequired[int]
    limit_bytes: NotRequired[int]  # at most 1 MiB is read whatever it says


class ReadLinesResult(TypedDict):
    """`fs.read` by lines."""

    path: str
    text: str
    start_line: int
    end_line: int
    total_lines: int
    total_bytes: int
    eof: bool


class ReadBytesResult(TypedDict):
    """`fs.read` by bytes (`offset_bytes`)."""

    path: str
    data_b64: str
    offset_bytes: int
    length: int
    total_bytes: int
    eof: bool


class WriteParams(FolderParams):
    """`fs.write`'s params: exactly one of `text` and `data_b64`."""

    path: str
    text: NotRequired[str]
    data_b64: NotRequired[str]
    if_match_sha256: NotRequired[str]  # the content's sha256 as read, or "" for "must not exist yet"
    append: NotRequired[bool]
    make_parents: NotRequired[bool]


class WriteResult(TypedDict):
    path: str
    bytes_written: int
    sha256: str
    size: int


class StatParams(FolderParams):
    path: str


class StatResult(TypedDict):
    path: str
    exists: bool
    type: str | None
    size: int | None
    mode: str | None
    mtime: float | None
    sha256: str | None


class ListParams(FolderParams):
    path: NotRequired[str]  # "." when absent
    max_entries: NotRequired[int]


class ListEntry(TypedDict):
    name: str
    type: str
    size: int
    mtime: float


class ListResult(TypedDict):
    path: str
    entries: list[ListEntry]
    truncated: bool


class SearchParams(FolderParams):
    """`fs.search`'s params: lines matching the regex `pattern` in the text files under `path`."""

    pattern: str
    path: NotRequired[str]  # "." when absent; a file searches that file
    glob: NotRequired[str]  # of the file names searched
    ignore_case: NotRequired[bool]
    max_matches: NotRequired[int]
    timeout_s: NotRequired[float]  # the search is stopped past it (30 s when absent)


class SearchMatch(TypedDict):
    path: str
    line: int  # 1-based
    text: str  # the line, cut to 500 characters


class SearchResult(TypedDict):
    matches: list[SearchMatch]
    truncated: bool
    files_searched: int


class MkdirParams(FolderParams):
    path: str
    parents: NotRequired[bool]  # true when absent


class MkdirResult(TypedDict):
    path: str
    created: bool  # false: it was a folder already


class RemoveParams(FolderParams):
    path: str
    recursive: NotRequired[bool]  # a folder with its contents


class RemoveResult(TypedDict):
    path: str
    removed: bool  # false: there was nothing there


class ProcParams(FolderParams):
    """`proc.run`'s params: one argv run without a shell."""

    argv: list[str]
    cwd: NotRequired[str]  # relative to the shell's folder; that folder when absent
    env: NotRequired[dict[str, str]]  # added to the daemon's environment
    stdin: NotRequired[str]
    timeout_s: NotRequired[float]


class ProcResult(TypedDict):
    """`proc.run`'s result: stdout and stderr apart, each cut at 4 MiB."""

    exit_code: int  # negative: killed by that signal
    stdout: str
    stderr: str
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int


class ResumeResult(TypedDict):
    """`session.resume`: what was replayed since `last_seq`, and whether some was lost (`gap`)."""

    instance_id: str
    replayed: int
    gap: bool


class DisplayRequest(NamedTuple):
    """One `owdisplay` request, as a `display` record carries it: a line `MIME TAB ID TAB PATH` (the
    shell function prints it; the box passes it on as a record of its own, in order with the output
    around it). `mime` and `id` may be empty; the kernel checks `mime` again before showing anything."""

    path: str
    mime: str
    display_id: str

    def line(self) -> str:
        return f"{self.mime}\t{self.display_id}\t{self.path}\n"


def display_requests(text: str) -> list[DisplayRequest]:
    """The requests in a `display` record's text, one per line (missing fields are empty)."""
    found = []
    for line in text.splitlines():
        mime, display_id, path = (line.split("\t", 2) + ["", ""])[:3]
        found.append(DisplayRequest(path, mime, display_id))
    return found


# -- which shape goes with which method: what each end parses ---------------------------------
from . import methods as _m  # noqa: E402 - the names are the methods module's; the shapes are above

#: A request's params, as the box parses them before its handler runs.
REQUEST_SHAPES: dict[str, type] = {
    _m.HELLO: HelloParams, _m.SESSION_RESUME: ResumeParams, _m.SHELL_RUN: RunParams,
    _m.SHELL_INTERRUPT: InterruptParams, _m.SHELL_INPUT: InputParams, _m.SHELL_CLOSE: ShellParams,
    _m.SHELL_COMPLETE: ShellNameParams, _m.SHELL_INSPECT: ShellNameParams, _m.SESSION_ACK: AckParams,
    _m.FS_READ: ReadParams, _m.FS_WRITE: WriteParams, _m.FS_STAT: StatParams, _m.FS_LIST: ListParams,
    _m.FS_SEARCH: SearchParams, _m.FS_MKDIR: MkdirParams, _m.FS_REMOVE: RemoveParams, _m.PROC_RUN: ProcParams,
    _m.BOX_USAGE: UsageParams,
}
#: A request's result, as the host parses it.
RESULT_SHAPES: dict[str, type] = {
    _m.HELLO: Hello, _m.SESSION_RESUME: ResumeResult, _m.SHELL_RUN: RunResult,
    _m.SHELL_INTERRUPT: InterruptResult, _m.SHELL_INPUT: InputResult, _m.SHELL_CLOSE: CloseResult,
    _m.SHELL_LIST: ListShellsResult, _m.SHELL_COMPLETE: CompleteResult, _m.SHELL_INSPECT: InspectResult,
    _m.FS_READ: ReadLinesResult, _m.FS_WRITE: WriteResult, _m.FS_STAT: StatResult, _m.FS_LIST: ListResult,
    _m.FS_SEARCH: SearchResult, _m.FS_MKDIR: MkdirResult, _m.FS_REMOVE: RemoveResult, _m.PROC_RUN: ProcResult,
    _m.BOX_USAGE: Usage,
}
#: A result that comes in another shape too, told by a field only that shape has: `fs.read` by bytes
#: answers with `data_b64` where a page of lines has `text`.
RESULT_VARIANTS: dict[str, tuple[str, type]] = {_m.FS_READ: ("data_b64", ReadBytesResult)}
#: A live notification from the box, as the host parses it: each is a kind of its own.
LIVE_SHAPES: dict[str, type] = {
    _m.SHELL_OUTPUT: OutputFrame, _m.SHELL_PROGRESS: ProgressFrame, _m.SHELL_INPUT_WANTED: InputWanted,
}


def result_shape(method: str, result: Any) -> type | None:
    """The shape `result` must have as the answer to `method` (`RESULT_SHAPES`, or the variant its
    telling field names); None for a method without one."""
    variant = RESULT_VARIANTS.get(method)
    if variant is not None and isinstance(result, dict) and variant[0] in result:
        return variant[1]
    return RESULT_SHAPES.get(method)
