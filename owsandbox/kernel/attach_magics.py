"""The `%attach`, `%detach`, `%send`, `%%send` and `%records` magics (see `attach.py`).

What goes wrong is an `AttachError`, which the kernel shows as the cell's error under its own name
(a UsageError, AttachedProgramExited, AttachFailed)."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from .attach import Program
from .errors import UsageError
from .magics import MagicContext, magic, show_table

ATTACH_USAGE = ("%attach [--name N] [--cwd DIR] [--url URL --header K:V ...] -- COMMAND ...\n"
                "       %attach --session ID [--since N] | --last | --list | --kill [N]")


def _attach_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="a short name for the program")
    p.add_argument("--cwd", help="the folder it runs in (default: the current shell's folder)")
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
    if args.session or args.last:
        if command.strip():
            raise UsageError("%attach --session/--last attaches to a running program; drop the -- COMMAND")
        program = manager.reattach(args.session, args.last, args.since, args.url, headers, ctx.parent)
        ctx.stream(f"attached again to {program.describe()} (session {program.session_id[:8]}), reading from "
                   f"offset {program.since}\n")
        return
    if not command.strip():
        raise UsageError(f"%attach needs a command after --, as in: %attach -- python3 engine.py\n{ATTACH_USAGE}")
    if args.since is not None:
        raise UsageError("--since goes with --session")
    cwd = args.cwd or ctx.shell_folder()
    program = manager.start(command.strip(), args.name, cwd, args.url, headers, ctx.parent)
    # Not the cursor: the header above keeps counting it while records arrive, this line stays.
    ctx.stream(f"attached to {program.describe()} (session {program.session_id[:8]})\n")


@magic("detach", "line", "Stop watching an attached program; it keeps running (%attach --last picks it up).",
       lambda p: p.add_argument("number", nargs="?", type=int))
def _detach(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    program = ctx.attach.detach(args.number)
    _said(ctx, program, "detached from")


def _parse_records(text: str) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"line {number} is not JSON: {exc}: {line[:80]}") from None
        if not isinstance(record, dict):
            raise UsageError(f"line {number} is not a JSON object: {line[:80]}")
        records.append(record)
    if not records:
        raise UsageError("no record to send")
    return records


def _show_answers(ctx: MagicContext, records: list[dict[str, Any]], answers: list[dict[str, Any]]) -> None:
    if not answers:
        ctx.stream(f"sent {len(records)} record{'s' if len(records) != 1 else ''} (none with an id to wait for)\n")
        return
    for answer in answers:
        ctx.display({"application/json": answer, "text/plain": json.dumps(answer, ensure_ascii=False)})


def _split_number(text: str) -> tuple[int | None, str]:
    first, _, rest = text.strip().partition(" ")
    if first.isascii() and first.isdigit():
        return int(first), rest
    return None, text


@magic("send", "line", "Send one JSON record to an attached program; with an `id`, wait for its answer.",
       raw=True, usage="%send [N] JSON")
def _send(ctx: MagicContext, text: str, _body: str) -> None:
    number, rest = _split_number(text)
    if not rest.strip():
        raise UsageError("%send needs a JSON record, as in: %send {\"id\": 1, \"type\": \"echo\"}")
    records = _parse_records(rest.strip())
    if len(records) != 1:
        raise UsageError("%send sends one record; use %%send for several")
    _show_answers(ctx, records, ctx.attach.send(number, records, ctx.settings.get("send_wait", 30.0)))


@magic("send", "cell", "Send one JSON record a line to an attached program; wait for the answers to those with an id.",
       lambda p: (p.add_argument("number", nargs="?", type=int),
                  p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for answers (30)")))
def _send_cell(ctx: MagicContext, args: argparse.Namespace, body: str) -> None:
    records = _parse_records(body)
    _show_answers(ctx, records, ctx.attach.send(args.number, records, args.wait))


@magic("records", "line", "Print an attached program's recent records.",
       lambda p: (p.add_argument("number", nargs="?", type=int),
                  p.add_argument("--last", type=int, default=20, metavar="K", help="how many (20)"),
                  p.add_argument("--type", metavar="T", help="only records whose `type` is T")))
def _records(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    program = ctx.attach.pick(args.number)
    kept = [(offset, record) for offset, record in program.records
            if args.type is None or record.get("type") == args.type]
    shown = kept[-args.last:] if args.last > 0 else []
    lines = "".join(f"{offset:>10}  {json.dumps(record, ensure_ascii=False)}\n" for offset, record in shown)
    ctx.stream(lines or f"no records{' of type ' + args.type if args.type else ''} from {program.describe()}\n")


# The magics of this module, for the kernel's table (`magic_table.all_magics`).
ATTACH_MAGICS = (_attach, _detach, _send, _send_cell, _records)
