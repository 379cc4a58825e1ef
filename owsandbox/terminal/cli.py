"""`owsandbox shell --existing [CONNECTION_FILE]`: a terminal on a new shell in a running kernel's sandbox."""

from __future__ import annotations

import argparse
import os
import sys

from .locate import NoSandbox, find_sandbox
from .rawterm import NotATerminal
from .session import TerminalError, TerminalSession


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="owsandbox shell",
        description="Open a terminal on a new shell in the sandbox of a running owsandbox kernel: the same files, "
                    "private /tmp, limits and network as its notebook; the notebook's shells are not touched. "
                    "Leave it as any shell (exit, Ctrl-D); nothing it started stays behind.")
    made.add_argument("--existing", nargs="?", const="", default=None, metavar="CONNECTION_FILE",
                      help="the kernel's connection file (a path, or a name in Jupyter's runtime folder, as "
                           "jupyter console --existing takes it; %%terminal open in the notebook prints it); "
                           "with none, the newest kernel that has a live owsandbox sandbox")
    made.add_argument("-q", "--quiet", action="store_true", help="no line saying which sandbox the terminal is in")
    return made


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.existing is None:
        parser().error("say which kernel: --existing [CONNECTION_FILE] (with no file, the newest owsandbox kernel)")
    if not os.isatty(0) or not os.isatty(1):
        print("owsandbox shell: needs a terminal (its input and output are not both one)", file=sys.stderr)
        return 2
    try:
        sandbox = find_sandbox(args.existing)
    except NoSandbox as exc:
        print(f"owsandbox shell: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"[owsandbox shell: a new shell in the sandbox of kernel {sandbox.kernel_id} "
              f"({sandbox.connection_file}); exit or Ctrl-D leaves]", file=sys.stderr, flush=True)
    session = TerminalSession(sandbox.endpoint, term=os.environ.get("TERM"), colorterm=os.environ.get("COLORTERM"))
    try:
        outcome = session.run()
    except (TerminalError, NotATerminal) as exc:
        print(f"owsandbox shell: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a SIGINT from elsewhere: keys never make one in raw mode
        print("owsandbox shell: interrupted; the terminal's session is deleted", file=sys.stderr)
        return 130
    if outcome.problem:
        print(f"owsandbox shell: {outcome.problem}", file=sys.stderr)
    return outcome.exit_code
