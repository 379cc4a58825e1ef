"""The Jupyter kernelspec for owsandbox: build kernel.json, install and remove it.

Jupyter finds a kernel through a folder holding `kernel.json` (how to start it) and logos. This module
builds that folder in one place, so that the copy shipped in the wheel (`share/jupyter/kernels/owsandbox`,
registered by `pip install`), the one `owsandbox install` writes, and the tests agree. Installing a
second spec under another name (`--name box-ssh --provider exec --env OWSANDBOX_EXEC=...`) is how one
notebook server offers several sandboxes.

`jupyter_client` is imported only by `install`/`uninstall`, so building a spec needs nothing beyond the
standard library.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from .. import settings

KERNEL_NAME = "owsandbox"
DISPLAY_NAME = "Sandbox (bash)"
KERNEL_MODULE = "owsandbox.kernel"
# How Jupyter starts the kernel. Not `python -m owsandbox.kernel`: `-m` (and `-c`) put the current
# folder first on sys.path, and the kernel starts in the notebook's folder, which the sandbox writes: a
# cell could leave an `ipykernel.py` (or any module the kernel imports later) there, and the next start
# or restart would run it on this machine. So the path's empty entries go before anything is imported
# (`sys` is built in); `-P` would do the same, but only from Python 3.11 and the interpreter here is the
# Jupyter server's.
KERNEL_BOOT = f"import sys; sys.path[:] = [p for p in sys.path if p]; from {KERNEL_MODULE}.__main__ import main; main()"


def kernel_argv(executable: str = "python") -> list[str]:
    """The kernelspec's argv: `executable` started on the kernel without the current folder on its path."""
    return [executable, "-c", KERNEL_BOOT, "-f", "{connection_file}"]

RESOURCES = Path(__file__).parent / "resources"
LOGOS = ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg")


