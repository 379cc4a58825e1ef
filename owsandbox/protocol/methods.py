"""The runner protocol's method names: the only place they are spelled.

Each one's shapes are in `protocol.messages` (`REQUEST_SHAPES`, `RESULT_SHAPES`, `LIVE_SHAPES`).
The box routes on them (`box/dispatch.py`, the file and process handlers) and the host calls them
(`host/client.py`, `host/executor.py`, the kernel through its client). A name spelled anywhere else
is a test failure (tests/test_import_contracts.py).
"""

from __future__ import annotations

from typing import Final

# -- the session ---------------------------------------------------------------------------
HELLO: Final = "runner.hello"  # the first call: version check; the box describes itself (`Hello`)
SESSION_RESUME: Final = "session.resume"  # after a cut pipe: replay what was not acknowledged
SESSION_ACK: Final = "session.ack"  # a notification from the host: answers up to `seq` arrived (`AckParams`)
PING: Final = "$/ping"  # a notification from the host, never answered: it keeps an idle relay awake

# -- shells --------------------------------------------------------------------------------
SHELL_RUN: Final = "shell.run"  # `RunParams` -> `RunResult`, with live notifications meanwhile
SHELL_INTERRUPT: Final = "shell.interrupt"  # `InterruptParams` -> `InterruptResult`
SHELL_INPUT: Final = "shell.input"  # an answer (or end of input) typed into a waiting command: `InputParams`
SHELL_LIST: Final = "shell.list"  # -> `ListShellsResult`
SHELL_CLOSE: Final = "shell.close"  # `ShellParams` -> `CloseResult`
SHELL_COMPLETE: Final = "shell.complete"  # -> `CompleteResult`
SHELL_INSPECT: Final = "shell.inspect"  # -> `InspectResult`

# -- live notifications from the box, each naming its request's `id` -------------------------
SHELL_OUTPUT: Final = "shell.output"  # `OutputFrame`: a piece of output, `{id, shell, stream, text, offset, seq}`
SHELL_PROGRESS: Final = "shell.progress"  # `ProgressFrame`: silent but alive, `{id, shell, elapsed_s, output_bytes}`
SHELL_INPUT_WANTED: Final = "shell.input_wanted"  # `InputWanted`: `{id, shell, prompt, password}`

# -- files and processes -------------------------------------------------------------------
# (each may name the `shell` whose folder a relative path starts from: `FolderParams`)
FS_READ: Final = "fs.read"  # `ReadParams` -> `ReadLinesResult`, or `ReadBytesResult` by bytes
FS_WRITE: Final = "fs.write"  # `WriteParams` -> `WriteResult`
FS_STAT: Final = "fs.stat"  # `StatParams` -> `StatResult`
FS_LIST: Final = "fs.list"  # `ListParams` -> `ListResult`
FS_SEARCH: Final = "fs.search"  # `SearchParams` -> `SearchResult`
FS_MKDIR: Final = "fs.mkdir"  # `MkdirParams` -> `MkdirResult`
FS_REMOVE: Final = "fs.remove"  # `RemoveParams` -> `RemoveResult`
PROC_RUN: Final = "proc.run"  # `ProcParams` -> `ProcResult`: one argv, no shell
BOX_USAGE: Final = "box.usage"  # `UsageParams` -> `Usage`: what the box uses now

#: Every request a host may make.
REQUESTS: Final = frozenset({HELLO, SESSION_RESUME, SHELL_RUN, SHELL_INTERRUPT, SHELL_INPUT, SHELL_LIST,
                             SHELL_CLOSE, SHELL_COMPLETE, SHELL_INSPECT, FS_READ, FS_WRITE, FS_STAT, FS_LIST,
                             FS_SEARCH, FS_MKDIR, FS_REMOVE, PROC_RUN, BOX_USAGE})
#: Every notification, either way.
NOTIFICATIONS: Final = frozenset({SESSION_ACK, PING, SHELL_OUTPUT, SHELL_PROGRESS, SHELL_INPUT_WANTED})
