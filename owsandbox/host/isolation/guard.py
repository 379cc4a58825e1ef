"""What in a workspace the box may read but not change, or not see at all: what this machine runs or
loads by itself.

The workspace is the user's data and the box may change it. But some files in it are run or loaded
by the host without anyone asking: when the workspace is (or holds) the home, its shell start-up
files, `~/.local/bin` (first on Debian's PATH), `~/.local/lib/.../site-packages` (a `.pth` file there
runs in every later `python3`), `~/.jupyter` and `~/.ipython` (config and start-up code of the next
server or kernel), kernelspecs; in any workspace, a Python environment's `site-packages` and `bin/`
(the kernel's own among them, in the quick start's layout), `.git/config` and `.git/hooks` (run by
the next `git commit`), direnv's `.envrc`, editors' project settings, and sockets of the host's
services (a notebook opened in `/tmp`: tmux, ssh-agent, X). A box that could write those would run
code on the host the next time the user does something ordinary there. So:

* every top-level dot entry of the home is hidden (not a list of known ones): an empty, read-only
  folder or file in its place; `OWSANDBOX_HOME_VISIBLE=.name,...` shows the ones named. And nothing
  new can be made at the home's top level: a `~/.local` or `~/.bash_profile` that did not exist yet
  would be loaded as surely as one that did, and so would `~/bin` (on Debian's PATH when it exists).
  The home's existing entries other than dot entries and `bin` stay writable;
* Python environments (`pyvenv.cfg`, `conda-meta/`), the kernel's own Python paths, `.git/config`,
  `.git/hooks` (and a `core.hooksPath` in the workspace), `.envrc`, `.vscode/` and `.idea/` found by
  a bounded scan at start are read-only, except environments the box made itself in an earlier
  session: the host notes those, in its own private folder, when a sandbox ends, so `python3 -m venv`
  and `pip install` in a cell keep working. `OWSANDBOX_WRITABLE=.venv,...` opts paths out;
* sockets found by the scan are hidden, and so is this user's private state folder when the
  workspace holds it;
* a protected path is protected whole: every folder between the workspace's top and a protected path,
  and the `.git` folder of every repository as a unit, is **pinned** (bound onto itself), so the box
  cannot rename, remove or replace it (a mount point cannot be renamed: `EBUSY`) and plant a new
  `proj/.venv/bin/python` or `.git/config` where the old ones were;
* nothing is ever bound through a link: a top-level link of the home is left as it is (the box sees
  its own view of where it points); a dot link whose target is in the workspace hides that target;
* the kernel's own environment and Python paths are never opened by `OWSANDBOX_WRITABLE`, and a
  workspace that is itself on the kernel's Python path (an editable install) gets a read-only top
  level, as the home does: no `sitecustomize.py` or new module can be made there.

This module decides; the providers turn its answer into mounts.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ... import settings
from ...protocol.paths import inside
from ...protocol.words import noun
from ..privatedir import runtime_candidates, runtime_root

if TYPE_CHECKING:
    from .gitquarantine import GitQuarantine

HOME_VISIBLE_ENV = settings.HOME_VISIBLE
WRITABLE_ENV = settings.WRITABLE
SCAN_DEPTH = 6  # folders below the workspace: ~/src/org/repo/.venv is 4
SCAN_FOLDERS = 20_000  # at most this many folders are read at start
NOT_DESCENDED = frozenset({"node_modules", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"})
EDITOR_SETTINGS = (".vscode", ".idea")
BOX_MADE_FILE = "box-made-environments.json"


def _names(env_value: str | None) -> list[str]:
    return [name.strip() for name in (env_value or "").split(",") if name.strip()]


@dataclass
class Guard:
    """The answer for one workspace at one start: what to hide, what to make read-only, and why."""

    workspace: str
    hidden: list[str] = field(default_factory=list)  # an empty read-only folder or file in their place
    read_only: list[str] = field(default_factory=list)  # bound over themselves, read-only
    why: dict[str, str] = field(default_factory=dict)  # path → what it is
    environments: list[str] = field(default_factory=list)  # Python environments found (read-only or not)
    box_made: list[str] = field(default_factory=list)  # environments left writable: the box made them
    opted_out: list[str] = field(default_factory=list)  # left writable by OWSANDBOX_WRITABLE
    home_hidden: list[str] = field(default_factory=list)  # the home's dot entries among `hidden`
    home_top: str | None = None  # a home whose top level is read-only: nothing new can be made there
    home_writable: list[str] = field(default_factory=list)  # its entries that stay writable
    tops: list[str] = field(default_factory=list)  # folders whose top level is read-only (the home's among them)
    top_writable: list[str] = field(default_factory=list)  # their existing entries, bound writable
    pinned: list[str] = field(default_factory=list)  # bound onto themselves (cannot be renamed), parents first
    units: list[str] = field(default_factory=list)  # `.git` folders pinned as a whole
    links: dict[str, str] = field(default_factory=dict)  # top-level links left unbound, and what they are
    refused: list[str] = field(default_factory=list)  # named by OWSANDBOX_WRITABLE, kept read-only (the kernel's)
    unscanned: list[str] = field(default_factory=list)  # folders the scan did not read (its limits)
    scanned_folders: int = 0
    on_python_path: bool = False  # the workspace itself is on this machine's Python path

    def hide(self, path: str, why: str) -> None:
        if path not in self.why:
            self.hidden.append(path)
            self.why[path] = why

    def protect(self, path: str, why: str, writable: Iterable[str]) -> None:
        if path in self.why or any(inside(path, folder) for folder in [*self.read_only, *self.hidden]):
            return
        if any(inside(path, opted) for opted in writable):
            self.opted_out.append(path)
            return
        self.read_only.append(path)
        self.why[path] = why

    def seal(self, folder: str, why: str) -> None:
        """`folder`'s top level read-only: nothing new can be made there. Its existing entries go in
        `top_writable` (each bound over itself, writable, which pins it too)."""
        if folder not in self.tops:
            self.tops.append(folder)
            self.why.setdefault(folder, why)

    def settle(self) -> None:
        """Drop what lies inside a hidden path: the empty folder in its place covers it already, and a
        mount inside it could not be made (its destination is not in the empty folder). A state folder
        of this user's in `~/.cache`, with the home as the workspace, was hidden twice that way, and
        bubblewrap refused to start.
        Then drop whatever a link leads to (a mount follows links: its source could be a folder of this
        machine outside the workspace), and pin every folder above a protected path."""
        outer = [path for path in self.hidden
                 if not any(path != other and inside(path, other) for other in self.hidden)]
        covered = [path for path in self.hidden if path not in outer]
        self.hidden = outer
        self.read_only = [path for path in self.read_only
                          if not any(path != hidden and inside(path, hidden) for hidden in outer)]
        for path in covered:
            self.why.pop(path, None)
        self.hidden = [path for path in self.hidden if not self._through_link(path)]
        self.read_only = [path for path in self.read_only if not self._through_link(path)]
        self.top_writable = [path for path in self.top_writable
                             if not self._through_link(path) and path not in self.why
                             and not any(inside(path, other) for other in [*self.read_only, *self.hidden])]
        self.home_writable = [path for path in self.home_writable if path in self.top_writable]
        self.pinned = self._pins()

    def _through_link(self, path: str) -> bool:
        """Whether `path` is, or lies under, a link: a mount there would land where the link points."""
        if os.path.realpath(path) == path:
            return False
        self.why.pop(path, None)
        return True

    def _pins(self) -> list[str]:
        """The folders to bind onto themselves: each folder between the workspace's top (not itself) and a
        protected path (the path is a mount already), and each repository's `.git`; shallowest first."""
        mounted = {self.workspace, *self.read_only, *self.hidden, *self.tops, *self.top_writable}
        wanted: set[str] = {unit for unit in self.units if unit not in mounted and os.path.isdir(unit)}
        for path in [*self.read_only, *self.hidden, *self.tops, *wanted]:
            if not inside(path, self.workspace):
                continue
            parent = os.path.dirname(path)
            while parent != self.workspace and inside(parent, self.workspace) and parent not in wanted:
                if parent not in mounted:
                    wanted.add(parent)
                parent = os.path.dirname(parent)
        return sorted(wanted, key=lambda path: (path.count("/"), path))

    def mounts_in_order(self) -> list[tuple[str, str]]:
        """(path, kind) of every mount the guard asks for, parents before what is inside them (a mount
        made later over a parent would cover it): `top` (read-only, its entries bound after it),
        `writable` (an entry of a top, bound writable), `pinned` (bound onto itself, writable),
        `read-only`, `hidden`."""
        found = [(path, "top") for path in self.tops] + [(path, "writable") for path in self.top_writable]
        found += [(path, "pinned") for path in self.pinned] + [(path, "read-only") for path in self.read_only]
        found += [(path, "hidden") for path in self.hidden]
        return sorted(found, key=lambda item: item[0].rstrip("/").count("/"))  # stable: equal depths keep order

    def summary(self) -> dict[str, str]:
        """A few lines for `%sandbox`: what is hidden, what is read-only, what was not scanned."""
        lines: dict[str, str] = {}
        if self.home_top:
            lines["top of the home"] = (f"{self.home_top} is read-only: nothing new can be made there (its "
                                        f"{len(self.home_writable)} existing "
                                        f"{noun(len(self.home_writable), 'entry', 'entries')} other than dot "
                                        "entries and "
                                        "bin stay writable)")
        for top in self.tops:
            if top != self.home_top:
                label = "top of the workspace" if top == self.workspace else f"top of {self._relative(top)}"
                lines[label] = f"read-only ({self.why[top]}): nothing new can be made there; its entries stay writable"
        if self.pinned:
            lines["pinned"] = ", ".join(self._relative(p) for p in self.pinned[:8]) + (
                f" and {len(self.pinned) - 8} more" if len(self.pinned) > 8 else "") + (
                " (bound onto themselves: the box cannot rename, remove or replace them, nor so a protected path "
                "inside them)")
        if self.links:
            lines["links at the top"] = "; ".join(f"{self._relative(p)}: {what}" for p, what in
                                                  list(self.links.items())[:6]) + (
                f" and {len(self.links) - 6} more" if len(self.links) > 6 else "")
        if self.refused:
            lines[f"not opened ({WRITABLE_ENV})"] = ", ".join(self._relative(p) for p in self.refused) + (
                ": the kernel's own environment and Python path stay read-only")
        if self.home_hidden:
            shown = ", ".join(os.path.basename(p) for p in self.home_hidden[:6])
            more = f" and {len(self.home_hidden) - 6} more" if len(self.home_hidden) > 6 else ""
            lines["home dot entries hidden"] = (f"{len(self.home_hidden)} ({shown}{more}); show one with "
                                                f"{HOME_VISIBLE_ENV}=.name")
        protected = [p for p in self.read_only if p not in self.home_hidden]
        if protected:
            lines["read-only in the workspace"] = ", ".join(
                f"{self._relative(p)} ({self.why[p]})" for p in protected[:8]) + (
                f" and {len(protected) - 8} more" if len(protected) > 8 else "")
        if self.box_made:
            lines["environments the box made (writable)"] = ", ".join(self._relative(p) for p in self.box_made)
        if self.opted_out:
            lines[f"left writable ({WRITABLE_ENV})"] = ", ".join(self._relative(p) for p in self.opted_out)
        sockets = [p for p in self.hidden if self.why[p] == "socket"]
        if sockets:
            lines["sockets hidden"] = str(len(sockets))
        lines["workspace scan"] = (f"{self.scanned_folders:,} folder{'s' if self.scanned_folders != 1 else ''}" + (
            f"; not scanned (limit of {SCAN_FOLDERS} folders, depth {SCAN_DEPTH}): "
            + ", ".join(self._relative(p) for p in self.unscanned[:5])
            + (f" and {len(self.unscanned) - 5} more" if len(self.unscanned) > 5 else "") if self.unscanned
            else ", all read"))
        return lines

    def _relative(self, path: str) -> str:
        return os.path.relpath(path, self.workspace) if inside(path, self.workspace) else path


