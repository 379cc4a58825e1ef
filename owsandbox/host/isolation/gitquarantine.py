"""The host never runs what a box-made git configuration names.

A cell can make a repository of its own (`git init notes && git -C notes config core.fsmonitor
'…'`), replace the contents of a `.git`, add a `commondir` or `config.worktree` to an existing one,
point a `.git` file at a git folder it wrote, or lay out a bare repository (HEAD, objects/, refs/) in
any folder, which git finds by walking up. The user's next `git status`, `git log`, `git diff` or
`git commit` there, on this machine (or JupyterLab's git panel, or a prompt that shows the branch),
would run the programs that configuration names: `core.fsmonitor`, `core.pager`, `core.hooksPath`,
`diff.*.textconv`, `filter.*`, `!` aliases, hooks, and more with each git release.

**The mechanism: the host sanitises what the box wrote, at each cell's end and at the box's end.**
Every git folder in the workspace that the box could have written since it started (a bounded walk,
like the guard's) is made inert for this machine's git:

* in each config file git reads there (`config`, `config.worktree`, `worktrees/*/config.worktree`,
  submodules' `modules/**/config`, and the folder a `commondir` or a `.git` file leads to), only an
  **allowlist** of keys that never name a program stays (`ALLOWED`; remote URLs only when plain,
  never `ext::` or another `<helper>::`); every other key moves, as it was, into
  `config.owsandbox-quarantine` beside the file. A key git adds next year is moved too: by
  construction an allowlist, not a blocklist. The kept file is written back in one canonical form,
  so what git reads is exactly what was checked here (no parser differences);
* every entry of `hooks/` other than git's `*.sample` files moves to `owsandbox-quarantine/hooks/`;
* a `.git` file or link, or a `commondir`, that the box made and that leads where the box cannot
  write (another repository of the user's, a hidden folder of the home) is renamed in place to
  `NAME.owsandbox-quarantine`: the host's `git commit` there would commit into that repository;
* a link in place of a config or a hook moves whole, unread (it may lead to a file the box cannot
  read, which would then be copied where it can); every read, write and rename is relative to the
  git folder opened once with `O_NOFOLLOW`, and only in folders the box sees (never a hidden one);
* the cell's output says so in one dimmed note.

*What the box could have written* is decided from facts the box cannot forge: a file whose status
change time (`ctime`, which no unprivileged call sets back) is older than the box's start was not
written by it; the guard's read-only mounts of an existing repository (`config`, `hooks`, `info`)
are the user's own as long as the folder holding them is the one found at the start (same device
and inode: a mount point cannot be replaced from inside, its parent could be renamed). So a
repository's own configuration is never changed, while what the box adds beside it is caught. The
start time and those inodes are kept in this user's private state folder until the box's end has
been checked; a box that ended without that check (a kernel killed with SIGKILL) leaves its record,
and the next start checks everything written since the old box started before anything runs. Where
every process of the box is this machine's user with no capability (bubblewrap), a folder that user
neither owns nor may enter holds nothing the box wrote, and is not walked: a notebook in `/tmp`, run
by root, does not touch other users' repositories there. A folder of the user's that the box shut
to its owner (`chmod 000`) is given back its owner's read and search bits, and checked.

Why a sweep and not a hook in git: the host's git is the user's (any version, any front end: the
terminal, JupyterLab's panel, an editor, a shell prompt), so nothing can be put between it and the
files; what git reads has to be made safe where it lies. Why a walk rather than watching (inotify):
a watch per folder, set up and kept for 20,000 folders, races with the box's renames and has limits of
its own; the walk re-reads only folders whose ctime moved and costs one lstat a folder (about 25 ms for
10,000 folders, `benchmarks/git_quarantine.py`).

Why not the other mechanism the issue names (the box's writes owned by another uid, so that git's
`safe.directory` refuses the repository): an unprivileged bubblewrap maps the box to the user's own
uid; another owner needs subordinate uids (`newuidmap`, setuid) or idmapped mounts (privileged), and
would change the ownership of everything a cell writes in the user's folder. And `safe.directory`
looks at the owner of the work tree's top, not of each file git reads.

What this does not cover, said plainly: between a cell's writes and its end (or while a program the
box left running writes later) this machine's git can still meet the box's config, so the check runs
again at every cell's end and at the box's end; the walk goes to any depth but reads at most
`SCAN_FOLDERS` folders, breadth first (a box that makes more can bury a repository below them: the
note says so, once), and not into `NOT_DESCENDED` folders (`node_modules`, caches), except where a
`.git` file or `commondir` leads; a host user's own change to a config that the box could also write, made while
a box runs, is treated as the box's (it is moved, not lost). Only providers whose workspace is a
folder of this machine need it (bubblewrap, `container`); the `local` provider isolates nothing (a
cell there runs any program directly), so it has none.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import stat
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ...protocol.paths import inside
from ..privatedir import private_folder, runtime_root
from .guard import NOT_DESCENDED, SCAN_FOLDERS, BoxUser, Guard, GuardedWorkspace

log = logging.getLogger(__name__)

QUARANTINE_SUFFIX = ".owsandbox-quarantine"  # config.owsandbox-quarantine beside the config
QUARANTINE_FOLDER = "owsandbox-quarantine"  # in the git folder: hooks moved out of hooks/
RECORD_FILE = "git-quarantine.json"  # in this user's private state folder
CONFIG_BYTES = 1 << 20  # a larger config is moved whole, unread
START_MARGIN_NS = 100_000_000  # the kernel stamps files from a coarse clock: a start is taken this much earlier
GIT_DIRS_AT_MOST = 2_000  # git folders examined in one check

# -- configuration as text: git's own syntax, an allowlist of keys -----------------------------------

# (section, key) with any subsection: keys that name no program, no file to read or run, no helper.
ALLOWED_ANY = frozenset({
    ("remote", "url"), ("remote", "pushurl"), ("remote", "fetch"), ("remote", "push"),
    ("branch", "remote"), ("branch", "merge"), ("branch", "rebase"), ("branch", "pushremote"),
    ("branch", "description"),
    ("submodule", "url"), ("submodule", "path"), ("submodule", "active"), ("submodule", "branch"),
})
# (section, key) without a subsection.
ALLOWED = frozenset({
    ("core", "repositoryformatversion"), ("core", "filemode"), ("core", "bare"), ("core", "logallrefupdates"),
    ("core", "ignorecase"), ("core", "symlinks"), ("core", "precomposeunicode"), ("core", "autocrlf"),
    ("core", "eol"), ("core", "safecrlf"), ("core", "quotepath"), ("core", "sparsecheckout"),
    ("extensions", "objectformat"), ("extensions", "worktreeconfig"), ("extensions", "refstorage"),
    ("user", "name"), ("user", "email"), ("init", "defaultbranch"),
})
URL_KEYS = frozenset({("remote", "url"), ("remote", "pushurl"), ("submodule", "url")})
PLAIN_SCHEMES = frozenset({"https", "http", "git", "ssh", "git+ssh", "ssh+git", "file"})
REBASE_VALUES = frozenset({"true", "false", "merges"})  # not "interactive": that opens an editor


@dataclass(frozen=True)
class Entry:
    """One `key = value` of a config file, as git understands it: names lowercased, the value
    unescaped (None: a key alone, which git reads as true)."""

    section: str
    subsection: str | None
    key: str
    value: str | None

    @property
    def name(self) -> str:
        middle = f".{self.subsection}" if self.subsection is not None else ""
        return f"{self.section}{middle}.{self.key}"


class ConfigSyntaxError(ValueError):
    """Text git would refuse (or that this parser does not follow): moved whole, never partly kept."""


_SECTION_CHARS = re.compile(r"[A-Za-z0-9.-]+")
_KEY = re.compile(r"[A-Za-z][A-Za-z0-9-]*")
_ESCAPES = {"t": "\t", "b": "\b", "n": "\n", "\\": "\\", '"': '"'}


def parse_config(text: str) -> list[Entry]:
    """The entries of a git config file, following git's config.c: `[section]`, `[section "sub"]`,
    the old `[section.sub]`, `key = value` with quotes, `\\` escapes and line continuations, `#` and
    `;` comments, a key alone. Raises ConfigSyntaxError for what git would refuse."""
    text = text.replace("\r\n", "\n")
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\0" in text:
        raise ConfigSyntaxError("a NUL byte")
    at, end = 0, len(text)
    section: str | None = None
    subsection: str | None = None
    entries: list[Entry] = []
    while at < end:
        char = text[at]
        if char in " \t\n\v\f\r":
            at += 1
        elif char in "#;":
            at = _line_end(text, at)
        elif char == "[":
            section, subsection, at = _section(text, at + 1)
        elif char.isalpha():
            match = _KEY.match(text, at)
            assert match
            key, at = match.group().lower(), match.end()
            if section is None:
                raise ConfigSyntaxError(f"the key {key!r} before any section")
            while at < end and text[at] in " \t":
                at += 1
            if at >= end or text[at] == "\n" or text[at] in "#;":
                entries.append(Entry(section, subsection, key, None))
                at = _line_end(text, at)
                continue
            if text[at] != "=":
                raise ConfigSyntaxError(f"{key!r} is followed by neither '=' nor the line's end")
            value, at = _value(text, at + 1)
            entries.append(Entry(section, subsection, key, value))
        else:
            raise ConfigSyntaxError(f"unexpected {char!r}")
    return entries


def _line_end(text: str, at: int) -> int:
    found = text.find("\n", at)
    return len(text) if found < 0 else found + 1


def _section(text: str, at: int) -> tuple[str, str | None, int]:
    match = _SECTION_CHARS.match(text, at)
    if not match:
        raise ConfigSyntaxError("a section without a name")
    name, at = match.group(), match.end()
    if at < len(text) and text[at] == "]":
        if "." in name:  # the old [section.subsection]: its subsection is lowercased too
            section, _, sub = name.partition(".")
            if not section or not sub:
                raise ConfigSyntaxError(f"the section [{name}]")
            return section.lower(), sub.lower(), at + 1
        return name.lower(), None, at + 1
    if "." in name:
        raise ConfigSyntaxError(f"the section {name!r} with a subsection")
    while at < len(text) and text[at] in " \t":
        at += 1
    if at >= len(text) or text[at] != '"':
        raise ConfigSyntaxError(f"the section {name!r}: a subsection must be quoted")
    at += 1
    sub: list[str] = []
    while True:
        if at >= len(text) or text[at] == "\n":
            raise ConfigSyntaxError(f"the subsection of {name!r} does not end")
        char = text[at]
        if char == '"':
            at += 1
            break
        if char == "\\":
            at += 1
            if at >= len(text) or text[at] == "\n":
                raise ConfigSyntaxError(f"the subsection of {name!r} does not end")
            char = text[at]  # git keeps the escaped character, whatever it is
        sub.append(char)
        at += 1
    if at >= len(text) or text[at] != "]":
        raise ConfigSyntaxError(f"the section {name!r}: ']' expected after the subsection")
    return name.lower(), "".join(sub), at + 1


def _value(text: str, at: int) -> tuple[str, int]:
    """git's parse_value: spaces outside quotes become one space each, and only before more text."""
    out: list[str] = []
    quote = comment = False
    spaces = 0
    end = len(text)
    while True:
        if at >= end:
            if quote:
                raise ConfigSyntaxError("a quote does not end")
            return "".join(out), at
        char = text[at]
        at += 1
        if char == "\n":
            if quote:
                raise ConfigSyntaxError("a quote does not end on its line")
            return "".join(out), at
        if comment:
            continue
        if char in " \t\v\f\r" and not quote:
            if out:
                spaces += 1
            continue
        if not quote and char in "#;":
            comment = True
            continue
        out.extend(" " * spaces)
        spaces = 0
        if char == "\\":
            if at >= end:
                raise ConfigSyntaxError("a backslash at the end")
            char = text[at]
            at += 1
            if char == "\n":
                continue
            if char not in _ESCAPES:
                raise ConfigSyntaxError(f"the escape \\{char}")
            out.append(_ESCAPES[char])
            continue
        if char == '"':
            quote = not quote
            continue
        out.append(char)


