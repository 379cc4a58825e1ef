"""`owsandbox gateway-docker`: the gateway-side half of an owsandbox kernel in a Docker container.

Enterprise Gateway's DockerProcessProxy runs the kernelspec's argv on the gateway's own host and
expects it to start a container, then finds that container by its label `kernel_id=<id>`, takes
its address on the Docker network named by the gateway's EG_DOCKER_NETWORK (which it passes to
this launcher), and waits on its response address for the kernel's connection information. To end a
kernel it removes the container. This launcher starts that container with the docker client
the spec names, running `owsandbox gateway-kernel` (owsandbox.kernelspec.gateway_launcher) from the
image, which answers the gateway; nothing of the gateway's code is used.

What the container gets, and why:

* the spec's pinned image: a request whose KERNEL_IMAGE names another one is refused (the gateway
  lets a client choose it, and the container runs with the allowances below);
* KERNEL_UID:KERNEL_GID as its user (the gateway refuses uid 0 by default; this launcher always does,
  since a root kernel with the wider /proc below could write the host's sysctls), no capabilities,
  no-new-privileges;
* only the kernel's variables: the request's KERNEL_*, the spec's OWSANDBOX_* settings, and
  JUPYTER_RUNTIME_DIR/HOME left to the image; never the gateway's own environment (its PATH, its
  DOCKER_HOST, its tokens);
* with the `bwrap` provider, what bubblewrap needs to nest: the engines' default seccomp profile
  (containers-common's file, which allows creating user namespaces) with owsandbox's no-setuid rules
  (owsandbox.host.isolation.container_seccomp) and sethostname allowed (`nested_bwrap_profile`), and
  `systempaths=unconfined`, without which the
  kernel refuses a fresh /proc in a user namespace while Docker's masks are over the container's. The
  kernel's user is not root, so the unmasked /proc is what an unprivileged user of a host sees. With
  the `local` provider the container itself is the sandbox: Docker's own default profile, said in
  the log.

The launcher then follows the container's output (on its stderr, which the gateway logs) until the
kernel says it has answered the gateway, and exits 0; if the container ends first, its output
is already in the gateway's log, the container is removed and the launcher exits 2, which the gateway
reports at once instead of waiting out its launch timeout.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from .. import settings
from .gateway_launcher import READY, LaunchError
from .gateway_launcher import parse as parse_gateway_args

LABELS = ("component=kernel", "app=enterprise-gateway")  # beside kernel_id=<id>, as the gateway's own launcher
DEFAULT_NETWORK = "bridge"  # the gateway's default for EG_DOCKER_NETWORK
DEFAULT_UID, DEFAULT_GID = "1000", "100"  # the gateway's defaults, when it passes none
IN_IMAGE_COMMAND = "owsandbox"  # on the image's PATH
DOCKER_SECONDS = 120.0
NESTED_BWRAP_CALLS = ("sethostname", "setdomainname")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def parse(argv: list[str], prog: str = "owsandbox gateway-docker",
          description: str = "Start owsandbox's kernel in a Docker container for Jupyter Enterprise Gateway's "
                             "DockerProcessProxy.",
          docker_help: str = "the docker client") -> tuple[argparse.Namespace, list[str]]:
    """Our own options, and the gateway's launcher arguments checked as `gateway-kernel` checks them (for
    gateway-swarm too, in its own words)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--image", required=True, help="the image (owsandbox installed in it)")
    parser.add_argument("--docker", default="docker", help=docker_help)
    ours, rest = parser.parse_known_args(argv)
    parse_gateway_args(rest)
    return ours, rest


def numeric_id(name: str, value: str) -> str:
    if not value.isdigit():
        raise LaunchError(f"{name} {value!r} is not a number")
    if name == "KERNEL_UID" and int(value) == 0:
        raise LaunchError("KERNEL_UID 0: the kernel's container does not run as root (with bubblewrap's /proc "
                          "allowance root could write the host's kernel settings)")
    return value


def passed_names(env: dict[str, str]) -> list[str]:
    """The variables the container gets, by name (docker reads their values from this environment)."""
    own = {setting.name for setting in settings.describe()}
    return sorted(name for name in env if name in own or (name.startswith("KERNEL_") and _NAME.fullmatch(name)))


def nested_bwrap_seccomp() -> str:
    """The widened profile for nested bubblewrap, as JSON: what `docker run --security-opt seccomp=FILE`
    reads from its file, and what Docker's API (a JupyterHub DockerSpawner's `security_opt`) takes
    itself, `seccomp=` followed by this text."""
    from ..host.isolation.container_seccomp import default_profile_path, extend_profile

    base = default_profile_path()
    if base is None:
        raise LaunchError("bubblewrap cannot nest in the container without a seccomp profile that allows user "
                          "namespaces, and there is no engines' default profile to extend here (install "
                          "containers-common); or install the spec with --provider local, the container "
                          "itself as the sandbox")
    return json.dumps(nested_bwrap_profile(extend_profile(json.loads(Path(base).read_text()))))


def seccomp_file(folder: Path) -> Path:
    """The widened profile for nested bubblewrap, written to `folder`."""
    path = folder / "seccomp.json"
    path.write_text(nested_bwrap_seccomp())
    return path