def guard_workspace(workspace: str, home: str, private_folders: Iterable[str] = (),
                    box_made: Iterable[str] = (), env: settings.Settings | Mapping[str, str] | None = None) -> Guard:
    """What the box must not change or see in `workspace`, for a user whose home is `home`.
    `private_folders` are this user's own state folders (the host runs what is in them);
    `box_made` the environments the host noted as made in an earlier sandbox; `env` the settings (or the
    variables to read them from; None: this process's)."""
    given = settings.settings_of(env)
    guard = Guard(workspace)
    writable = [p if os.path.isabs(p) else os.path.join(workspace, p) for p in given.writable]
    for folder in private_folders:
        if inside(folder, workspace) and folder != workspace and os.path.lexists(folder):
            guard.hide(folder, "this machine's private state folder")
    if inside(home, workspace):
        visible = set(given.home_visible)
        try:
            names = sorted(os.listdir(home))
        except OSError:
            names = []
        guard.home_top = home
        guard.seal(home, "the home's top level")
        for name in names:
            path = os.path.join(home, name)
            if os.path.islink(path):
                _top_link(guard, path, workspace, writable, hidden=name not in visible and (
                    name.startswith(".") or name == "bin"))
            elif name in visible or not (name.startswith(".") or name == "bin"):
                guard.home_writable.append(path)
                guard.top_writable.append(path)
            elif name == "bin":
                guard.protect(path, "on the login PATH", writable)
            else:
                guard.hide(path, "a dot entry of the home")
                guard.home_hidden.append(path)
    for path, why in host_python_paths():
        if inside(path, workspace) and path != workspace and os.path.exists(path):
            if any(inside(path, opted) or inside(opted, path) for opted in writable):
                guard.refused.append(path)
            guard.protect(path, why, [])  # OWSANDBOX_WRITABLE never opens the kernel's own environment
        elif path == workspace and not guard.on_python_path:
            guard.on_python_path = True
            _seal_python_path(guard, workspace)
    made = set(box_made)
    _scan(guard, workspace, made, writable)
    guard.settle()
    return guard


