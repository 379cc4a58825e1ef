"""The command line of the box: `serve` runs the daemon, `attach` runs a relay.

It is what runs as `python3 -S runner-<hash>.pyz ...` inside a sandbox, and as
`owsandbox runner serve|attach ...` from an installed package.
"""

from __future__ import annotations

import argparse
import sys

# The defaults of `serve`, written here so that a relay (`attach`), which starts once per pipe, does
# not import the daemon's modules. A test checks they equal the daemon's own.
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
DEFAULT_OUTPUT_LIMIT = 1024 * 1024


def build_parser(prog: str = "runner") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="The owsandbox tool runner (inside the sandbox).")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the daemon on a Unix socket")
    serve.add_argument("--socket", required=True, help="socket path; its folder is made private (0700)")
    serve.add_argument("--cwd", default=None, help="the folder new shells start in")
    serve.add_argument("--log-dir", default=None, help="where output past the in-memory cap is kept")
    serve.add_argument("--exit-with-parent", action="store_true", help="stop when the parent process goes")
    serve.add_argument("--linger", type=float, default=0, metavar="SECONDS",
                       help="stop after this long with no client connected (0 = never)")
    serve.add_argument("--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME_BYTES)
    serve.add_argument("--output-limit", type=int, default=DEFAULT_OUTPUT_LIMIT,
                       help="characters of a command's output kept in memory")
    serve.add_argument("--listen-fd", type=int, default=None, metavar="FD",
                       help="serve on this inherited listening socket instead of making --socket")
    serve.add_argument("--end-namespace", action="store_true",
                       help="the daemon owns its PID namespace: on leaving, end every process in it")
    serve.add_argument("--execd-fd", type=int, default=None, metavar="FD",
                       help="serve the execd endpoint on this inherited listening socket")
    serve.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                       help="what the daemon logs on its stderr (its daemon.log); the host's OWSANDBOX_LOG")
    attach = sub.add_parser("attach", help="relay stdin/stdout to the daemon's socket")
    attach.add_argument("--socket", required=True)
    attach.add_argument("--start", nargs=argparse.REMAINDER, metavar="SERVE-ARGS",
                        help="if no daemon listens, start one with these `serve` arguments (must come last)")
    attach.add_argument("--silence-seconds", type=float, default=0,
                        help="leave after this long without a byte from the client (0 = never)")
    forward = sub.add_parser("forward", help="relay stdin/stdout to the execd endpoint's socket (one connection)")
    forward.add_argument("--socket", required=True)
    return parser


def main(argv: list[str] | None = None, prog: str = "runner") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.command == "serve":
        import logging

        from .daemon import serve as run_daemon

        logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                            format="%(asctime)s [owbox %(levelname)s %(name)s] %(message)s")

        return run_daemon(args.socket, args.cwd, args.exit_with_parent, args.log_dir,
                          args.max_frame_bytes, args.output_limit, args.linger, args.listen_fd, args.execd_fd,
                          args.end_namespace)
    from .relay import attach as run_relay

    if args.command == "forward":  # the same byte relay, to the endpoint of long-running programs
        return run_relay(args.socket, 0, half_close=True)
    return run_relay(args.socket, args.silence_seconds, start_args=args.start)


if __name__ == "__main__":
    sys.exit(main())
