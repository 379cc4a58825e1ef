"""The `owsandbox` command: `runner build|serve|attach`, `run` (one command in a sandbox), `install`/`uninstall`
(the Jupyter kernelspec), `shell --existing` (a terminal in a running kernel's sandbox), `settings` (every
`OWSANDBOX_*` setting and its value here)."""

from __future__ import annotations

import argparse
import json
import sys


def _runner(argv: list[str]) -> int:
    if argv and argv[0] == "build":
        parser = argparse.ArgumentParser(prog="owsandbox runner build",
                                         description="Pack the in-box runner into its zipapp and print its path.")
        parser.add_argument("--out", default=None, help="folder for the zipapp (default: the user cache)")
        args = parser.parse_args(argv[1:])
        from .host.bundle import build_runner_zipapp

        print(build_runner_zipapp(args.out))
        return 0
    from .box.cli import main as box_main

    return box_main(argv, prog="owsandbox runner")


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="owsandbox run", description="Run shell commands in a sandbox, one after another on the same shell. "
        "Says on stderr where they ran; refuses to run them unsandboxed unless asked (--provider local).")
    parser.add_argument("--provider", default=None,
                        help="sandbox provider: auto, bwrap, container, exec, opensandbox, or local or direct "
                             "(this machine, unsandboxed) (default: $OWSANDBOX_PROVIDER, else auto: bwrap where "
                             "bubblewrap works, else a refusal)")
    parser.add_argument("--cwd", default=None, help="the workspace folder (default: here)")
    parser.add_argument("--json", action="store_true", help="print each result as JSON, with the provider")
    parser.add_argument("commands", nargs="+", help="commands, each run on the same shell in turn")
    args = parser.parse_args(argv)
    import os

    from .host.workspace import DEFAULT_PROVIDER, RunnerWorkspace, open_workspace
    from .settings import Settings, SettingsError

    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"owsandbox run: {exc}", file=sys.stderr)
        return 2
    name = args.provider or settings.provider or DEFAULT_PROVIDER
    if name == "auto":
        from .host.providers import bwrap_problem

        problem = bwrap_problem()
        if problem is not None:
            print(f"owsandbox run: no sandbox here: {problem} (Debian: apt-get install bubblewrap). To run the "
                  "commands on this machine, unsandboxed, say so: --provider local", file=sys.stderr)
            return 2
    status = 0
    try:
        workspace = open_workspace(args.cwd, name, settings)
    except (ValueError, RuntimeError, OSError) as exc:  # a setting or a sandbox refused: said, no traceback
        print(f"owsandbox run: no sandbox: {exc}", file=sys.stderr)
        return 2
    try:
        if isinstance(workspace, RunnerWorkspace):
            provider, facts = workspace.provider.name, workspace.provider.headline()
        else:
            provider, facts = "direct", ["direct", "no isolation: commands run in this process's machine"]
        print(f"owsandbox run: in {' · '.join(facts)}", file=sys.stderr)
        for command in args.commands:
            result = workspace.executor.run(command)
            if args.json:
                print(json.dumps({**result, "provider": provider}))
            else:
                sys.stdout.write(result["output"])
                if result.get("error"):
                    print(f"[{result['error']}]", file=sys.stderr)
            status = result["exit_code"] if isinstance(result["exit_code"], int) else 1
    finally:
        workspace.close()
    return status


def _install(argv: list[str]) -> int:
    from .kernelspec import main as kernelspec_main

    return kernelspec_main(["install", *argv])


def _uninstall(argv: list[str]) -> int:
    from .kernelspec import main as kernelspec_main

    return kernelspec_main(["uninstall", *argv])


def _tour(argv: list[str]) -> int:
    from .tour import main as tour_main

    return tour_main(argv)


def _shell(argv: list[str]) -> int:
    from .terminal.cli import main as shell_main

    return shell_main(argv)


def _replay(argv: list[str]) -> int:
    from .kernel.teaching.recording import replay_main

    return replay_main(argv)


def _settings(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="owsandbox settings",
                                     description="List every OWSANDBOX_* setting: what it does, and its value here.")
    parser.parse_args(argv)
    import os

    from .settings import shown

    wrong = []
    for setting, value, error in shown(os.environ):
        print(f"{setting.name}={'' if value is None else value}\n    {setting.meaning}")
        if error is not None:
            print(f"    INVALID: {setting.name} takes {setting.takes}")
            wrong.append(error)
    for error in wrong:
        print(f"owsandbox settings: {error}", file=sys.stderr)
    return 1 if wrong else 0


def _gateway_kernel(argv: list[str]) -> int:
    from .kernelspec.gateway_launcher import launch

    return launch(argv)


def _gateway_docker(argv: list[str]) -> int:
    from .kernelspec.gateway_docker import launch

    return launch(argv)


def _gateway_swarm(argv: list[str]) -> int:
    from .kernelspec.gateway_swarm import launch

    return launch(argv)


#: Each command and what it is for; `owsandbox COMMAND --help` says more.
COMMANDS = (
    ("tour NOTEBOOK", "run a notebook's cells in a copy of its folder and show what each printed"),
    ("run COMMAND...", "run shell commands in a sandbox and say where they ran"),
    ("shell --existing", "a terminal in a running kernel's sandbox"),
    ("replay FILE.cast", "play a %record recording back in this terminal, its controls filtered"),
    ("install", "install the kernelspec (--user, --sys-prefix, --prefix, --name, --provider, ...)"),
    ("uninstall", "remove an installed kernelspec"),
    ("settings", "every OWSANDBOX_* setting: what it does, and its value here"),
    ("runner build|serve|attach", "the in-box runner: pack its zipapp, or run it (the providers do)"),
    ("gateway-kernel", "the kernel's launcher under Jupyter Enterprise Gateway (the kernelspec calls it)"),
    ("gateway-docker", "a kernel's container under Enterprise Gateway's DockerProcessProxy"),
    ("gateway-swarm", "a kernel's Docker Swarm service under Enterprise Gateway's DockerSwarmProcessProxy"),
)
USAGE = "usage: owsandbox COMMAND [ARGS...]\n\ncommands:\n" + "\n".join(
    f"  {command:<27} {meaning}" for command, meaning in COMMANDS)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"runner": _runner, "run": _run, "install": _install, "uninstall": _uninstall, "tour": _tour,
                "shell": _shell, "replay": _replay, "settings": _settings, "gateway-kernel": _gateway_kernel,
                "gateway-docker": _gateway_docker, "gateway-swarm": _gateway_swarm}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        out = sys.stdout if not argv or argv[0] in ("-h", "--help") else sys.stderr
        print(USAGE, file=out)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"owsandbox: unknown command '{argv[0]}'", file=sys.stderr)
            return 2
        return 0
    from .logs import configure

    configure()
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