class KernelSpecNotFound(KeyError):
    """No kernelspec of that name is installed (a KeyError, as jupyter_client raises, with a readable message)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def kernel_dict(
    provider: str | None = None,
    env: dict[str, str] | None = None,
    display_name: str | None = None,
    executable: str = "python",
    limits: list[str] | None = None,
    image: str | None = None,
    engine: str | None = None,
    baseline: str | None = None,
    record: str | None = None,
    gateway: str | None = None,
    hosts: list[str] | None = None,
    docker: str | None = None,
    launch_timeout: float | None = None,
    kernel_provisioner: str | None = None,
) -> dict[str, Any]:
    """The content of kernel.json.

    `executable` "python" is replaced by jupyter_client with the interpreter that launches the kernel;
    `install` passes the full `sys.executable` so the kernel runs where owsandbox is installed.
    `provider` becomes `OWSANDBOX_PROVIDER` in the kernel's environment (it wins over one in `env`).
    `image` and `engine` (the `container` provider's; an image alone chooses that provider) become
    `OWSANDBOX_IMAGE` and `OWSANDBOX_ENGINE`. `gateway` ("ssh") and `hosts` make it Enterprise Gateway's
    remote kernelspec (owsandbox.kernelspec.gateway); with `gateway` "docker" or "swarm", `image` is the image of
    the kernels' containers and `docker` the gateway's docker client, not the container provider's;
    `launch_timeout` is the gateway's launch timeout the spec asks for (its default when None).
    `kernel_provisioner` ("distributed") and `hosts` make it the spec of a kernel provisioner that starts the
    kernel on those hosts for a plain Jupyter server (owsandbox.kernelspec.gateway), with no gateway.
    """
    remote = gateway or kernel_provisioner
    if gateway and kernel_provisioner:
        raise ValueError("--enterprise-gateway and --kernel-provisioner are two ways to start the kernel on another "
                         "host (through a gateway, or by the Jupyter server itself): choose one")
    if launch_timeout is not None and not remote:
        raise ValueError("--launch-timeout is for --enterprise-gateway and --kernel-provisioner: the wait for a "
                         "remote kernel to start")
    if hosts and not remote:
        raise ValueError("--hosts is for --enterprise-gateway ssh and --kernel-provisioner distributed")
    if kernel_provisioner and docker:
        raise ValueError("--docker is for --enterprise-gateway docker or swarm, not --kernel-provisioner")
    if docker and gateway not in ("docker", "swarm"):
        raise ValueError("--docker is for --enterprise-gateway docker or swarm")
    gateway_image = None
    if gateway in ("docker", "swarm"):
        if engine:
            raise ValueError(f"--engine is the container provider's; --enterprise-gateway {gateway} runs the kernel "
                             "itself in a container, with --image and --docker")
        gateway_image, image = image, None
    kernel_env = dict(env or {})
    if image or engine:
        provider = provider or "container"
        if provider != "container":
            raise ValueError(f"--image and --engine are for the container provider, not {provider!r}")
        if engine and engine not in ("podman", "docker"):
            raise ValueError(f"--engine {engine!r}: the container engine must be podman or docker")
    if image:
        kernel_env[settings.IMAGE] = image
    if baseline:
        kernel_env[settings.BASELINE] = baseline_value(baseline)
    if record:  # `~` and `$USER` are left for the kernel: each student's own
        kernel_env[settings.RECORD] = record if record.startswith("~") or "$" in record else os.path.abspath(record)
    if engine:
        kernel_env[settings.ENGINE] = engine
    if provider:
        kernel_env[settings.PROVIDER] = provider
    # A variable given to the kernelspec is meant for the cells: it passes into the sandbox's clean
    # environment by name. The kernel's own settings (OWSANDBOX_*) stay with the kernel.
    passed = [n for n in kernel_env if not n.startswith("OWSANDBOX_")]
    if passed:
        earlier = list(settings.settings_of(kernel_env).env)
        kernel_env[settings.ENV] = ",".join(dict.fromkeys(earlier + passed))
    if limits:
        from ..host.isolation.resources import Limits

        Limits.parse(limits)  # a wrong limit fails here, at install, not at the first cell
        kernel_env[settings.LIMITS] = ",".join(limits)
    settings.Settings.from_env(kernel_env)  # and so does a wrong setting (--env): a SettingsError naming it
    spec: dict[str, Any] = {
        "argv": kernel_argv(executable),
        "display_name": display_name or DISPLAY_NAME,
        "language": "bash",
        "interrupt_mode": "message",
    }
    if kernel_env:
        spec["env"] = kernel_env
    spec["metadata"] = {
        "owsandbox": {"provider": settings.settings_of(kernel_env).provider or "auto"},
        "debugger": False,
    }
    if gateway:
        from .gateway import gateway_spec

        spec = gateway_spec(spec, gateway, hosts, executable, gateway_image, docker, launch_timeout)
    elif kernel_provisioner:
        from .gateway import provisioner_spec

        spec = provisioner_spec(spec, kernel_provisioner, hosts, executable, launch_timeout)
    return spec


def baseline_value(given: str) -> str:
    """`--baseline`: a folder of the lab's starting files (made absolute; it must be here) or a snapshot's name."""
    if "/" in given or given.startswith(("~", ".")):
        folder = os.path.realpath(os.path.expanduser(given))
        if not os.path.isdir(folder):
            raise ValueError(f"--baseline {given!r}: {folder} is not a folder (give a folder of the lab's starting "
                             "files, or the name of a snapshot)")
        return folder
    from ..host.snapshots.store import SnapshotError, check_name

    try:
        return check_name(given)
    except SnapshotError as exc:
        raise ValueError(f"--baseline {given!r}: {exc}") from None


def write_kernelspec(dest: Path | str, **kw: Any) -> Path:
    """Write kernel.json (from `kernel_dict(**kw)`) and the three logos into `dest`; return `dest`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "kernel.json").write_text(json.dumps(kernel_dict(**kw), indent=2) + "\n", encoding="utf-8")
    for logo in LOGOS:
        shutil.copyfile(RESOURCES / logo, dest / logo)
    return dest