def plain_url(value: str | None) -> bool:
    """A URL git fetches from without a program of the config's choosing: none of `ext::` or any other
    `<helper>::address` (a remote helper), no option-like host, no control characters."""
    if not value or any(ord(c) < 32 or ord(c) == 127 for c in value) or "::" in value:
        return False
    if value.startswith("-"):
        return False
    scheme, sep, rest = value.partition("://")
    if sep:
        return scheme.lower() in PLAIN_SCHEMES and not rest.startswith("-")
    return True  # scp-like user@host:path, or a path


def allowed(entry: Entry) -> bool:
    """Whether git may keep reading this key from a configuration the box wrote."""
    pair = (entry.section, entry.key)
    if entry.subsection is None:
        known = pair in ALLOWED
    else:
        known = pair in ALLOWED_ANY
    if not known:
        return False
    if pair in URL_KEYS:
        return plain_url(entry.value)
    if pair == ("branch", "rebase"):
        return (entry.value or "true").lower() in REBASE_VALUES
    return True


def _quoted(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    escaped = escaped.replace("\b", "\\b")
    return f'"{escaped}"'


def _shown_value(value: str) -> str:
    """As `git config` writes it: bare when that reads back the same, else quoted."""
    if value and value == value.strip() and not any(c in value for c in '"\\#;\n\t\b\r\v\f') and "  " not in value:
        return value
    return _quoted(value)


def render(entries: Iterable[Entry]) -> str:
    """Entries in one canonical form, as `git config` writes them: a header whenever the section
    changes, then `\\tkey = value`."""
    lines: list[str] = []
    current: tuple[str, str | None] | None = None
    for entry in entries:
        if any(ord(c) < 32 for c in entry.subsection or ""):
            raise ConfigSyntaxError("a subsection with a control character")
        if (entry.section, entry.subsection) != current:
            current = (entry.section, entry.subsection)
            if entry.subsection is None:
                lines.append(f"[{entry.section}]")
            else:
                sub = entry.subsection.replace("\\", "\\\\").replace('"', '\\"')
                lines.append(f'[{entry.section} "{sub}"]')
        lines.append(f"\t{entry.key}" if entry.value is None else f"\t{entry.key} = {_shown_value(entry.value)}")
    return "".join(line + "\n" for line in lines)


@dataclass
class Sanitised:
    """The answer for one config text: what git may keep reading, and what moved."""

    kept: str  # the text to write back (canonical), or the text itself when nothing changes
    moved: str  # the text to keep beside it, never read by git ("" when nothing moved)
    moved_names: list[str]  # the keys moved, or ["(the whole file: why)"]
    changed: bool  # whether the file must be written back


def sanitise_config(text: str) -> Sanitised:
    """Text in, text out: the allowed keys kept in canonical form, the others moved. Text git would
    refuse, or that does not read back as parsed, moves whole."""
    try:
        entries = parse_config(text)
        kept = [entry for entry in entries if allowed(entry)]
        gone = [entry for entry in entries if not allowed(entry)]
        kept_text = render(kept)
        if parse_config(kept_text) != kept:  # what git will read is exactly what was checked
            raise ConfigSyntaxError("the kept keys do not read back as written")
        moved_text = render(gone)
    except ConfigSyntaxError as exc:
        return Sanitised("", text, [f"(the whole file: {exc})"], True)
    names = list(dict.fromkeys(entry.name for entry in gone))
    return Sanitised(kept_text, moved_text, names, kept_text != text)


# -- what the box could have written ---------------------------------------------------------------


@dataclass
class Protection:
    """The facts, taken at a box's start, that tell the box's writes from the user's files: the start
    time, and for each read-only mount of a repository's config/hooks/info its parent folder's
    (device, inode) then."""

    since_ns: int
    protected: dict[str, tuple[int, int]] = field(default_factory=dict)
    hidden: list[str] = field(default_factory=list)  # what the box does not see: never walked or touched
    read_only: dict[str, tuple[int, int]] = field(default_factory=dict)  # other read-only folders (environments):
    # not walked while they are the folder (device, inode) mounted at the start

    @classmethod
    def at_start(cls, guard: Guard, since_ns: int | None = None) -> Protection:
        found: dict[str, tuple[int, int]] = {}
        folders: dict[str, tuple[int, int]] = {}
        for path in guard.read_only:
            if os.path.basename(os.path.dirname(path)) == ".git" or "git" in guard.why.get(path, ""):
                parent = os.path.realpath(os.path.dirname(path))
                try:
                    info = os.lstat(parent)
                except OSError:
                    continue
                found[os.path.join(parent, os.path.basename(path))] = (info.st_dev, info.st_ino)
            else:
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    folders[os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))] = (
                        info.st_dev, info.st_ino)
        since = time.time_ns() - START_MARGIN_NS if since_ns is None else since_ns
        return cls(since, found, [os.path.realpath(path) for path in guard.hidden], folders)

    def to_json(self) -> dict:
        return {"since_ns": self.since_ns, "protected": {p: list(v) for p, v in self.protected.items()},
                "hidden": self.hidden, "read_only": {p: list(v) for p, v in self.read_only.items()}}

    @classmethod
    def from_json(cls, data: object) -> Protection | None:
        if not isinstance(data, dict) or not isinstance(data.get("since_ns"), int):
            return None
        hidden = [p for p in data.get("hidden") or [] if isinstance(p, str)]
        return cls(data["since_ns"], _identities(data.get("protected")), hidden, _identities(data.get("read_only")))

    def merged(self, other: Protection) -> Protection:
        """Both boxes' writes: the earlier start, only what both protected, what either hid."""
        both = {p: v for p, v in self.protected.items() if other.protected.get(p) == v}
        folders = {p: v for p, v in self.read_only.items() if other.read_only.get(p) == v}
        return Protection(min(self.since_ns, other.since_ns), both, sorted({*self.hidden, *other.hidden}), folders)

    def is_hidden(self, path: str) -> bool:
        return any(inside(path, hidden) for hidden in self.hidden)

    def mount_holding(self, path: str) -> str | None:
        """The protected path that is `path` or holds it, when its parent folder is still the one found
        at the start (then the box could not have replaced or changed it)."""
        for protected, (dev, ino) in self.protected.items():
            if inside(path, protected):
                try:
                    info = os.lstat(os.path.dirname(protected))
                except OSError:
                    return None
                return protected if (info.st_dev, info.st_ino) == (dev, ino) else None
        return None

    def box_may_have_written(self, path: str, info: os.stat_result) -> bool:
        """Whether the entry at `path` (its `lstat` is `info`) may be the box's: not in a protected mount,
        and changed (made, written, renamed, relinked) since the box started. A link is never read
        through here, whatever its age: it is moved whole when new."""
        if self.mount_holding(path) is not None:
            return False
        return info.st_ctime_ns >= self.since_ns


