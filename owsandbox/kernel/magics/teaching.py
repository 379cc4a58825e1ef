"""`%snapshot`, `%record` and `%%check`: the workspace's files saved and put back, the session recorded,
an exercise checked, all from the notebook.

The work is elsewhere: the snapshot store and its file work in `host/snapshots/` (the box stopped
around a restore by `host/snapshots/stopped.py`), the asciicast transcript in `recording.py`, the
check's script and its report in `checks.py`. Here each becomes a magic: what it says, and what a
restore does to the kernel's shells (they start again in their folders, without their variables).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import time
from typing import Any, Protocol

from ... import protocol as P
from ...host.isolation.resources import human_size
from ...host.snapshots.stopped import BASELINE_ENV, SandboxSnapshots, SnapshotsRefused, baseline_setting
from ...host.snapshots.store import (
    BASELINE,
    RestoreReport,
    SaveReport,
    SnapshotError,
    SnapshotTooLarge,
    StoreTampered,
    summarize,
)
from ...protocol.paths import inside
from ...protocol.words import counted
from ..errors import CellError, UsageError
from ..teaching import checks
from ..teaching.recording import Recorder, RecordingError
from .framework import MagicContext, RunOnShell, magic, show_table


class TeachingContext(MagicContext, Protocol):
    sandbox: Any  # the kernel's Sandbox
    recorder: Recorder

    def run_quietly(self, shell: str, code: str) -> dict[str, Any]: ...


# -- %snapshot ----------------------------------------------------------------------------------

SNAPSHOT_USAGE = "%snapshot save NAME | restore NAME | restore --baseline | list | drop NAME"


def _snapshot_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["save", "restore", "list", "drop"])
    p.add_argument("name", nargs="?")
    p.add_argument("--baseline", action="store_true",
                   help=f"with restore: the kernelspec's baseline ({BASELINE_ENV}), the lab as a course starts it")


def _snapshots(ctx: TeachingContext) -> SandboxSnapshots:
    provider = ctx.sandbox.wait().provider
    try:
        return SandboxSnapshots(provider, env=ctx.sandbox.settings)
    except SnapshotsRefused as exc:
        raise CellError("SnapshotsRefused", str(exc)) from None
    except SnapshotError as exc:
        raise CellError("SnapshotError", str(exc)) from None


@magic("snapshot", "line", "Save the workspace's files, put them back as they were, list or drop snapshots "
       "(bubblewrap and container sandboxes; a restore restarts the sandbox).", _snapshot_options,
       usage=SNAPSHOT_USAGE)
def _snapshot(ctx: TeachingContext, args: argparse.Namespace, _body: str) -> None:
    if args.action in ("save", "drop") and not args.name:
        raise UsageError(f"%snapshot {args.action} takes a name, as in %snapshot {args.action} before-lab")
    if args.action == "restore" and bool(args.name) == args.baseline:
        raise UsageError("%snapshot restore takes a name, or --baseline (the lab as the course starts it)")
    if args.action in ("list",) and args.name:
        raise UsageError(f"%snapshot list takes no name\n{SNAPSHOT_USAGE}")
    snapshots = _snapshots(ctx)
    try:
        if args.action == "save":
            _said_save(ctx, snapshots.save(args.name))
        elif args.action == "restore":
            _restore(ctx, snapshots, args.name)
        elif args.action == "list":
            _list(ctx, snapshots)
        else:
            freed = snapshots.drop(args.name)
            ctx.stream(f"dropped snapshot '{args.name}' (freed {human_size(freed)})\n")
    except SnapshotTooLarge as exc:
        raise CellError("SnapshotTooLarge", str(exc)) from None
    except StoreTampered as exc:
        raise CellError("SnapshotStoreTampered", str(exc)) from None
    except SnapshotError as exc:
        raise CellError("SnapshotError", str(exc)) from None


def _said_save(ctx: TeachingContext, report: SaveReport) -> None:
    unchanged = report.bytes - report.read_bytes
    ctx.stream(f"saved snapshot '{report.name}'{' (replacing the one of that name)' if report.replaced else ''}: "
               f"{counted(report.files, 'file')}, {counted(report.folders, 'folder')}, "
               f"{counted(report.links, 'link')}, {human_size(report.bytes)} in {report.seconds:.2f} s\n")
    kept = f"{human_size(unchanged)} unchanged since the last save, not read again; " if unchanged > 0 else ""
    ctx.note(f"[{kept}the store holds {human_size(report.store_bytes)} of its {human_size(report.limit)} limit "
             "(each content once), outside every box]")
    if report.skipped:
        ctx.note(f"[not saved: {summarize(report.skipped)}]")
    if report.excluded:
        ctx.note(f"[left out, as the box cannot change them: {summarize(report.excluded)}]")


def _restore(ctx: TeachingContext, snapshots: SandboxSnapshots, name: str | None) -> None:
    sandbox = ctx.sandbox
    shells = sandbox.shell_folders()
    report = snapshots.restore_baseline() if name is None else snapshots.restore(name)
    _said_restore(ctx, report, "the baseline" if name is None else f"snapshot '{name}'")
    started = _start_shells(ctx, shells, snapshots.target.workspace)
    ctx.note("[the sandbox was restarted to put the files back: its running commands ended and its /tmp is empty; "
             + (f"shells {started} started again in their folders, without their variables]" if started
                else "the next cell starts a new shell]"))


def _said_restore(ctx: TeachingContext, report: RestoreReport, what: str) -> None:
    removed = counted(report.removed, "entry", "entries")
    ctx.stream(f"restored {what}: {counted(report.written, 'file')} written back, {removed} added since removed, "
               f"{counted(report.folders, 'folder')} and {counted(report.links, 'link')} put back, "
               f"{counted(report.unchanged, 'file')} unchanged, in {report.seconds:.2f} s\n")
    if report.kept:
        ctx.note(f"[left as they are: {summarize(report.kept)}]")
    if report.excluded:
        ctx.note(f"[not touched, as the box cannot change them: {summarize(report.excluded)}]")
    if report.setuid_dropped:
        ctx.note(f"[setuid and setgid bits are never put back: {', '.join(report.setuid_dropped[:5])}]")


def _start_shells(ctx: TeachingContext, shells: dict[str, str], host_workspace: str) -> str:
    """Each shell the kernel knew starts again in its folder (the nearest one left, if the restore removed
    it); their names, as a sentence."""
    sandbox = ctx.sandbox
    try:
        ctx.box.shells(timeout=60)  # the client is back, on the new sandbox
    except (P.RunnerError, TimeoutError):
        return ""
    started = []
    for shell, folder in shells.items():
        folder = _existing(folder, sandbox.cwd, host_workspace)
        sandbox.place_shell(shell, folder)
        try:
            ctx.box.run({"shell": shell, "command": "true", "cwd": folder}, timeout=30)
        except (P.RunnerError, TimeoutError):
            continue
        started.append(f"{shell} (in {folder})")
    return ", ".join(started)


def _existing(folder: str, box_workspace: str, host_workspace: str) -> str:
    """`folder` of the box, or the nearest folder above it that the restore left (seen on this machine)."""
    def host(path: str) -> str:
        if inside(path, box_workspace):
            return host_workspace + path[len(box_workspace.rstrip("/")):]
        return path

    probe = folder
    while probe not in ("", "/") and probe != box_workspace and not os.path.isdir(host(probe)):
        probe = os.path.dirname(probe)
    return probe or box_workspace


def _list(ctx: TeachingContext, snapshots: SandboxSnapshots) -> None:
    found = snapshots.list()
    setting = baseline_setting(ctx.sandbox.settings)
    footer = (f"The store holds {human_size(snapshots.usage())} of its {human_size(snapshots.store.limit)} limit "
              f"(each content once), at {snapshots.store.folder}, outside every box.")
    if setting:
        footer += f" Baseline: {setting} (%snapshot restore --baseline)."
    rows = [[info.name + (" (the baseline folder, as last taken in)" if info.name == BASELINE else ""),
             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.created)), f"{info.files:,}", f"{info.folders:,}",
             f"{info.links:,}", human_size(info.bytes)] for info in found]
    if not rows:
        ctx.stream("no snapshots of this workspace yet: %snapshot save NAME makes one\n")
        ctx.note(f"[{footer}]")
        return
    show_table(ctx, ["snapshot", "saved", "files", "folders", "links", "size"], rows, footer)


# -- %record ------------------------------------------------------------------------------------

def _record_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("state", nargs="?", choices=["on", "off"], help="none: say whether this session is recorded")
    p.add_argument("file", nargs="?", metavar="FILE.cast",
                   help="with on: the file (relative paths are in the recordings folder, outside the workspace)")


@magic("record", "line", "Record every cell's commands and output, with their timing, as an asciicast file "
       "(replay: owsandbox replay FILE.cast, or asciinema).", _record_options, usage="%record on [FILE.cast] | off")
def _record(ctx: TeachingContext, args: argparse.Namespace, _body: str) -> None:
    recorder = ctx.recorder
    if args.state is None:
        ctx.result(f"recording to {recorder.path} ({counted(recorder.cells, 'cell')} so far)" if recorder.on
                   else "not recording: %record on [FILE.cast] starts")
        return
    if args.state == "off":
        if args.file:
            raise UsageError("%record off takes no file")
        done = recorder.stop("recording stopped by %record off")
        ctx.stream(f"recorded {done}; replay it with: owsandbox replay {shlex.quote(str(recorder.path))}\n"
                   if done else "not recording\n")
        return
    try:
        place = recorder.start(args.file)
    except RecordingError as exc:
        raise UsageError(f"%record on: {exc}") from None
    ctx.stream(f"recording the cells after this one to {place}\n")


# -- %%check ------------------------------------------------------------------------------------

def _check_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--points", type=float, metavar="N", help="what the check is worth, said in its report")
    p.add_argument("--hint", metavar="TEXT", help="what a failing test says (instead of the test itself)")


@magic("check", "cell", "Check an exercise: each line is a shell test run in the current shell's state (folder, "
       "variables, files), without changing it; a failing line says so and the cell fails. Helpers: "
       "expect_file PATH [--contains TEXT], expect_output 'CMD' TEXT, expect_status 'CMD' N, expect_var NAME VALUE.",
       _check_options, usage="%%check [--points N] [--hint TEXT]")
def _check(ctx: TeachingContext, args: argparse.Namespace, body: str) -> RunOnShell | None:
    found = checks.parse_checks(body)
    if not found:
        raise UsageError("%%check has no test lines: write one shell test a line below it, such as "
                         "expect_file answers/count.txt --contains 8")
    if args.points is not None and args.points < 0:
        raise UsageError(f"--points takes a number of points, not {args.points:g}")
    token = f"owcheck{secrets.token_hex(12)}"
    result = ctx.run_quietly(ctx.settings["shell"], checks.check_script(found, token))
    outcome = result.get("outcome", P.OUTCOME_EXIT)
    if outcome == P.OUTCOME_INTERRUPT:
        raise CellError("Interrupted", "the check was interrupted")
    if outcome == P.OUTCOME_TIMEOUT:
        raise CellError("TimedOut", result.get("error") or "the check timed out")
    outcomes, problem = checks.read_outcomes(str(result.get("output") or ""), token, found)
    report = checks.report(outcomes, problem, args.hint or "", args.points)
    ctx.stream("".join(line + "\n" for line in report.lines))
    if not report.ok:
        raise CellError("CheckFailed", report.summary)
    return None


# The magics of this module, for the kernel's table (`table.all_magics`).
TEACHING_MAGICS = (_snapshot, _record, _check)