def install(
    user: bool = False,
    prefix: str | None = None,
    sys_prefix: bool = False,
    name: str = KERNEL_NAME,
    display_name: str | None = None,
    provider: str | None = None,
    env: dict[str, str] | None = None,
    limits: list[str] | None = None,
    image: str | None = None,
    engine: str | None = None,
    baseline: str | None = None,
    record: str | None = None,
    gateway: str | None = None,
    hosts: list[str] | None = None,
    docker: str | None = None,
    launch_timeout: float | None = None,
    kernel_provisioner: str | None = None,
) -> str:
    """Install the kernelspec and return the folder it landed in.

    Where: `user` → the Jupyter data dir (`$JUPYTER_DATA_DIR` or `~/.local/share/jupyter`) `/kernels/NAME`;
    `prefix` → `PREFIX/share/jupyter/kernels/NAME`; `sys_prefix` → the same with `sys.prefix`;
    none → the system-wide Jupyter dir (usually `/usr/local/share/jupyter/kernels/NAME`).
    A spec of the same name there is replaced.
    """
    if sys_prefix:
        if prefix:
            raise ValueError("Can't specify both prefix and sys_prefix. Please choose one or the other.")
        prefix = sys.prefix
    if user and prefix:
        where = "sys_prefix" if sys_prefix else "prefix"
        raise ValueError(f"Can't specify both user and {where}. Please choose one or the other.")
    if display_name is None and name.lower() != KERNEL_NAME:
        display_name = f"{DISPLAY_NAME} [{name}]"
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory(prefix="owsandbox-kernelspec-") as tmp:
        staged = write_kernelspec(
            Path(tmp) / name, provider=provider, env=env, display_name=display_name, executable=sys.executable,
            limits=limits, image=image, engine=engine, baseline=baseline, record=record, gateway=gateway,
            hosts=hosts, docker=docker, launch_timeout=launch_timeout, kernel_provisioner=kernel_provisioner,
        )
        return KernelSpecManager().install_kernel_spec(str(staged), name, user=user, prefix=prefix)