def _identities(data: object) -> dict[str, tuple[int, int]]:
    if not isinstance(data, dict):
        return {}
    return {p: (v[0], v[1]) for p, v in data.items()
            if isinstance(p, str) and isinstance(v, list) and len(v) == 2 and all(isinstance(n, int) for n in v)}


# -- the check ---------------------------------------------------------------------------------------


@dataclass
class Report:
    """What one check did, for the cell's note."""

    repositories: dict[str, list[str]] = field(default_factory=dict)  # git folder → what moved out
    quarantine: dict[str, str] = field(default_factory=dict)  # git folder → where it went
    git_dirs: int = 0
    folders: int = 0
    seconds: float = 0.0
    unchecked: bool = False  # the walk stopped at SCAN_FOLDERS with folders left
    say_unchecked: bool = False  # and the note says so (once a box)

    def add(self, git_dir: str, what: str, where: str) -> None:
        self.repositories.setdefault(git_dir, []).append(what)
        self.quarantine.setdefault(git_dir, where)

    def note(self, workspace: str) -> str | None:
        """One line for the cell, or None when there is nothing to say."""
        limit = (f"[git: the workspace has more than {SCAN_FOLDERS:,} folders, and only the first {SCAN_FOLDERS:,} "
                 "(breadth first) are checked for git settings the sandbox wrote: run this machine's git only in "
                 "folders near the top, or in repositories you made]") if self.say_unchecked else None
        if not self.repositories:
            return limit
        parts = []
        for git_dir, moved in list(self.repositories.items())[:4]:
            shown = ", ".join(moved[:5]) + (f" and {len(moved) - 5} more" if len(moved) > 5 else "")
            parts.append(f"{_relative(git_dir, workspace)} ({shown})")
        more = f" and {len(self.repositories) - 4} more" if len(self.repositories) > 4 else ""
        moved = ("[git: what a configuration written in the sandbox would make this machine's git run was moved "
                 f"aside: {'; '.join(parts)}{more}. Kept in config{QUARANTINE_SUFFIX} beside each config, hooks in "
                 f"{QUARANTINE_FOLDER}/]")
        return moved if limit is None else f"{moved}\n{limit}"