def _top_link(guard: Guard, path: str, workspace: str, writable: list[str], hidden: bool) -> None:
    """A link at a sealed top level: never bound (a mount would land where it points, a folder of this
    machine outside the workspace, or fail where the target is missing). The read-only top keeps the
    link as it is, and the box follows it into its own view. A dot entry's (or `bin`'s) target in the
    workspace is hidden (or made read-only) in its place: the host follows the link to it."""
    target = os.path.realpath(path)
    if not os.path.exists(target):
        guard.links[path] = f"a link to {os.readlink(path)}, which is missing: left as it is"
    elif inside(target, workspace):
        if hidden and os.path.basename(path) == "bin":
            guard.protect(target, "on the login PATH (through ~/bin)", writable)
            guard.links[path] = f"a link to {os.path.relpath(target, workspace)}, read-only"
        elif hidden:
            guard.hide(target, f"a dot entry of the home (through {os.path.basename(path)})")
            guard.home_hidden.append(target)
            guard.links[path] = f"a link to {os.path.relpath(target, workspace)}, hidden"
    else:
        guard.links[path] = f"a link out of the workspace ({os.readlink(path)}): the box sees its own {target}"


def _seal_python_path(guard: Guard, folder: str) -> None:
    """The workspace is on the kernel's Python path (an editable install): nothing new can be made at its
    top (a `sitecustomize.py`, a module named as one the kernel imports), its existing entries stay
    writable, and the start-up modules already there are read-only."""
    guard.seal(folder, "on the kernel's Python path")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        if os.path.islink(path):
            guard.links.setdefault(path, "a link, left as it is (not bound)")
        elif name in ("sitecustomize.py", "usercustomize.py"):
            guard.protect(path, "run by every Python of the kernel's environment", [])
        elif path not in guard.why and path not in guard.top_writable:
            guard.top_writable.append(path)


