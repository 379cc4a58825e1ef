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
  workspace holds it.

This module decides; the providers turn its answer into mounts.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ... import settings
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


def inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


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

    def settle(self) -> None:
        """Drop what lies inside a hidden path: the empty folder in its place covers it already, and a
        mount inside it could not be made (its destination is not in the empty folder). A state folder
        of this user's in `~/.cache`, with the home as the workspace, was hidden twice that way, and
        bubblewrap refused to start."""
        outer = [path for path in self.hidden
                 if not any(path != other and inside(path, other) for other in self.hidden)]
        covered = [path for path in self.hidden if path not in outer]
        self.hidden = outer
        self.read_only = [path for path in self.read_only
                          if not any(path != hidden and inside(path, hidden) for hidden in outer)]
        for path in covered:
            self.why.pop(path, None)

    def summary(self) -> dict[str, str]:
        """A few lines for `%sandbox`: what is hidden, what is read-only, what was not scanned."""
        lines: dict[str, str] = {}
        if self.home_top:
            lines["top of the home"] = (f"{self.home_top} is read-only: nothing new can be made there (its "
                                        f"{len(self.home_writable)} existing entries other than dot entries and "
                                        "bin stay writable)")
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
        if self.on_python_path:
            lines["warning"] = "the workspace is on this machine's Python path: the box can plant modules there"
        return lines

    def _relative(self, path: str) -> str:
        return os.path.relpath(path, self.workspace) if inside(path, self.workspace) else path


def guard_workspace(workspace: str, home: str, private_folders: Iterable[str] = (),
                    box_made: Iterable[str] = (), env: dict[str, str] | None = None) -> Guard:
    """What the box must not change or see in `workspace`, for a user whose home is `home`.
    `private_folders` are this user's own state folders (the host runs what is in them);
    `box_made` the environments the host noted as made in an earlier sandbox."""
    env = os.environ if env is None else env
    guard = Guard(workspace)
    writable = [p if os.path.isabs(p) else os.path.join(workspace, p) for p in _names(env.get(WRITABLE_ENV))]
    for folder in private_folders:
        if inside(folder, workspace) and folder != workspace and os.path.lexists(folder):
            guard.hide(folder, "this machine's private state folder")
    if inside(home, workspace):
        visible = set(_names(env.get(HOME_VISIBLE_ENV)))
        try:
            names = sorted(os.listdir(home))
        except OSError:
            names = []
        guard.home_top = home
        for name in names:
            path = os.path.join(home, name)
            if name in visible or not (name.startswith(".") or name == "bin"):
                guard.home_writable.append(path)
            elif name == "bin":
                guard.protect(path, "on the login PATH", writable)
            else:
                guard.hide(path, "a dot entry of the home")
                guard.home_hidden.append(path)
    for path, why in host_python_paths():
        if inside(path, workspace) and path != workspace and os.path.exists(path):
            guard.protect(path, why, writable)
        elif path == workspace:
            guard.on_python_path = True
    made = set(box_made)
    _scan(guard, workspace, made, writable)
    guard.settle()
    return guard


def host_python_paths() -> list[tuple[str, str]]:
    """The folders this machine's Python (the kernel's) loads from by itself: its prefixes and path."""
    found: list[tuple[str, str]] = []
    for prefix in dict.fromkeys((sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)):
        found.append((os.path.realpath(prefix), "the kernel's Python environment"))
    for entry in sys.path:
        if entry and os.path.isabs(entry):
            found.append((os.path.realpath(entry), "on the kernel's Python path"))
    return found


def _enterable(info: os.stat_result, uid: int, groups: set[int]) -> bool:
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
    if not os.path.isfile(config):
        return None
    try:
        done = subprocess.run(["git", "config", "--file", config, "--get", "core.hooksPath"], capture_output=True,
                              text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    value = done.stdout.strip()
    if done.returncode != 0 or not value:
        return None
    return os.path.realpath(os.path.join(work_tree, os.path.expanduser(value)))


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

    def workspace_guard(self) -> Guard:
        if self.guard is None:
            folder = self.guarded_folder()
            self.guard = guard_workspace(folder, self.home, [str(p) for p in runtime_candidates()],
                                         box_made_environments(runtime_root(avoid=folder), folder))
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
