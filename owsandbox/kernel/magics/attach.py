"""The `%attach`, `%detach`, `%send`, `%%send`, `%records` and `%replay` magics (see `attach.py`).

What goes wrong is an `AttachError`, which the kernel shows as the cell's error under its own name
(a UsageError, AttachedProgramExited, AttachFailed, TimedOut, Interrupted, ReplayDiffers, or the
JSON-RPC error an answer carried: MethodNotFound, InvalidParams, ToolError, ...)."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from ... import protocol as P
from ...protocol.words import counted, noun
from ..attach import jsonrpc as R
from ..attach.asked import AutoAnswer, auto_answer, parse_option
from ..attach.conversation import ARROWS, KEEP_RECORDS, RECEIVED, SENT, STDOUT, Entry
from ..attach.dialects import DIALECTS
from ..attach.replay import ReplayDiffers, compare, labels, parse, report, saved_text
from ..attach.session import Program
from ..attach.timeline import NOT_JSON_SAID
from ..errors import UsageError
from .files import read_whole
from .framework import MagicContext, magic, show_table

DEFAULT_TIMEOUT = 30.0  # seconds a %send waits for an answer, again after each progress notification

ATTACH_USAGE = ("%attach [--name N] [--cwd DIR] [--dialect D] [--answer METHOD=FILE.json ...] "
                "[--url URL --header K:V ...] -- COMMAND ...\n"
                "       %attach --session ID [--since N] [--answer ...] | --last [--answer ...] | --list | --kill [N]")


def _attach_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="a short name for the program")
    p.add_argument("--cwd", help="the folder it runs in (default: the current shell's folder)")
    p.add_argument("--dialect", choices=sorted(DIALECTS),
                   help="its JSON-RPC dialect, for Stop's cancel and progress (default: guessed from its records)")
    p.add_argument("--answer", action="append", default=[], metavar="METHOD=FILE.json",
                   help="answer the program's own METHOD requests from FILE.json ({\"result\": ...} or "
                        "{\"error\": ...}; the id is each request's), even while a %%send waits")
    p.add_argument("--url", help="an execd endpoint (http://host:port or unix:/path); default: the sandbox's own")
    p.add_argument("--header", action="append", default=[], metavar="K:V", help="a header for that endpoint")
    p.add_argument("--session", metavar="ID", help="attach again to a running session (an id or its start)")
    p.add_argument("--since", type=int, help="with --session: the output offset to resume from")
    p.add_argument("--last", action="store_true", help="attach again to the most recent program")
    p.add_argument("--list", action="store_true", help="list the programs in the sandbox")
    p.add_argument("--kill", nargs="?", const=-1, type=int, metavar="N", help="end a program (default: the last)")


def _headers(pairs: list[str]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition(":")
        if not sep or not key.strip():
            raise UsageError(f"--header takes K:V, not {pair!r}")
        headers[key.strip()] = value.strip()
    return headers


def _auto_answers(ctx: MagicContext, options: list[str]) -> dict[str, AutoAnswer]:
    """`--answer METHOD=FILE.json ...`, each file read from the sandbox (relative to the shell's folder)."""
    found: dict[str, AutoAnswer] = {}
    for option in options:
        method, path = parse_option(option)
        if method in found:
            raise UsageError(f"--answer {method} is given twice ({found[method].path} and {path})")
        try:
            text = read_whole(ctx, path, ctx.settings["shell"]).decode("utf-8", "replace")
        except P.RunnerError as err:
            if err.code == P.FS_ERROR:
                raise UsageError(f"--answer {method}={path}: {err.message}") from None
            raise
        found[method] = auto_answer(method, path, text)
    return found


def _said(ctx: MagicContext, program: Program, verb: str) -> None:
    """`verb` #N NAME, with the cursor its display's header now shows too."""
    ctx.stream(f"{verb} {program.describe()} (session {program.session_id[:8]}, cursor {program.cursor})\n")


@magic("attach", "line", "Start a JSON-lines program in the sandbox and watch its records live, or attach again.",
       _attach_options, raw=True, usage=ATTACH_USAGE)
def _attach(ctx: MagicContext, text: str, _body: str) -> None:
    stripped = text.strip()
    if stripped == "--" or stripped.startswith("-- "):
        options_text, command = "", stripped[2:]
    else:
        options_text, _, command = stripped.partition(" -- ")
    try:
        tokens = shlex.split(options_text)
    except ValueError as exc:
        raise UsageError(f"%attach: {exc}") from None
    args = _attach.parser.parse_args(tokens)  # its own parser: `_attach` is the Magic this function became
    manager = ctx.attach
    if args.list:
        rows = manager.listing()
        if not rows:
            ctx.stream("no programs in this sandbox yet; start one with %attach -- COMMAND\n")
            return
        show_table(ctx, list(rows[0]), [list(r.values()) for r in rows])
        return
    if args.kill is not None:
        program = manager.kill(None if args.kill == -1 else args.kill)
        _said(ctx, program, "ended")
        return
    headers = _headers(args.header)
    answers = _auto_answers(ctx, args.answer)
    if args.session or args.last:
        if command.strip():
            raise UsageError("%attach --session/--last attaches to a running program; drop the -- COMMAND")
        if args.dialect:
            raise UsageError("--dialect goes with a new program; one attached again keeps the dialect it had")
        program = manager.reattach(args.session, args.last, args.since, args.url, headers, ctx.parent,
                                   answers if args.answer else None)
        ctx.stream(f"attached again to {program.describe()} (session {program.session_id[:8]}), reading on from "
                   f"offset {program.since}{_checked(program)}\n")
        _said_answers(ctx, program)
        manager.show(program)
        return
    if not command.strip():
        raise UsageError(f"%attach needs a command after --, as in: %attach -- python3 engine.py\n{ATTACH_USAGE}")
    if args.since is not None:
        raise UsageError("--since goes with --session")
    cwd = args.cwd or ctx.shell_folder()
    program = manager.start(command.strip(), args.name, cwd, args.url, headers, ctx.parent, args.dialect, answers)
    # Not the cursor: the header below keeps counting it while records arrive, this line stays.
    ctx.stream(f"attached to {program.describe()} (session {program.session_id[:8]})\n")
    _said_answers(ctx, program)
    manager.show(program)


def _checked(program: Program) -> str:
    """What a reattach asked execd for when it was not the cursor itself: the replay from an earlier
    offset, whose bytes up to the cursor are compared with what the kernel read last, not shown."""
    if program.replayed_from >= program.since:
        return ""
    return (f" (execd replays from offset {program.replayed_from}: the bytes up to {program.since} are checked "
            "against what was read last, not shown again)")


def _said_answers(ctx: MagicContext, program: Program) -> None:
    for method, auto in program.auto_answers.items():
        ctx.stream(f"answering {method} requests of {program.describe()} from {auto.path}\n")


@magic("detach", "line", "Stop watching an attached program; it keeps running (%attach --last picks it up).",
       lambda p: p.add_argument("number", nargs="?", type=int))
def _detach(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    program = ctx.attach.detach(args.number)
    ctx.stream(f"detached from {program.describe()} (session {program.session_id[:8]}, cursor {program.cursor}); "
               f"{ctx.attach.again_hint(program)}\n")


def _parse_records(text: str) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"line {number} is not JSON: {exc}: {line[:80]}") from None
        if not isinstance(record, dict):
            raise UsageError(f"line {number} is not a JSON object: {line[:80]}")
        records.append(record)
    if not records:
        raise UsageError("no record to send")
    return records


def _sent_line(entry: Entry, who: str) -> str:
    """What a cell says for a record that waits for nothing."""
    record = entry.record or {}
    if entry.kind == R.NOTIFICATION:
        return f"sent the notification {record.get('method')} to {who} (notifications are not answered)\n"
    if entry.kind == R.RESPONSE:
        asked = f" ({entry.call.method})" if entry.call is not None and entry.call.method else ""
        return f"sent the answer to {who}'s request {json.dumps(record.get('id'))}{asked}\n"
    if R.is_jsonrpc(record):
        return f"sent a JSON-RPC record of no known shape to {who} (nothing to wait for)\n"
    return f"sent a record without an id to {who} (nothing to wait for)\n"


def _exchange(ctx: MagicContext, number: int | None, records: list[dict[str, Any]], timeout: float | None,
              check: bool = True) -> None:
    """Send, show each answer expanded (indented text; JupyterLab's JSON tree opened), then make an
    error answer the cell's error, naming its code and message."""
    manager = ctx.attach
    program, sent = manager.send(number, records, timeout, check)
    said = ""
    for entry in sent:
        call = entry.call
        if call is not None and call.request is entry and call.answer is not None and call.answer.record is not None:
            if said:
                ctx.stream(said)
                said = ""
            answer = call.answer.record
            ctx.display({"application/json": answer, "text/plain": json.dumps(answer, indent=2, ensure_ascii=False)},
                        metadata={"application/json": {"expanded": True}})
        elif call is not None and call.request is entry and call.asked_by == SENT:
            said += (f"sent request {json.dumps(call.id)} ({call.method}) to {program.describe()} without waiting: "
                     "its answer shows in the program's view\n")
        else:
            said += _sent_line(entry, program.describe())
    if said:
        ctx.stream(said)
    errors = manager.errors_in(program, sent)
    if errors:
        first = errors[0]
        if len(errors) > 1:
            first.evalue += f" (and {len(errors) - 1} more error answers above)"
        raise first


def _send_options(text: str) -> tuple[int | None, float | None, bool, str]:
    """`[N] [--timeout S] [--no-wait]` before the JSON of `%send`, and the JSON (`--no-check`: see
    `_no_check`)."""
    stripped = text.strip()
    starts = [i for i in (stripped.find("{"), stripped.find("[")) if i >= 0]
    head, rest = (stripped[:min(starts)], stripped[min(starts):]) if starts else (stripped, "")
    try:
        words = shlex.split(head)
    except ValueError:
        return None, None, False, stripped
    number: int | None = None
    timeout: float | None = None
    no_wait = False
    while words:
        word = words.pop(0)
        if word.isascii() and word.isdigit() and number is None:
            number = int(word)
        elif word in ("--timeout", "--wait") and words:
            timeout = _seconds(words.pop(0))
        elif word.startswith(("--timeout=", "--wait=")):
            timeout = _seconds(word.partition("=")[2])
        elif word == "--no-wait":
            no_wait = True
        else:
            return None, None, False, stripped  # not options: the JSON parser says what is wrong
    return number, timeout, no_wait, rest


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--timeout takes seconds, not {text!r}") from None
    if not value > 0:
        raise UsageError(f"--timeout takes a positive number of seconds, not {text!r}")
    return value


def _no_check(text: str) -> tuple[str, bool]:
    """`--no-check` among %send's options (before the JSON): send a tools/call its tool's inputSchema refuses."""
    stripped = text.strip()
    starts = [i for i in (stripped.find("{"), stripped.find("[")) if i >= 0]
    cut = min(starts) if starts else len(stripped)
    head = stripped[:cut].split()
    if "--no-check" not in head:
        return text, True
    return " ".join(word for word in head if word != "--no-check") + " " + stripped[cut:], False


@magic("send", "line", "Send one JSON record to an attached program; a request waits for its answer.",
       raw=True, usage="%send [N] [--timeout S | --no-wait] [--no-check] JSON")
def _send(ctx: MagicContext, text: str, _body: str) -> None:
    text, check = _no_check(text)
    number, timeout, no_wait, rest = _send_options(text)
    if not rest.strip():
        raise UsageError("%send needs a JSON record, as in: %send {\"id\": 1, \"type\": \"echo\"}")
    records = _parse_records(rest.strip())
    if len(records) != 1:
        raise UsageError("%send sends one record; use %%send for several")
    _exchange(ctx, number, records, None if no_wait else timeout or ctx.settings.get("send_wait", DEFAULT_TIMEOUT),
              check)


@magic("send", "cell", "Send one JSON record a line to an attached program; wait for the answers to the requests.",
       lambda p: (p.add_argument("number", nargs="?", type=int),
                  p.add_argument("--timeout", "--wait", dest="timeout", type=_seconds, default=DEFAULT_TIMEOUT,
                                 metavar="S", help="seconds to wait for each answer, again after each progress "
                                                   f"notification ({DEFAULT_TIMEOUT:g})"),
                  p.add_argument("--no-wait", action="store_true",
                                 help="send requests without waiting (their answers show in the program's view)"),
                  p.add_argument("--no-check", action="store_true",
                                 help="send a tools/call even when its tool's inputSchema refuses its arguments")))
def _send_cell(ctx: MagicContext, args: argparse.Namespace, body: str) -> None:
    _exchange(ctx, args.number, _parse_records(body), None if args.no_wait else args.timeout, not args.no_check)


def _records_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("number", nargs="?", type=int)
    p.add_argument("--last", type=int, default=20, metavar="K", help="how many (20)")
    p.add_argument("--type", metavar="T", help="only records whose `type` is T")
    p.add_argument("--notifications", action="store_true", help="only JSON-RPC notifications, both ways")
    p.add_argument("--method", metavar="M", help="only the calls and notifications of method M")
    p.add_argument("--id", metavar="ID", help="only what belongs to the request with this id (JSON: 3, '\"a\"')")
    p.add_argument("--stderr", action="store_true", help="the program's stderr lines instead")
    p.add_argument("--save", metavar="FILE", help="write the conversation the kernel keeps (both ways, with times; "
                   "the newest 1,000 records and their calls) as JSON lines")


def _record_line(entry: Entry) -> str:
    if entry.direction == STDOUT:
        return f"{entry.offset if entry.offset is not None else '':>10} ! {entry.text}  ({NOT_JSON_SAID})\n"
    offset = entry.offset if entry.direction == RECEIVED and entry.offset is not None else ""
    failed = f"  · not sent: {entry.failed}" if entry.failed else ""
    return f"{offset:>10} {ARROWS[entry.direction]} {json.dumps(entry.record, ensure_ascii=False)}{failed}\n"


@magic("records", "line", "Print an attached program's conversation, filter it, or save it for %replay.",
       _records_options)
def _records(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    program = ctx.attach.pick(args.number)
    conversation = program.conversation
    filtered = args.notifications or args.method is not None or args.id is not None or args.type is not None
    if args.save is not None:
        if filtered or args.stderr:
            raise UsageError("--save writes the whole conversation the kernel keeps; drop the filters")
        _save(ctx, program, args.save)
        return
    if args.stderr:
        lines = [f"{entry.text}\n" for entry in conversation.stderr_lines]
        lines += [conversation.stderr_partial + "\n"] if conversation.stderr_partial else []
        shown = lines[-args.last:] if args.last > 0 else []
        ctx.stream("".join(shown) or f"no stderr from {program.describe()}\n")
        return
    if filtered:
        kept = conversation.select(notifications=args.notifications, method=args.method,
                                   request_id=_id(args.id), by_id=args.id is not None, record_type=args.type)
    else:
        kept = [e for e in conversation.entries() if e.record is not None or e.direction == STDOUT]
    shown = kept[-args.last:] if args.last > 0 else []
    if program.since > 0:  # attached again (after a restart, or with --since): the earlier records are not here
        ctx.note(f"[{program.describe()} was attached again at offset {program.since:,}: these are its records "
                 f"from there on; the earlier ones are not in this kernel (%detach, then %attach --session "
                 f"{program.session_id[:8]} --since 0 reads them again, as far as the box keeps its output)]")
    what = " ".join(f"{flag} {value}" for flag, value in (("--type", args.type), ("--method", args.method),
                                                          ("--id", args.id)) if value is not None)
    what += " --notifications" if args.notifications else ""
    ctx.stream("".join(_record_line(e) for e in shown) or f"no records{' ' + what.strip() if what else ''} "
                                                          f"from {program.describe()}\n")


def _id(text: str | None) -> Any:
    """An id as `--id` gives it: JSON when it parses (3, "a"), else the word itself as a string id."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if isinstance(value, (str, int, float)) and not isinstance(value, bool) else text


def _save(ctx: MagicContext, program: Program, path: str) -> None:
    text, count = saved_text(program.conversation, {"program": program.name, "number": program.number,
                                                    "command": program.command, "cwd": program.cwd,
                                                    "session": program.session_id})
    try:
        done = ctx.box.write({"path": path, "shell": ctx.settings["shell"], "text": text, "make_parents": True})
    except P.RunnerError as err:
        if err.code == P.FS_ERROR:
            raise UsageError(f"not saved: {err.message}") from None
        raise
    counts = program.conversation.counts
    dropped = program.conversation.made - count
    kept = (f"the newest {count:,} of {counted(program.conversation.made, 'entry', 'entries')}" if dropped
            else counted(count, "entry", "entries"))
    ctx.stream(f"saved {kept} of {program.describe()} ({counted(counts['sent'], 'record')} sent, "
               f"{counts['received']:,} "
               f"received, {counted(counts['stderr'], 'stderr line')}) to {done['path']}; %replay {path} sends its "
               "client side to a fresh program\n")
    if dropped:
        ctx.note(f"{counted(dropped, 'earlier entry', 'earlier entries')} {noun(dropped, 'is', 'are')} not in the "
                 "file: the kernel keeps a program's newest "
                 f"{KEEP_RECORDS} records with their calls, notifications and stderr lines; a replay of it starts "
                 "mid-session\n")


REPLAY_USAGE = "%replay FILE.jsonl [--timeout S] [--ignore KEY ...] [--keep] [--name N] [--cwd DIR] [--against CMD ...]"


def _replay_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a conversation saved with %%records --save (or JSON records, one a line)")
    p.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds to wait for each answer ({DEFAULT_TIMEOUT:g})")
    p.add_argument("--ignore", action="append", default=[], metavar="KEY",
                   help="leave members named KEY out of the comparison, at any depth (a timestamp, a version)")
    p.add_argument("--keep", action="store_true", help="leave the fresh program running, attached")
    p.add_argument("--name", help="the fresh program's name (replay)")
    p.add_argument("--cwd", help="the folder it runs in (default: the saved one, else the shell's)")


@magic("replay", "line", "Send a saved conversation's client side to a fresh program and diff the answers.",
       _replay_options, raw=True, usage=REPLAY_USAGE)
def _replay(ctx: MagicContext, text: str, _body: str) -> None:
    options_text, _, against = f" {text.strip()}".partition(" --against ")
    try:
        tokens = shlex.split(options_text)
    except ValueError as exc:
        raise UsageError(f"%replay: {exc}") from None
    args = _replay.parser.parse_args(tokens)
    shell = ctx.settings["shell"]
    saved = parse(read_whole(ctx, args.file, shell).decode("utf-8", "replace"), args.file)
    command = against.strip() or saved.header.get("command") or ""
    if not command:
        raise UsageError(f"{args.file} does not say which program it was (a file of records): name one with "
                         "--against CMD")
    cwd = args.cwd or saved.header.get("cwd") or ctx.shell_folder()
    manager = ctx.attach
    program = manager.start(command, args.name or "replay", cwd, None, {}, ctx.parent, dialect=saved.dialect_name())
    if saved.header.get("dropped"):
        ctx.note(f"{args.file} holds the newest part of a conversation ("
                 f"{counted(saved.header['dropped'], 'earlier entry', 'earlier entries')} "
                 "not saved): its client side starts mid-session, so the program may answer otherwise\n")
    ctx.stream(f"replaying {counted(len(saved.client_side), 'record')} of {args.file} against {program.describe()} "
               f"(session {program.session_id[:8]}): {command}\n")
    manager.show(program)
    try:
        calls, stopped = manager.replay(program, saved, args.timeout)
    finally:
        if not args.keep:
            manager.kill(program.number)
    verdict = compare(saved.calls(), calls, frozenset(args.ignore))
    ctx.stream(report(verdict, args.file, f"{program.describe()} ({command})")
               + ("" if args.keep else f"ended {program.describe()} (--keep leaves it running)\n"))
    differ = [call for call, _ in verdict.differ]
    if stopped:
        raise ReplayDiffers(f"the replay stopped early: {stopped}; {len(differ)} of "
                            f"{counted(verdict.compared, 'answer')} {noun(len(differ), 'differs', 'differ')}"
                            f"{': ' + labels(differ) if differ else ''}")
    if differ:
        raise ReplayDiffers(f"{len(differ)} of {counted(verdict.compared, 'answer')} "
                            f"{noun(len(differ), 'differs', 'differ')} "
                            f"from {args.file}: {labels(differ)}")


# The magics of this module, for the kernel's table (`table.all_magics`).
ATTACH_MAGICS = (_attach, _detach, _send, _send_cell, _records, _replay)