def nested_bwrap_profile(profile: dict[str, Any]) -> dict[str, Any]:
    """`profile` with NESTED_BWRAP_CALLS allowed whatever the container's capabilities. The engines allow
    them only to a container with CAP_SYS_ADMIN, and this one has none; bubblewrap names its box's
    host (`--hostname`) in the UTS namespace it made, where it holds that capability. The kernel still
    checks it: in the container's own namespaces the calls fail as before. Their other rules go, so
    that no two rules of different actions overlap (see container_seccomp)."""
    widened = copy.deepcopy(profile)
    kept = []
    for rule in widened["syscalls"]:
        names = [name for name in rule.get("names", []) if name not in NESTED_BWRAP_CALLS]
        if names:
            kept.append({**rule, "names": names})
    kept.append({"names": list(NESTED_BWRAP_CALLS), "action": "SCMP_ACT_ALLOW", "args": [],
                 "comment": "owsandbox: bubblewrap's box names its own host, in a namespace of its own"})
    widened["syscalls"] = kept
    return widened


def run_argv(args: argparse.Namespace, gateway_args: list[str], env: dict[str, str], kernel_id: str,
             folder: Path) -> list[str]:
    """The `docker run` line for the kernel's container."""
    image = env.get("KERNEL_IMAGE") or args.image
    if image != args.image:
        raise LaunchError(f"KERNEL_IMAGE {image!r}: this kernelspec runs only its own image, {args.image}")
    uid = numeric_id("KERNEL_UID", env.get("KERNEL_UID") or DEFAULT_UID)
    gid = numeric_id("KERNEL_GID", env.get("KERNEL_GID") or DEFAULT_GID)
    network = env.get("EG_DOCKER_NETWORK") or DEFAULT_NETWORK
    argv = [args.docker, "run", "--detach", "--name", f"owsandbox-{kernel_id}", "--label", f"kernel_id={kernel_id}"]
    for label in LABELS:
        argv += ["--label", label]
    argv += ["--network", network, "--user", f"{uid}:{gid}", "--cap-drop", "ALL",
             "--security-opt", "no-new-privileges"]
    provider = settings.settings_of(env).provider or "auto"
    if provider == "local":
        print("owsandbox gateway-docker: provider local: the container itself is the kernel's sandbox (Docker's "
              "default seccomp profile, no capabilities)", file=sys.stderr, flush=True)
    else:
        argv += ["--security-opt", f"seccomp={seccomp_file(folder)}", "--security-opt", "systempaths=unconfined"]
    for name in passed_names(env):
        argv += ["--env", name]
    return [*argv, image, IN_IMAGE_COMMAND, "gateway-kernel", *gateway_args, "--container-proxy"]


def docker(args: argparse.Namespace, *words: str, timeout: float = DOCKER_SECONDS, env: dict[str, str] | None = None,
           check: bool = False) -> subprocess.CompletedProcess[str]:
    """`args.docker WORDS` (in `env`, this process's environment by default), its output kept; for
    gateway-swarm too. Loud: a client that cannot run or does not answer within `timeout` is a
    LaunchError naming the command, and so, with `check`, is a nonzero status, quoting the client's
    stderr. Without `check` the caller reads the status (a container that is already gone)."""
    command = " ".join(["docker", *words[:2 if words[:1] in (("service",), ("network",)) else 1]])  # `docker run`
    try:
        done = subprocess.run([args.docker, *words], capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"{command}: the docker client {args.docker} failed: {exc}") from None
    if check and done.returncode != 0:
        raise LaunchError(f"{command} failed (status {done.returncode}): {done.stderr.strip()}")
    return done


def follow(args: argparse.Namespace, name: str, seconds: float) -> bool:
    """Copy the container's output to stderr until the kernel says it answered the gateway (True), or
    the container ends (False), or `seconds` pass (True: the gateway's own timeout takes over)."""
    logs = subprocess.Popen([args.docker, "logs", "--follow", name], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    assert logs.stdout is not None
    timer = threading.Timer(seconds, logs.kill)  # ends the stream below, which cannot be read with a timeout
    timer.daemon = True
    timer.start()
    try:
        for raw in logs.stdout:
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            sys.stderr.flush()
            if READY in line and "gateway-kernel" in line:
                return True
        return not timer.is_alive()  # the timer fired: the container still runs, as far as we know
    finally:
        timer.cancel()
        logs.kill()
        logs.wait()


def launch_seconds(env: dict[str, str]) -> float:
    """How long the gateway waits for the kernel (its default, or the request's KERNEL_LAUNCH_TIMEOUT)."""
    try:
        return float(env.get("KERNEL_LAUNCH_TIMEOUT") or 30)
    except ValueError:
        return 30.0


def launch(argv: list[str], environ: dict[str, str] | None = None) -> int:
    """Start the kernel's container; 0 once its kernel has answered the gateway, 2 with the reason if not."""
    env = dict(os.environ if environ is None else environ)
    try:
        args, gateway_args = parse(argv)
        kernel_id = parse_gateway_args(gateway_args).kernel_id
        if not _NAME.fullmatch(kernel_id):
            raise LaunchError(f"--RemoteProcessProxy.kernel-id {kernel_id!r} is not a container name")
        with tempfile.TemporaryDirectory(prefix="owsandbox-gateway-docker-") as temp:
            line = run_argv(args, gateway_args, env, kernel_id, Path(temp))
            docker(args, *line[1:], env=env, check=True)  # the values of its `--env NAME`s are env's
        name = f"owsandbox-{kernel_id}"
        if follow(args, name, launch_seconds(env)):
            return 0
        state = docker(args, "inspect", "--format", "{{.State.ExitCode}}", name)
        docker(args, "rm", "--force", name)
        raise LaunchError(f"the kernel's container ended (status {state.stdout.strip() or '?'}) before its kernel "
                          "answered the gateway; its output is above")
    except LaunchError as exc:
        print(f"owsandbox gateway-docker: error: {exc}", file=sys.stderr, flush=True)
        return 2