def _relative(path: str, workspace: str) -> str:
    return os.path.relpath(path, workspace) if inside(path, workspace) else path


def start_checks(owner: GuardedWorkspace, folder: str, guard: Guard) -> None:
    """A provider's box starts (or is adopted) on `folder`, whose guard is `guard`: its checks open."""
    state = getattr(owner, "state_dir", None)
    box_id, box_user = (str(state) if state else None), owner.box_user()
    try:
        owner.git_quarantine, report = GitQuarantine.open(folder, guard, runtime_root(avoid=folder), box_id, box_user)
    except OSError as exc:  # no record to keep (its folder is not safe): the checks run all the same
        log.warning("the git check keeps no record of this box (%s): a box killed before its end is checked "
                    "at the next start if it is killed before its end", exc)
        owner.git_quarantine, report = GitQuarantine.open(folder, guard, None, box_id, box_user)
    owner.git_quarantine.pending_note = report.note(folder) if report is not None else None


def check_after_cell(owner: GuardedWorkspace) -> str | None:
    """A cell has ended: the check, and the note for its output (None when there is nothing to say)."""
    owner.workspace_guard()  # opens the checks, when the guard was found again
    quarantine = owner.git_quarantine
    if quarantine is None:
        return None
    said, quarantine.pending_note = quarantine.pending_note, None
    now = quarantine.check().note(owner.guarded_folder())
    return "\n".join(note for note in (said, now) if note) or None