def host_python_paths() -> list[tuple[str, str]]:
    """The folders this machine's Python (the kernel's) loads from by itself: its prefixes and path."""
    found: list[tuple[str, str]] = []
    for prefix in dict.fromkeys((sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)):
        found.append((os.path.realpath(prefix), "the kernel's Python environment"))
    for entry in sys.path:
        if entry and os.path.isabs(entry):
            found.append((os.path.realpath(entry), "on the kernel's Python path"))
    return found


@dataclass(frozen=True)
class BoxUser:
    """The one user of this machine that every process of a box is, with no capability: bubblewrap maps
    only the kernel's own uid (root's box keeps none of root's privileges)."""

    uid: int
    groups: frozenset[int]

    @classmethod
    def this_process(cls) -> BoxUser:
        return cls(os.getuid(), frozenset({os.getgid(), *os.getgroups()}))

    def may_write_below(self, info: os.stat_result) -> bool:
        """Whether such a box could have written inside this folder: it owns it (a mode it set it can
        set back), or may enter it."""
        return info.st_uid == self.uid or _enterable(info, self.uid, self.groups)


def _enterable(info: os.stat_result, uid: int, groups: AbstractSet[int]) -> bool:
    """Whether a process of `uid` with no privileges may enter this folder: the box's processes have
    none, even when root starts it, so a folder only root's privileges open is out of its reach (and
    bubblewrap could not mount anything inside it)."""
    if info.st_uid == uid:
        return bool(info.st_mode & 0o100)
    if info.st_gid in groups:
        return bool(info.st_mode & 0o010)
    return bool(info.st_mode & 0o001)