def _owsandbox_specs(specs: dict[str, str]) -> dict[str, str]:
    """The installed specs that start the owsandbox kernel (name → folder)."""
    found = {}
    for spec_name, folder in sorted(specs.items()):
        try:
            spec = json.loads((Path(folder) / "kernel.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        argv = [str(word) for word in spec.get("argv", [])]
        if any(KERNEL_MODULE in word for word in argv) or "owsandbox" in (spec.get("metadata") or {}):
            found[spec_name] = folder
    return found


def uninstall(name: str = KERNEL_NAME) -> str:
    """Remove the installed kernelspec `name` and return the folder removed; KernelSpecNotFound if none."""
    from jupyter_client.kernelspec import KernelSpecManager

    manager = KernelSpecManager()
    manager.ensure_native_kernel = False
    specs = manager.find_kernel_specs()
    name = name.lower()
    if name not in specs:
        ours = _owsandbox_specs(specs)
        listing = ", ".join(f"{n} ({folder})" for n, folder in ours.items()) or "none"
        raise KernelSpecNotFound(
            f"No kernelspec named {name!r} is installed. Installed owsandbox kernelspecs: {listing}. "
            "(A spec installed with --prefix P is found only when P/share/jupyter is on JUPYTER_PATH.)"
        )
    return manager.remove_kernel_spec(name)


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"malformed {text!r}: expected KEY=VALUE, as in OWSANDBOX_EXEC='ssh me@host'")
    return key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="owsandbox",
                                     description="Install or remove the owsandbox Jupyter kernelspec.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{install,uninstall}")

    inst = commands.add_parser("install", help="install the kernelspec",
                               description="Install the owsandbox kernelspec for Jupyter.")
    where = inst.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user instead of system-wide")
    where.add_argument("--sys-prefix", action="store_true",
                       help=f"install to Python's sys.prefix. Shorthand for --prefix='{sys.prefix}'. "
                            "For use in conda/virtual-envs.")
    where.add_argument("--prefix", default=None,
                       help="install prefix for the kernelspec (PREFIX/share/jupyter/kernels/NAME). "
                            "Needed to install into a non-default location, such as a conda/virtual-env.")
    inst.add_argument("--name", default=KERNEL_NAME,
                      help=f"name of the kernelspec (default: {KERNEL_NAME}); "
                           "needed to have several sandboxes at the same time")
    inst.add_argument("--display-name", default=None,
                      help=f"name shown in Jupyter (default: '{DISPLAY_NAME}', with [NAME] for another --name)")
    inst.add_argument("--provider", default=None,
                      help="sandbox provider the kernel uses (sets OWSANDBOX_PROVIDER; default: chosen at start)")
    inst.add_argument("--env", action="extend", nargs="+", type=_env_pair, default=[], metavar="KEY=VALUE",
                      help="environment variable for the kernel, passed on into the sandbox; repeatable")
    inst.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                      help="a limit of the sandbox: memory=2G, pids=512, tmp=1G, shm=64M, cpu=2; repeatable")
    inst.add_argument("--image", default=None,
                      help="the container image of the container provider (sets OWSANDBOX_IMAGE; "
                           "implies --provider container); with --enterprise-gateway docker or swarm, the image of "
                           "the kernels' containers")
    inst.add_argument("--engine", default=None, choices=("podman", "docker"),
                      help="the container engine (sets OWSANDBOX_ENGINE; default: podman, else docker, on PATH)")
    inst.add_argument("--baseline", default=None, metavar="DIR|NAME",
                      help="what %%snapshot restore --baseline returns the workspace to: a folder of the lab's "
                           "starting files, or a snapshot's name (sets OWSANDBOX_BASELINE)")
    inst.add_argument("--record", default=None, metavar="DIR",
                      help="record every session as an asciicast file in DIR, a folder outside the students' "
                           "workspaces; ~ and $USER are each user's (sets OWSANDBOX_RECORD)")
    inst.add_argument("--enterprise-gateway", default=None, choices=("ssh", "docker", "swarm"),
                      metavar="ssh|docker|swarm",
                      help="a kernelspec for Jupyter Enterprise Gateway: kernels started over ssh on --hosts "
                           "(its DistributedProcessProxy), in containers of --image (its DockerProcessProxy), or "
                           "as Docker Swarm services of --image (its DockerSwarmProcessProxy), by owsandbox's "
                           "own launchers")
    inst.add_argument("--kernel-provisioner", default=None, choices=("distributed",), metavar="distributed",
                      help="a kernelspec for a plain Jupyter server (no gateway) that starts kernels over ssh on "
                           "--hosts: gateway_provisioners' DistributedProvisioner, with owsandbox's launcher; a "
                           "restart stays on its host (pip install 'owsandbox[provisioners]' where the server runs)")
    inst.add_argument("--hosts", default=None, metavar="H1,H2",
                      help="the hosts kernels are started on, in turn (with --enterprise-gateway ssh or "
                           "--kernel-provisioner distributed)")
    inst.add_argument("--docker", default=None, metavar="PATH",
                      help="the docker client that starts the kernels' containers on the gateway's host (with "
                           "--enterprise-gateway docker or swarm; default: the one on PATH)")
    inst.add_argument("--launch-timeout", default=None, type=float, metavar="SECONDS",
                      help="how long the gateway waits for a kernel to start, asked for by the spec as "
                           "KERNEL_LAUNCH_TIMEOUT (with --enterprise-gateway; default: 180, the gateway's own is 30; "
                           "a request's KERNEL_LAUNCH_TIMEOUT wins); with --kernel-provisioner, the provisioner's "
                           "launch_timeout")

    uninst = commands.add_parser("uninstall", help="remove an installed kernelspec",
                                 description="Remove an installed owsandbox kernelspec.")
    uninst.add_argument("--name", default=KERNEL_NAME, help=f"name of the kernelspec (default: {KERNEL_NAME})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`owsandbox install ...` / `owsandbox uninstall ...`; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "uninstall":
        try:
            removed = uninstall(args.name)
        except KernelSpecNotFound as e:
            print(f"owsandbox uninstall: {e}", file=sys.stderr)
            return 1
        print(f"Removed kernelspec {args.name.lower()} from {removed}")
        return 0
    try:
        hosts = None
        if args.hosts is not None:
            from .gateway import parse_hosts

            hosts = parse_hosts(args.hosts)
        dest = install(user=args.user, prefix=args.prefix, sys_prefix=args.sys_prefix, name=args.name,
                       display_name=args.display_name, provider=args.provider, env=dict(args.env),
                       limits=args.limit, image=args.image, engine=args.engine, baseline=args.baseline,
                       record=args.record, gateway=args.enterprise_gateway, hosts=hosts,
                       docker=args.docker, launch_timeout=args.launch_timeout,
                       kernel_provisioner=args.kernel_provisioner)
    except ValueError as e:
        print(f"owsandbox install: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            print(e, file=sys.stderr)
            if not args.user:
                print("Perhaps you want `sudo`, `--user` or `--sys-prefix`?", file=sys.stderr)
            return 1
        raise
    print(f"Installed kernelspec {os.path.basename(dest)} in {dest}")
    return 0