def end_checks(owner: GuardedWorkspace) -> None:
    """The provider's box has ended: the last check (said in the log), and its record dropped."""
    quarantine, owner.git_quarantine = owner.git_quarantine, None
    if quarantine is not None:
        try:
            quarantine.close()
        except OSError as exc:
            log.warning("the git check at the sandbox's end failed: %s", exc)


class GitQuarantine:
    """One workspace's checks while a box runs on it."""

    def __init__(self, workspace: str, protection: Protection, record: Path | None = None,
                 box_id: str | None = None, box_user: BoxUser | None = None) -> None:
        self.workspace = os.path.realpath(workspace)
        self.protection = protection
        self.record = record
        self.box_id = box_id or uuid.uuid4().hex
        self.box_user = box_user  # the one user every process of the box is, or None: any folder may be its
        self._listings: dict[str, _Listing] = {}  # the last walk's, by folder
        self._checking = threading.Lock()  # cells of two subshells may end at once
        self._said_unchecked = False
        self.pending_note: str | None = None  # what the check at the start did, for the first cell

    # -- the record of unfinished boxes ----------------------------------------------------------

    @classmethod
    def open(cls, workspace: str, guard: Guard, private_root: Path | None, box_id: str | None = None,
             box_user: BoxUser | None = None) -> tuple[GitQuarantine, Report | None]:
        """At a box's start (or a kernel's adopting a lingering box, with its `box_id`): this box's
        protection (the one recorded at its start, when `box_id` is in the record already). When another
        box on this workspace left its record (it ended unchecked, or runs still), everything it could
        have written is checked now, before this box runs, and this box's checks go back to its start;
        the report of that check is returned."""
        workspace = os.path.realpath(workspace)
        mine = Protection.at_start(guard)
        if private_root is None:
            return cls(workspace, mine, None, box_id, box_user), None
        record = private_root / RECORD_FILE
        earlier: Protection | None = None
        with _locked(record):
            noted = _read_record(record)
            boxes = noted.setdefault(workspace, {})
            for other_id, data in list(boxes.items()):
                found = Protection.from_json(data)
                if other_id == box_id:
                    mine = found or mine  # a lingering box adopted: its own start
                elif found is not None:
                    earlier = found if earlier is None else earlier.merged(found)
                if other_id != box_id:
                    del boxes[other_id]  # taken over: checked below, and from now on with this box
            quarantine = cls(workspace, mine if earlier is None else mine.merged(earlier), record, box_id, box_user)
            boxes[quarantine.box_id] = quarantine.protection.to_json()
            _write_record(record, noted)
        return quarantine, quarantine.check() if earlier is not None else None

    def close(self) -> Report:
        """At the box's end: the last check, then its record is dropped."""
        report = self.check()
        if self.record is not None:
            with _locked(self.record):
                noted = _read_record(self.record)
                boxes = noted.get(self.workspace, {})
                boxes.pop(self.box_id, None)
                if not boxes:
                    noted.pop(self.workspace, None)
                _write_record(self.record, noted)
        return report

    # -- finding and sanitising ------------------------------------------------------------------

    def check(self) -> Report:
        """Walk the workspace (bounded as the guard's scan), and make every git folder the box could have
        written inert for this machine's git."""
        started = time.monotonic()
        report = Report()
        seen: set[str] = set()
        with self._checking:
            for git_dir in self._git_dirs(report):
                self._examine(git_dir, report, seen)
        report.seconds = time.monotonic() - started
        if report.unchecked and not self._said_unchecked:
            report.say_unchecked = self._said_unchecked = True
        if report.repositories:
            log.info("git settings written in the sandbox moved aside: %s", report.repositories)
        return report

    def _git_dirs(self, report: Report) -> Iterable[str]:
        """Breadth first, not following links: folders named `.git`, the targets of `.git` files and
        folders laid out as git folders (a bare repository, a linked worktree's folder). A folder whose
        status change time and inode are those of the last walk has the same entries (making, removing
        or renaming one changes them, and no call sets them back): its listing is not read again."""
        known, listings = self._listings, {}
        lstat, is_dir, join = os.lstat, stat.S_ISDIR, os.path.join
        skipped = set(self.protection.hidden) | set(self.protection.read_only)
        read_only = self.protection.read_only
        level = [self.workspace]
        while level:
            below: list[str] = []
            for folder in level:
                if report.folders >= SCAN_FOLDERS:
                    report.unchecked = True
                    break
                report.folders += 1
                try:
                    info = lstat(folder)
                except OSError:
                    continue
                if not is_dir(info.st_mode) or (folder != self.workspace and not self._box_reaches(info)):
                    continue
                if folder in skipped and (folder not in read_only or read_only[folder] == (info.st_dev, info.st_ino)):
                    continue  # hidden from the box, or a read-only environment it could not write in
                listing = known.get(folder)
                if listing is None or listing.key != (info.st_ino, info.st_ctime_ns):
                    listing = _list(folder, (info.st_ino, info.st_ctime_ns))
                    if listing is None and (opened := self._open_shut_folder(folder, info)) is not None:
                        listing = _list(folder, (opened.st_ino, opened.st_ctime_ns))
                    if listing is None:
                        continue
                listings[folder] = listing
                if listing.git_layout:
                    yield folder
                    continue
                if listing.dot_git == "folder":
                    yield join(folder, ".git")
                elif listing.dot_git == "other":  # a file naming the git folder, or a link to one
                    path = join(folder, ".git")
                    target = path if os.path.isdir(path) else _gitfile_target(path)  # its text can change in place
                    if target is not None and self._leads_out(target):
                        self._set_aside_redirection(folder, ".git", report)
                    elif target is not None:
                        yield target
                below.extend(listing.folders)
            if below and report.folders >= SCAN_FOLDERS:
                report.unchecked = True
            level = below if report.folders < SCAN_FOLDERS else []
        self._listings = listings

    def _examine(self, git_dir: str, report: Report, seen: set[str]) -> None:
        """One git folder, the folder its `commondir` leads to, and its worktrees' and submodules'. Only
        folders of the workspace the box sees (a link may lead anywhere: to a hidden folder of the home,
        to this user's own git config); each opened once, and everything in it done relative to that
        descriptor, following no link, so that nothing the box renames meanwhile redirects a write."""
        pending = [git_dir]
        while pending and len(seen) < GIT_DIRS_AT_MOST:
            folder = os.path.realpath(pending.pop())
            if folder in seen:
                continue
            seen.add(folder)
            try:
                fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                try:
                    opened = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    continue
                if not inside(opened, self.workspace) or self.protection.is_hidden(opened):
                    continue
                if opened != self.workspace and not self._box_reaches(os.fstat(fd)):
                    continue  # another user's git folder the box cannot enter: nothing in it is the box's
                report.git_dirs += 1
                common = _commondir(fd)
                if common is not None and self._leads_out(os.path.join(opened, common)):
                    self._set_aside_redirection(opened, "commondir", report)
                elif common is not None:
                    pending.append(os.path.join(opened, common))
                for name in ("config", "config.worktree"):
                    try:
                        self._sanitise_config(opened, fd, name, report)
                    except OSError as exc:  # a name squatted meanwhile, say: the file itself goes
                        log.warning("git check: %s/%s moved whole (%s)", opened, name, exc)
                        if _move_aside(fd, name, ()):
                            report.add(opened, f"{name} (whole)", os.path.join(opened, QUARANTINE_FOLDER))
                self._quarantine_hooks(opened, fd, report)
            finally:
                os.close(fd)
            for holder in ("worktrees", "modules"):
                pending.extend(_subfolders(os.path.join(opened, holder), holder == "modules"))

    def _open_shut_folder(self, folder: str, info: os.stat_result) -> os.stat_result | None:
        """A folder of this user's whose mode the box may have set (changed since its start) to one its
        owner cannot read or enter (`chmod 000`): its owner's read and search bits given back, so what it
        holds is checked (the box could open it again, and so could the user, then run git in it). Its
        `lstat` after, or None when it is not such a folder. Done through a descriptor of that very folder
        (no link followed), so that a rename meanwhile changes the mode of nothing else."""
        uid = os.getuid()
        if uid == 0 or info.st_uid != uid or info.st_mode & 0o500 == 0o500:
            return None  # root reads it as it is; another user's is not the box's; open, it failed otherwise
        if not self.protection.box_may_have_written(folder, info):
            return None
        try:
            fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            held = os.fstat(fd)
            if (held.st_dev, held.st_ino) != (info.st_dev, info.st_ino):
                return None
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(held.st_mode) | 0o500)
            log.info("git check: %s was shut to its owner (mode %o): opened to be checked", folder,
                     stat.S_IMODE(held.st_mode))
            return os.fstat(fd)
        except OSError:
            return None
        finally:
            os.close(fd)

    def _box_reaches(self, info: os.stat_result) -> bool:
        """Whether the box may have written inside the folder whose `lstat` is `info`: it owns it (and so
        could open it to itself), or may enter it. Unknown which user the box is: any folder."""
        return self.box_user is None or self.box_user.may_write_below(info)

    def _leads_out(self, path: str) -> bool:
        """Whether a git folder named by a `.git` file or link, or a `commondir`, is one the box does not
        see or cannot write (out of the workspace, or hidden in it): this machine's git would work on
        another repository of the user's (commit into it, check out over it) at the box's word."""
        real = os.path.realpath(path)
        return not inside(real, self.workspace) or self.protection.is_hidden(real)

    def _set_aside_redirection(self, folder: str, name: str, report: Report) -> None:
        """`name` in `folder` (a `.git` file or link, a `commondir`) leads out of what the box sees: when
        the box made it, renamed to NAME.owsandbox-quarantine where it is, so git no longer follows it."""
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
            if not inside(opened, self.workspace) or self.protection.is_hidden(opened):
                return
            info = os.lstat(name, dir_fd=fd)
            if not self.protection.box_may_have_written(os.path.join(opened, name), info):
                return  # the user's own
            target, n = name + QUARANTINE_SUFFIX, 1
            while os.path.lexists(os.path.join(opened, target)):
                n += 1
                target = f"{name}{QUARANTINE_SUFFIX}.{n}"
            os.rename(name, target, src_dir_fd=fd, dst_dir_fd=fd)
            report.add(opened, f"{name} (leads where the sandbox cannot write)", os.path.join(opened, target))
        except OSError as exc:
            log.warning("git check: %s/%s not set aside: %s", folder, name, exc)
        finally:
            os.close(fd)

    def _sanitise_config(self, git_dir: str, fd: int, name: str, report: Report) -> None:
        path = os.path.join(git_dir, name)
        try:
            info = os.lstat(name, dir_fd=fd)
        except OSError:
            return
        if not self.protection.box_may_have_written(path, info):
            return
        text = _read_small(fd, name) if stat.S_ISREG(info.st_mode) else None
        if text is None:  # a link (never read through), a fifo, a folder, too large: moved whole, unread
            if _move_aside(fd, name, ()):
                report.add(git_dir, f"{name} (whole: not a plain file)", os.path.join(git_dir, QUARANTINE_FOLDER))
            return
        answer = sanitise_config(text)
        if not answer.changed:
            return
        if answer.moved:
            header = f"# moved from {name}, written in the sandbox ({time.ctime()})\n"
            _append(fd, name + QUARANTINE_SUFFIX, header + answer.moved + "\n")
        _replace(fd, name, answer.kept)
        for moved in answer.moved_names:
            report.add(git_dir, moved if name == "config" else f"{name}: {moved}", path + QUARANTINE_SUFFIX)

    def _quarantine_hooks(self, git_dir: str, fd: int, report: Report) -> None:
        hooks = os.path.join(git_dir, "hooks")
        try:
            info = os.lstat("hooks", dir_fd=fd)
        except OSError:
            return
        if not stat.S_ISDIR(info.st_mode):  # a link or a file in place of hooks/: moved whole
            if self.protection.box_may_have_written(hooks, info) and _move_aside(fd, "hooks", ()):
                report.add(git_dir, "hooks (not a folder)", os.path.join(git_dir, QUARANTINE_FOLDER))
            return
        if self.protection.mount_holding(hooks) is not None:
            return
        try:
            hooks_fd = os.open("hooks", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return
        try:
            for name in sorted(os.listdir(hooks_fd)):
                if name.endswith(".sample"):
                    continue
                try:
                    entry = os.lstat(name, dir_fd=hooks_fd)
                except OSError:
                    continue
                if self.protection.box_may_have_written(os.path.join(hooks, name), entry) and _move_aside(
                        hooks_fd, name, ("hooks",), fd):
                    report.add(git_dir, f"hooks/{name}", os.path.join(git_dir, QUARANTINE_FOLDER, "hooks"))
        finally:
            os.close(hooks_fd)


@dataclass(frozen=True, slots=True)
class _Listing:
    """What the walk needs of a folder's entries, and the folder's (inode, ctime) when they were read."""

    key: tuple[int, int]
    folders: tuple[str, ...]  # the paths to walk into: not links, not NOT_DESCENDED, not `.git`
    git_layout: bool  # HEAD with objects/ and refs/ (a bare repository) or with commondir (a worktree's)
    dot_git: str | None  # "folder", "other" (a file or a link) or None


def _list(folder: str, key: tuple[int, int]) -> _Listing | None:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return None
    names = {entry.name for entry in entries}
    layout = "HEAD" in names and (("objects" in names and "refs" in names) or "commondir" in names)
    folders: list[str] = []
    dot_git = None
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if entry.name == ".git":
            dot_git = "folder" if is_dir else "other"
        elif is_dir and entry.name not in NOT_DESCENDED:
            folders.append(entry.path)
    return _Listing(key, tuple(folders), layout, dot_git)


def _gitfile_target(path: str) -> str | None:
    """The folder a `.git` file names (`gitdir: …`, relative to the file's folder); a link is taken
    as the folder it leads to, which `_examine` checks."""
    text = _read_small(None, path, 4096)
    if text is None or not text.startswith("gitdir:"):
        return None
    target = text[len("gitdir:"):].strip()
    return os.path.join(os.path.dirname(path), target) if target else None


def _commondir(fd: int) -> str | None:
    text = _read_small(fd, "commondir", 4096)
    if text is None or not text.strip():
        return None
    return text.strip()


def _subfolders(holder: str, nested: bool) -> list[str]:
    """The git folders under `worktrees/` (one level) or `modules/` (submodules' names may have
    slashes: any depth, a few hundred at most)."""
    found: list[str] = []
    queue = [holder]
    while queue and len(found) < 500:
        folder = queue.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if os.path.lexists(os.path.join(entry.path, "HEAD")):
                found.append(entry.path)
            elif nested and entry.name not in ("objects", "refs", "logs"):
                queue.append(entry.path)
    return found


def _read_small(fd: int | None, name: str, limit: int = CONFIG_BYTES) -> str | None:
    """A regular file's text (`name` in the folder open as `fd`), or None: never through a link, never
    blocking on a fifo or a device."""
    try:
        file = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    try:
        info = os.fstat(file)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = os.read(file, limit + 1)
    except OSError:
        return None
    finally:
        os.close(file)
    if len(data) > limit:
        return None
    return data.decode("utf-8", "surrogateescape")


def _replace(fd: int, name: str, text: str) -> None:
    """Write `text` in place of `name` in the folder open as `fd` (what was there is replaced, never
    followed)."""
    temporary = f"{name}.owsandbox-{uuid.uuid4().hex[:12]}.tmp"
    file = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
    try:
        os.write(file, text.encode("utf-8", "surrogateescape"))
    finally:
        os.close(file)
    os.replace(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)


def _append(fd: int, name: str, text: str) -> None:
    """Append to `name` in the folder open as `fd`; whatever squats the name as other than a plain file
    (a link, a folder, a fifo) is moved aside first."""
    for _ in range(3):
        try:
            file = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                           0o600, dir_fd=fd)
        except OSError:
            _move_aside(fd, name, ())
            continue
        try:
            if not stat.S_ISREG(os.fstat(file).st_mode):
                _move_aside(fd, name, ())
                continue
            os.write(file, text.encode("utf-8", "surrogateescape"))
            return
        finally:
            os.close(file)
    raise OSError(f"{name} keeps being replaced")


