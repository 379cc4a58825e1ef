"""The command line of the box: `serve` runs the daemon, `attach` runs a relay.

It is what runs as `python3 -S runner-<hash>.pyz ...` inside a sandbox, and as
`owsandbox runner serve|attach ...` from an installed package.

The options are written once, as data (`COMMANDS`), and read two ways. A command line of the plain
form the providers write (`--name value` and flags, each once, spelled out) is read by `quick_parse`,
which imports nothing; anything else (`--help`, a mistake, `--name=value`, an abbreviation) goes to
argparse, built from the same table, which answers it as it always has. The reason is memory: a
relay is a process per pipe that idles for the whole life of its kernel, and argparse with what it
pulls in (re, enum, gettext, locale, shutil) is about a third of an idle relay's private memory and
half a MiB of the daemon's (benchmarks/kernel_start.py). A test holds the two readings equal.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing itself is not imported: a relay has no other use for it
if TYPE_CHECKING:
    from typing import Any

# The defaults of `serve`, written here so that a relay (`attach`), which starts once per pipe, does
# not import the daemon's modules. A test checks they equal the daemon's own.
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
DEFAULT_OUTPUT_LIMIT = 1024 * 1024

FLAG = "flag"  # an option's kind: present or not
REST = "rest"  # an option's kind: every argument after it (must come last)
LOG_LEVELS = ("debug", "info", "warning", "error")

#: Each command: (help, its options: (name, kind, default, help, extra argparse keywords)). A kind is
#: str, int or float (one value converted so), FLAG or REST.
COMMANDS: dict[str, tuple[str, tuple[tuple[str, Any, Any, str, dict[str, Any]], ...]]] = {
    "serve": ("run the daemon on a Unix socket", (
        ("--socket", str, None, "socket path; its folder is made private (0700)", {"required": True}),
        ("--cwd", str, None, "the folder new shells start in", {}),
        ("--log-dir", str, None, "where output past the in-memory cap is kept", {}),
        ("--exit-with-parent", FLAG, False, "stop when the parent process goes", {}),
        ("--linger", float, 0, "stop after this long with no client connected (0 = never)", {"metavar": "SECONDS"}),
        ("--max-frame-bytes", int, DEFAULT_MAX_FRAME_BYTES, "", {}),
        ("--output-limit", int, DEFAULT_OUTPUT_LIMIT, "characters of a command's output kept in memory", {}),
        ("--listen-fd", int, None, "serve on this inherited listening socket instead of making --socket",
         {"metavar": "FD"}),
        ("--end-namespace", FLAG, False, "the daemon owns its PID namespace: on leaving, end every process in it", {}),
        ("--execd-fd", int, None, "serve the execd endpoint on this inherited listening socket", {"metavar": "FD"}),
        ("--log-level", str, "warning", "what the daemon logs on its stderr (its daemon.log); the host's OWSANDBOX_LOG",
         {"choices": LOG_LEVELS}),
    )),
    "attach": ("relay stdin/stdout to the daemon's socket", (
        ("--socket", str, None, "", {"required": True}),
        ("--start", REST, None, "if no daemon listens, start one with these `serve` arguments (must come last)",
         {"metavar": "SERVE-ARGS"}),
        ("--silence-seconds", float, 0, "leave after this long without a byte from the client (0 = never)", {}),
    )),
    "forward": ("relay stdin/stdout to the execd endpoint's socket (one connection)", (
        ("--socket", str, None, "", {"required": True}),
    )),
}


class Arguments:
    """What a command line said: `command` and each option by its name (`--log-dir` as `log_dir`)."""

    def __init__(self, command: str, **values: Any) -> None:
        self.command = command
        self.__dict__.update(values)

    def __eq__(self, other: object) -> bool:
        return vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"Arguments({vars(self)!r})"


def _dest(name: str) -> str:
    return name[2:].replace("-", "_")


def quick_parse(argv: list[str]) -> Arguments | None:
    """`argv` read without argparse when it has the plain form the providers write: a command, then
    `--name value` and flags, each at most once and spelled out, a value not starting with `-`; None
    for anything else, which argparse then reads (and answers with its usage or error)."""
    if not argv or argv[0] not in COMMANDS:
        return None
    options = {name: (kind, default, extra) for name, kind, default, _help, extra in COMMANDS[argv[0]][1]}
    values: dict[str, Any] = {}
    rest = argv[1:]
    while rest:
        name, rest = rest[0], rest[1:]
        if name not in options or _dest(name) in values:
            return None
        kind, _default, extra = options[name]
        if kind is FLAG:
            values[_dest(name)] = True
            continue
        if kind is REST:
            values[_dest(name)] = rest
            break
        if not rest or rest[0].startswith("-"):
            return None
        try:
            value = kind(rest[0])
        except ValueError:
            return None
        if value not in extra.get("choices", (value,)):
            return None
        values[_dest(name)] = value
        rest = rest[1:]
    for name, (_kind, default, extra) in options.items():
        if _dest(name) not in values:
            if extra.get("required"):
                return None
            values[_dest(name)] = default
    return Arguments(argv[0], **values)


def build_parser(prog: str = "runner") -> Any:
    """argparse's reading of `COMMANDS`: for a command line `quick_parse` leaves, and for `--help`."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description="The owsandbox tool runner (inside the sandbox).")
    sub = parser.add_subparsers(dest="command", required=True)
    for command, (about, options) in COMMANDS.items():
        one = sub.add_parser(command, help=about)
        for name, kind, default, text, extra in options:
            if kind is FLAG:
                one.add_argument(name, action="store_true", help=text or None)
            elif kind is REST:
                one.add_argument(name, nargs=argparse.REMAINDER, help=text or None, **extra)
            else:
                one.add_argument(name, type=kind, default=default, help=text or None, **extra)
    return parser


def main(argv: list[str] | None = None, prog: str = "runner") -> int:
    given = sys.argv[1:] if argv is None else argv
    args = quick_parse(given) or build_parser(prog).parse_args(given)
    if args.command == "serve":
        from .daemon import serve as run_daemon
        from .log import configure

        configure(args.log_level)  # lines on stderr, as `logging` wrote them (log.py)
        return run_daemon(args.socket, args.cwd, args.exit_with_parent, args.log_dir,
                          args.max_frame_bytes, args.output_limit, args.linger, args.listen_fd, args.execd_fd,
                          args.end_namespace)
    from .relay import attach as run_relay

    if args.command == "forward":  # the same byte relay, to the endpoint of long-running programs
        return run_relay(args.socket, 0, half_close=True)
    return run_relay(args.socket, args.silence_seconds, start_args=args.start)


if __name__ == "__main__":
    sys.exit(main())
