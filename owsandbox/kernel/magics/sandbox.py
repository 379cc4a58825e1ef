"""`%sandbox`: where the cells run, in a short summary, every detail (`--all`) or the raw description (`--json`).

The words are `sandbox_view.py`'s; this module asks the kernel for the description and shows it.
"""

from __future__ import annotations

import argparse
import html
from typing import Any

from ... import protocol as P
from ...host.providers.base import NetworkNotChanged
from ..cell.budget import Withheld
from ..cell.terminal_text import shown_text
from ..display.math_safe import no_math
from ..errors import CellError
from .framework import MagicContext, magic, show_table
from .sandbox_view import FOOTER, as_json, every_row, network, summary


def show_rows(ctx: MagicContext, rows: list[tuple[str, str]], footer: str = "") -> None:
    """Labelled rows as text and HTML; their values (folders, names: the box's words too) are text for a
    terminal and escaped for the page."""
    rows = [(shown_text(label), shown_text(value)) for label, value in rows]
    width = max((len(label) for label, _ in rows), default=0)
    text = "".join(f"{label.ljust(width)}  {value}\n" for label, value in rows) + (shown_text(footer) + "\n"
                                                                                      if footer else "")
    page = "".join(f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
                   f"<td style='text-align:left'>{html.escape(value)}</td></tr>" for label, value in rows)
    page = f"<table><tbody>{page}</tbody></table>" + (f"<p>{html.escape(shown_text(footer))}</p>" if footer else "")
    ctx.display({"text/plain": text, "text/html": no_math(page)},
                withheld=Withheld("the sandbox's description", "%sandbox --json has it as data"))


def _shell_names(ctx: MagicContext) -> list[str]:
    """The sandbox's shells, for the summary; none when the sandbox cannot say (it may not run)."""
    try:
        return [shell["name"] for shell in ctx.box.shells()]
    except (P.RunnerError, TimeoutError, OSError, KeyError, TypeError, RuntimeError):
        return []


def _configure(parser: Any) -> None:
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--all", action="store_true", help="every detail: mounts, cgroups, ids, versions")
    shown.add_argument("--json", action="store_true", help="the raw description, as JSON")


@magic("sandbox", "line", "Describe the sandbox: isolation, what it writes, network, limits (--all: every detail; "
       "--json: as data).", _configure)
def _sandbox(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    info = ctx.describe_sandbox()
    if args.json:
        data, text = as_json(info)
        ctx.display({"application/json": data, "text/plain": text},
                    withheld=Withheld("the sandbox's description", "raise %output limit"))
        return
    if not args.all:
        if "error" not in info:
            info["shells"] = _shell_names(ctx)
        show_rows(ctx, summary(info), FOOTER)
        return
    if info.get("enforcement") == "none":
        info["isolation"] = "none: commands run on this machine with your permissions"
    show_rows(ctx, every_row(info))
    mounts = info.get("mounts")
    if isinstance(mounts, dict):  # the box's file system as it really is, in the order it is made
        show_table(ctx, ["path in the sandbox", "what the sandbox sees there"], [[k, v] for k, v in mounts.items()])


@magic("network", "line", "Show the sandbox's network, or turn outbound network on or off while it runs "
       "(bubblewrap: through pasta, never the host's loopback; no port forwarded).",
       lambda p: p.add_argument("setting", nargs="?", choices=["on", "off"], help="none: show the network"))
def _network(ctx: MagicContext, args: argparse.Namespace, _body: str) -> None:
    if args.setting is None:
        ctx.result(f"network: {network(ctx.describe_sandbox())}")
        return
    try:
        said = ctx.set_network(args.setting == "on")
    except NetworkNotChanged as exc:
        raise CellError("NetworkNotChanged", f"%network {args.setting}: {exc}") from None
    state, _, how = said.partition(" · ")
    ctx.stream(f"network: {state}" + (f" ({how})" if how else "") + "\n")


# The magics of this module, for the kernel's table (`table.all_magics`).
def _size(value: Any) -> str:
    size = float(value) if isinstance(value, (int, float)) else 0.0
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


@magic("usage", "line", "What the sandbox uses now, beside its limits: memory, CPU, processes (what JupyterLab's "
       "Kernel Usage panel shows).")
def _usage(ctx: MagicContext, _args: argparse.Namespace, _body: str) -> None:
    try:
        reply = ctx.usage()
    except (P.RunnerError, TimeoutError, RuntimeError) as exc:
        raise CellError("SandboxUnavailable", f"the sandbox cannot say what it uses: {exc}") from None
    box = reply["sandbox"]
    limit = box.get("memory_limit")
    memory = _size(box["memory_bytes"]) + (f" of {_size(limit)} ({reply['host_virtual_memory']['percent']:g}%)"
                                           if limit else " (no memory limit)")
    cpu = f"{reply['kernel_cpu']:g}% of one CPU since the last %usage (CPU time so far {box['cpu_seconds']:g} s)"
    cpus = f"{box['cpu_limit']:g}" if box.get("cpu_limit") else f"{reply['cpu_count']} (all it may run on)"
    show_rows(ctx, [("Memory", memory), ("CPU", cpu), ("CPUs", cpus), ("Processes", str(box["processes"])),
                    ("Sandbox", str(box["provider"]))],
              "the box's own figures: its daemon and everything below it")


SANDBOX_MAGICS = (_sandbox, _network, _usage)