def _move_aside(fd: int, name: str, under: tuple[str, ...], git_fd: int | None = None) -> bool:
    """Rename `name` (in the folder open as `fd`) into the git folder's QUARANTINE_FOLDER (and the
    folders `under` in it), under a free name: every folder on the way opened without following links
    (one planted as a link is moved aside itself), so the rename cannot land outside the git folder."""
    try:
        folder = _quarantine_folder(fd if git_fd is None else git_fd, (QUARANTINE_FOLDER, *under))
    except OSError as exc:
        log.warning("git check: no quarantine folder for %s: %s", name, exc)
        return False
    try:
        target, n = name, 1
        while True:
            try:
                os.lstat(target, dir_fd=folder)
            except FileNotFoundError:
                break
            n += 1
            target = f"{name}.{n}"
        os.rename(name, target, src_dir_fd=fd, dst_dir_fd=folder)
        return True
    except OSError as exc:
        log.warning("git check: %s not moved aside: %s", name, exc)
        return False
    finally:
        os.close(folder)


def _quarantine_folder(fd: int, names: tuple[str, ...]) -> int:
    current = os.dup(fd)
    try:
        for name in names:
            for _ in range(3):
                try:
                    os.mkdir(name, 0o700, dir_fd=current)
                except FileExistsError:
                    pass
                try:
                    below = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
                    break
                except OSError:  # a link or a file in its place: moved out of the way, under a name of its own
                    os.rename(name, f"{name}.{uuid.uuid4().hex[:8]}", src_dir_fd=current, dst_dir_fd=current)
            else:
                raise OSError(f"{name} keeps being replaced")
            os.close(current)
            current = below
        return current
    except BaseException:
        os.close(current)
        raise


# -- the record --------------------------------------------------------------------------------------


class _locked:
    """An exclusive lock beside the record, for kernels starting on the same workspace at once."""

    def __init__(self, record: Path) -> None:
        self.path = record.with_suffix(".lock")

    def __enter__(self) -> None:
        private_folder(self.path.parent)  # still this user's own, 0700: not a folder swapped in meanwhile
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *_: object) -> None:
        os.close(self.fd)


def _read_record(record: Path) -> dict:
    try:
        noted = json.loads(record.read_text())
    except (OSError, ValueError):
        return {}
    return {w: b for w, b in noted.items() if isinstance(b, dict)} if isinstance(noted, dict) else {}


def _write_record(record: Path, noted: dict) -> None:
    noted = {w: b for w, b in noted.items() if b}
    temporary = record.with_suffix(".tmp")
    temporary.write_text(json.dumps(noted))
    os.replace(temporary, record)