def _scan(guard: Guard, workspace: str, box_made: set[str], writable: list[str]) -> None:
    """Breadth first, not following links, at most SCAN_FOLDERS folders and SCAN_DEPTH levels, into
    folders the box can enter."""
    uid, groups = os.getuid(), {os.getgid(), *os.getgroups()}
    queue: deque[tuple[str, int]] = deque([(workspace, 0)])
    while queue:
        folder, depth = queue.popleft()
        if guard.scanned_folders >= SCAN_FOLDERS:
            guard.unscanned.append(folder)
            guard.unscanned.extend(f for f, _ in queue)
            return
        guard.scanned_folders += 1
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        names = {entry.name for entry in entries}
        if "pyvenv.cfg" in names or "conda-meta" in names:
            guard.environments.append(folder)
            if folder in box_made:
                guard.box_made.append(folder)
            elif folder != workspace:
                guard.protect(folder, "a Python environment", writable)
            continue  # an environment's own files hold nothing more to find
        for entry in entries:
            path = entry.path
            if path in guard.why:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            mode = info.st_mode
            if stat.S_ISSOCK(mode):
                guard.hide(path, "socket")
            elif entry.name == ".git" and stat.S_ISDIR(mode):
                _guard_repository(guard, path, workspace, writable)
            elif entry.name == ".git" and stat.S_ISREG(mode):
                guard.protect(path, "git link to a repository", writable)  # a submodule's `gitdir: ...`
            elif entry.name == ".envrc" and stat.S_ISREG(mode):
                guard.protect(path, "direnv", writable)
            elif entry.name in EDITOR_SETTINGS and stat.S_ISDIR(mode):
                guard.protect(path, "editor settings", writable)
            elif stat.S_ISDIR(mode) and entry.name not in NOT_DESCENDED:
                if not _enterable(info, uid, groups):
                    continue
                if depth + 1 > SCAN_DEPTH:
                    guard.unscanned.append(path)
                else:
                    queue.append((path, depth + 1))


def _guard_repository(guard: Guard, git_dir: str, workspace: str, writable: list[str]) -> None:
    """A repository's config and hooks (git runs the hooks, and the config can name programs), and
    those of its submodules; objects, refs and the index stay writable, so commits still work."""
    if not any(inside(git_dir, opted) for opted in writable):
        guard.units.append(git_dir)  # pinned whole: `mv .git .git-old && mkdir .git` fails
    found = [git_dir]
    modules = os.path.join(git_dir, "modules")
    for root, folders, files in os.walk(modules):
        if "HEAD" in files and "config" in files:
            found.append(root)
        folders[:] = [f for f in folders if f not in ("objects", "refs", "logs")]
        if len(found) > 100:
            break
    for repo in found:
        for name in ("config", "hooks", "info"):
            path = os.path.join(repo, name)
            if os.path.lexists(path) and not os.path.islink(path):
                guard.protect(path, "git " + name, writable)
        hooks = _hooks_path(os.path.join(repo, "config"), os.path.dirname(git_dir))
        if hooks and inside(hooks, workspace) and os.path.isdir(hooks):
            guard.protect(hooks, "git core.hooksPath", writable)


