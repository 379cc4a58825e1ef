"""What `%sandbox` says: a short summary in words a user knows, every detail with `--all`, the raw dict as JSON.

Why: the description a provider gives (`Provider.describe`, with the kernel's settings on top) is for
someone debugging the sandbox: cgroup paths, socket paths, an instance id, every owner-only file of
`/etc`, snake_case keys beside prose ones, nested dicts. A newcomer asked "where do my commands run,
what can they write, can they reach the network, how much may they use" and got seventy rows. So the
summary picks and renames from that same description, in one mapping (`SUMMARY`) that every provider
goes through; a fact a provider does not give leaves its row out. `--all` is the description whole,
in readable rows; `--json` is the description as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from ...protocol.paths import inside

Info = Mapping[str, Any]
MAX_SUMMARY_ROWS = 23  # with the footer and the banner of a first cell, at most 25 lines
EXAMPLES = 2  # paths named in a row before "and N more"

# What a hidden path is, as the providers say it (`hidden (WHY)`), in the words a summary counts it by.
HIDDEN_KINDS = {"owner-only file": ("owner-only file of /etc", "owner-only files of /etc"),
                "a dot entry of the home": ("dot entry of the home", "dot entries of the home"),
                "socket": ("socket in the workspace", "sockets in the workspace"),
                "this machine's private state folder": ("private state folder of this machine",) * 2}


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _count(text: str) -> str:
    """`1024` as `1,024`; words are left alone."""
    return f"{int(text):,}" if text.isdigit() else text


def _short(text: str) -> str:
    """The words before a parenthesis or a semicolon: `cgroup v1 (/sys/fs/...)` → `cgroup v1`."""
    return re.split(r" \(|;", text, maxsplit=1)[0].strip()


def _some(paths: list[str], shortest: bool = False) -> str:
    """A few of `paths` (the shortest, which are the best known: /etc/shadow before /etc/ssh/...) and how
    many more."""
    shown = ", ".join((sorted(paths, key=lambda path: (len(path), path)) if shortest else paths)[:EXAMPLES])
    return shown + (f" and {len(paths) - EXAMPLES} more" if len(paths) > EXAMPLES else "")


def _mounts(info: Info) -> dict[str, str] | None:
    mounts = info.get("mounts")
    return {str(k): _text(v) for k, v in mounts.items()} if isinstance(mounts, Mapping) else None


def _isolated(info: Info) -> bool:
    return info.get("enforcement") not in (None, "none")


# -- the rows of the summary ----------------------------------------------------------------------

def isolation(info: Info) -> str | None:
    if not _isolated(info):
        return _text(info.get("note")) or "none: commands run on this machine with your permissions"
    parts = [_text(info["enforcement"])]
    if info.get("privileges"):
        parts.append(f"privileges: {info['privileges']}")
    if info.get("pid namespace"):
        parts.append(f"{info['pid namespace']} PID namespace")
    if len(parts) == 1:  # a box reached, not made: what isolates is the box's own doing
        parts.append("as strong as that box (owsandbox adds nothing inside it)")
    return ", ".join(parts)


def writes_to(info: Info) -> str | None:
    mounts = _mounts(info)
    if mounts is None:
        if not _isolated(info):
            return "anything you can write on this machine"
        return f"what the box's user may write, in the box (commands start in {info.get('cwd', '~')})"
    writable, private = [], []
    for path, what in mounts.items():
        if what.startswith("read-write"):
            detail = what.removeprefix("read-write").strip(" :()")
            writable.append(f"{path} ({detail})" if detail else path)
        elif what.startswith("private"):
            private.append(f"the home {path}" if "home" in what else path)
    found = ", ".join(writable) or "nothing of this machine"
    return found + (f"; private {', '.join(private)} (gone with the sandbox)" if private else "")


def hidden(info: Info) -> str | None:
    mounts = _mounts(info)
    if mounts is None:
        return None if _isolated(info) else "nothing: there is no sandbox"
    kinds: dict[str, list[str]] = {}
    for path, what in mounts.items():
        found = re.fullmatch(r"hidden \((.*)\)", what)
        if found:
            kinds.setdefault(found.group(1), []).append(path)
    named = [f"{len(paths)} {HIDDEN_KINDS.get(kind, (kind, kind))[len(paths) != 1]} ({_some(paths, shortest=True)})"
             for kind, paths in kinds.items()]
    return "everything of this machine but the mounts" + (f"; in them, {', '.join(named)}" if named else "")


def read_only_in_workspace(info: Info) -> str | None:
    mounts = _mounts(info)
    if mounts is None:
        return None
    workspace = _text(info.get("cwd"))
    found = []
    pinned = 0
    for path, what in mounts.items():
        if not workspace or not inside(path, workspace):  # no workspace named: nothing is in it
            continue
        if what.startswith("read-only ("):
            relative = path[len(workspace):].lstrip("/") or "."
            found.append(f"{relative} ({what[len('read-only ('):-1]})")
        elif what.startswith("top level read-only"):
            found.append("its top level (nothing new can be made there)")
        elif what.startswith("pinned"):
            pinned += 1
    if not found:
        return "nothing (no Python environment, git config or hooks found)"
    return _some(found) + (f"; {pinned} folder{'s' if pinned != 1 else ''} above them pinned (cannot be renamed or "
                           "removed)" if pinned else "")


def network(info: Info) -> str | None:
    if "network" not in info:
        return "this machine's own (no sandbox)" if not _isolated(info) else "the box's own network"
    note = _text(info.get("network note"))
    return f"{info['network']}: {note}" if note else _text(info["network"])


def limits(info: Info) -> str | None:
    given = info.get("limits")
    if not isinstance(given, Mapping):
        return "the box's own (owsandbox sets none there)" if _isolated(info) else "none (no sandbox)"
    words = {"memory": "memory", "processes": "processes", "/tmp": "/tmp", "/dev/shm": "/dev/shm", "cpu": "CPUs"}
    parts = [f"{words.get(name, name)} {_count(_text(value))}" for name, value in given.items()]
    enforced = _text(info.get("limits enforced by"))
    return ", ".join(parts) + (f"; enforced by {_short(enforced)}" if enforced else "")


def seccomp(info: Info) -> str | None:
    state = _text(info.get("seccomp"))
    found = re.match(r"on \((\d+) system calls refused", state)
    return f"on: {found.group(1)} system calls refused (keyrings, io_uring, bpf, mounts, …)" if found else state or None


def starts_in(info: Info) -> str | None:
    if "host folder" not in info:
        return None if _mounts(info) is not None else _text(info.get("cwd")) or None  # else in "Writes to"
    return f"{info.get('cwd')} of the box (this notebook's folder here: {info['host folder']})"


def shells(info: Info) -> str | None:
    current = _text(info.get("current shell")) or "main"
    names = [n for n in info.get("shells", []) if n != current]
    listed = ", ".join([f"{current} (current)", *names])
    terminal = _text(info.get("terminal"))
    return listed + (f": {terminal.replace('; ', ', ')}" if terminal else "")


def cell_limits(info: Info) -> str | None:
    time_limit = _text(info.get("cell time limit"))
    output = _text(info.get("output limit"))
    time_words = "no time limit" if time_limit in ("", "off") else f"at most {time_limit}"
    return time_words + (f"; output up to {output}" if output else "")


def sandbox(info: Info) -> str | None:
    if "instance_id" not in info:
        return _text(info.get("provider")) or None
    restarts = info.get("restarts") or 0
    up = f"up {info.get('uptime_s')} s"
    if info.get("kept"):  # the box of the kernel before a restart, its files and programs kept
        up = f"box kept from before the kernel's restart, {up}" + (f" (since {info['up_since']})"
                                                                  if info.get("up_since") else "")
    parts = [f"{info.get('provider')} provider", up,
             "no restarts of the box" if not restarts else f"box restarted {restarts} time{'s' * (restarts != 1)}"]
    if info.get("runner_version"):
        parts.append(f"runner {info['runner_version']}")
    return ", ".join(parts)


def lifetime(info: Info) -> str | None:
    ends = _text(info.get("dies with"))
    if "linger" in ends and ":" not in ends:  # bubblewrap's "its last client (linger)"
        return "ends with its kernel (after a short linger, for a kernel that restarts)"
    return f"ends with {ends}" if ends else None


def _field(name: str, then: Callable[[str], str] = lambda text: text) -> Callable[[Info], str | None]:
    return lambda info: then(_text(info[name])) if info.get(name) not in (None, "") else None


#: The summary's rows, in order: (label, what it says of a description, or None to leave the row out).
SUMMARY: list[tuple[str, Callable[[Info], str | None]]] = [
    ("Error", _field("error")),
    ("Isolation", isolation),
    ("Writes to", writes_to),
    ("Network", network),
    ("Limits", limits),
    ("Hidden from the box", hidden),
    ("Read-only in the workspace", read_only_in_workspace),
    ("Seccomp", seccomp),
    ("Starts in", starts_in),
    ("Image", _field("image")),
    ("Container", _field("container")),
    ("Server", _field("server")),
    ("Sandbox id", _field("sandbox id")),
    ("Expires", _field("expires")),
    ("Reached through", lambda info: _text(info.get("command") or info.get("endpoint")) or None),
    ("Environment passed in", _field("environment")),
    ("Shells", shells),
    ("Cell limits", cell_limits),
    ("Lifetime", lifetime),
    ("Sandbox", sandbox),
    ("Note", lambda info: _text(info.get("note")) if _isolated(info) else None),
]

FOOTER = "%sandbox --all shows every detail (mounts, cgroups, ids); %sandbox --json the raw description"


def summary(info: Info) -> list[tuple[str, str]]:
    """The few rows a user needs, from any provider's description (at most MAX_SUMMARY_ROWS)."""
    rows = []
    for label, say in SUMMARY:
        value = say(info)
        if value:
            rows.append((label, value))
    return rows[:MAX_SUMMARY_ROWS]


# -- everything ---------------------------------------------------------------------------------

def _words(key: str) -> str:
    return key.replace("_", " ")


def every_row(info: Info) -> list[tuple[str, str]]:
    """The description whole but its mounts (a table of their own), a nested dict flattened into one row
    of each entry (`limits: memory`), keys in words and seconds said as seconds."""
    rows: list[tuple[str, str]] = []
    for key, value in info.items():
        if key in ("mounts", "shells") or value is None:
            continue
        if isinstance(value, Mapping):
            rows += [(f"{_words(key)}: {_words(str(sub))}", _text(inner)) for sub, inner in value.items()]
        elif key.endswith("_s") and isinstance(value, (int, float)):
            rows.append((_words(key[:-2]), f"{value:g} s"))
        elif isinstance(value, (list, tuple)):
            rows.append((_words(key), ", ".join(map(str, value))))
        else:
            rows.append((_words(key), _text(value)))
    return rows


def as_json(info: Info) -> tuple[Any, str]:
    """The description as JSON data and as its text (what JSON cannot hold, as its text)."""
    text = json.dumps(info, indent=2, default=str)
    return json.loads(text), text