def _hooks_path(config: str, work_tree: str) -> str | None:
    """`core.hooksPath` of a repository's own config, as a real path, or None."""
    from .gitquarantine import CONFIG_BYTES, ConfigSyntaxError, parse_config  # it imports this module

    # Read as git reads it, never by running a `git` (which PATH could find in the workspace).
    try:
        with open(config, encoding="utf-8", errors="replace") as f:
            text = f.read(CONFIG_BYTES + 1)
        entries = parse_config(text) if len(text) <= CONFIG_BYTES else []
    except (OSError, ConfigSyntaxError):
        return None
    values = [entry.value for entry in entries if entry.name == "core.hookspath" and entry.value]
    if not values:
        return None
    return os.path.realpath(os.path.join(work_tree, os.path.expanduser(values[-1])))  # the last one, as git


class GuardedWorkspace:
    """For a provider that binds this machine's workspace into its box: the guard found once per start
    (`guard = None` makes the next start scan again), and at the box's end the environments it made
    noted for later starts."""

    guard: Guard | None = None
    home: str
    git_quarantine: GitQuarantine | None = None  # box-made git settings moved aside (gitquarantine.py)

    def guarded_folder(self) -> str:
        """The workspace's path on this machine."""
        raise NotImplementedError

    def box_user(self) -> BoxUser | None:
        """The one user every process of the box is, when the provider knows it (the git check then skips
        folders that user could not have written in); None where the box may run as other users (a
        container's image picks its own)."""
        return None

    def workspace_guard(self) -> Guard:
        if self.guard is None:
            folder = self.guarded_folder()
            self.guard = guard_workspace(folder, self.home, [str(p) for p in runtime_candidates()],
                                         box_made_environments(runtime_root(avoid=folder), folder),
                                         env=getattr(self, "settings", None))
            from .gitquarantine import start_checks

            start_checks(self, folder, self.guard)  # from the box's start: git settings it writes, moved aside
        return self.guard

    def hidden_in_workspace(self) -> list[str]:
        """What the workspace shows that must stay hidden: the home's dot entries, sockets, private state."""
        return self.workspace_guard().hidden

    def note_box_made(self) -> None:
        """Environments that appeared in the workspace while the box ran were made by it: noted, so the
        next box leaves them writable (a venv made in a cell keeps taking `pip install`)."""
        if self.guard is not None:
            try:
                note_box_made_environments(runtime_root(avoid=self.guarded_folder()), self.guard)
            except OSError:
                pass
        from .gitquarantine import end_checks

        end_checks(self)  # git settings the box wrote, moved aside at its end

    def after_cell(self) -> str | None:
        """At each cell's end: git settings and hooks the box wrote, moved aside; a note when it acted."""
        from .gitquarantine import check_after_cell

        return check_after_cell(self)


# -- environments the box made ---------------------------------------------------------------------

def box_made_environments(private_root: Path, workspace: str) -> set[str]:
    """The environments under `workspace` that earlier sandboxes made (noted by the host when each ended)."""
    try:
        noted = json.loads((private_root / BOX_MADE_FILE).read_text())
    except (OSError, ValueError):
        return set()
    found = noted.get(workspace, []) if isinstance(noted, dict) else []
    return {path for path in found if isinstance(path, str) and inside(path, workspace)}


def note_box_made_environments(private_root: Path, guard: Guard) -> list[str]:
    """At a sandbox's end: the environments that appeared in its workspace while it ran were made by
    the box (a `python3 -m venv` in a cell); noted so that later sandboxes leave them writable. Returns
    the ones newly noted."""
    later = Guard(guard.workspace)
    _scan(later, guard.workspace, set(), [])
    new = [path for path in later.environments if path not in guard.environments and path != guard.workspace]
    if not new:
        return []
    record = private_root / BOX_MADE_FILE
    try:
        noted = json.loads(record.read_text())
        noted = noted if isinstance(noted, dict) else {}
    except (OSError, ValueError):
        noted = {}
    known = [p for p in noted.get(guard.workspace, []) if isinstance(p, str) and os.path.exists(p)]
    noted[guard.workspace] = sorted(set(known) | set(new))
    temporary = record.with_suffix(".tmp")
    temporary.write_text(json.dumps(noted))
    os.replace(temporary, record)
    return new
