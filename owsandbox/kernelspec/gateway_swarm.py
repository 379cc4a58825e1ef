"""`owsandbox gateway-swarm`: the gateway-side half of an owsandbox kernel run as a Docker Swarm service.

Enterprise Gateway's DockerSwarmProcessProxy runs the kernelspec's argv on the gateway's own host and
expects it to start a service, then finds that service by its label `kernel_id=<id>`, takes the
address of its running task's first network attachment, and waits on its response address for the
kernel's connection information. To end a kernel (a delete, or the first half of a restart) it
removes the service. This launcher creates that service with the docker client the spec names: one
task of the spec's image running `owsandbox gateway-kernel` (owsandbox.kernelspec.gateway_launcher),
which answers the gateway; nothing of the gateway's code is used.

What the service gets, and why:

* the network the gateway names in EG_DOCKER_NETWORK, which must be a swarm overlay network: only an
  overlay's attachments carry the addresses the proxy reads (a swarm-scoped bridge's have none, and
  the gateway would fail on it with a KeyError), and the gateway itself must be on it to connect.
  The launcher checks it first and names what is wrong. The kernel binds the address facing the
  gateway's response address, which is its address on that network when the gateway is on it;
* endpoint mode `dnsrr`: no virtual IP and no load balancer in front of a one-task service (the
  gateway connects to the task's own address);
* restart condition `none`: a kernel that ended stays ended; restarting is the gateway's to do;
* Docker's init as the container's first process: the kernel as process 1 would ignore the SIGTERM
  that ends a removed service's container (Docker then waits out its grace period) and reap no
  orphaned process of the cells;
* the spec's pinned image (a request's KERNEL_IMAGE that differs is refused), KERNEL_UID:KERNEL_GID as
  its user (uid 0 refused), every capability dropped, and only the kernel's variables, as
  `owsandbox gateway-docker` does. Docker's service API has no unmasked /proc for a service's container
  (SwarmKit added seccomp profiles and `no-new-privileges` only in Docker 25, and `docker service
  create` has no `--security-opt` for them), so bubblewrap cannot nest in it: the spec's
  provider is `local`, the container itself being the sandbox under Docker's default profile, said in
  the gateway's log.

The launcher then follows the service's output (on its stderr, which the gateway logs) until the
kernel says it has answered the gateway, and exits 0; if the task ends first (failed, rejected, or
complete), the task's error is said, the service is removed and the launcher exits 2, which the gateway
reports at once instead of waiting out its launch timeout.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

from .. import settings
from .gateway_docker import (
    _NAME,
    DEFAULT_GID,
    DEFAULT_UID,
    IN_IMAGE_COMMAND,
    LABELS,
    docker,
    launch_seconds,
    numeric_id,
    passed_names,
)
from .gateway_docker import parse as parse_docker_args
from .gateway_launcher import READY, LaunchError
from .gateway_launcher import parse as parse_gateway_args

DEFAULT_NETWORK = "bridge"  # the gateway's default for EG_DOCKER_NETWORK (which no service can use)
MODE = "swarm"  # the gateway's EG_DOCKER_MODE for this proxy
ENDED_STATES = ("failed", "rejected", "complete", "shutdown", "orphaned", "remove")  # the proxy's error states
POLL_SECONDS = 0.5  # how often the task's state is read while its output is followed


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our own options, and the gateway's launcher arguments, as gateway-docker takes them."""
    return parse_docker_args(argv, prog="owsandbox gateway-swarm",
                             description="Start owsandbox's kernel as a Docker Swarm service for Jupyter Enterprise "
                                         "Gateway's DockerSwarmProcessProxy.",
                             docker_help="the docker client (of a swarm manager)")


def service_name(kernel_id: str) -> str:
    return f"owsandbox-{kernel_id}"


def check_mode(env: dict[str, str]) -> None:
    """The gateway says which of its Docker proxies runs this argv: a swarm spec under another is refused."""
    mode = env.get("EG_DOCKER_MODE")
    if mode and mode != MODE:
        raise LaunchError(f"EG_DOCKER_MODE is {mode!r}: this kernelspec is for the gateway's DockerSwarmProcessProxy "
                          "(owsandbox install --enterprise-gateway swarm); for DockerProcessProxy install it with "
                          "--enterprise-gateway docker")


def check_network(name: str, described: str) -> None:
    """`described` is `docker network inspect --format '{{.Scope}} {{.Driver}}'` of the network `name`."""
    words = described.split()
    if words != ["swarm", "overlay"]:
        found = f"a {words[0]}-scoped {words[1]} network" if len(words) == 2 else f"{described.strip()!r}"
        raise LaunchError(f"EG_DOCKER_NETWORK {name!r} is {found}: a swarm service's kernel needs an overlay network "
                          "(docker network create --driver overlay --attachable NAME) that the gateway is on too; "
                          "only an overlay's attachments carry the address the gateway connects to")


def service_argv(args: argparse.Namespace, gateway_args: list[str], env: dict[str, str], kernel_id: str) -> list[str]:
    """The `docker service create` line for the kernel's service."""
    image = env.get("KERNEL_IMAGE") or args.image
    if image != args.image:
        raise LaunchError(f"KERNEL_IMAGE {image!r}: this kernelspec runs only its own image, {args.image}")
    uid = numeric_id("KERNEL_UID", env.get("KERNEL_UID") or DEFAULT_UID)
    gid = numeric_id("KERNEL_GID", env.get("KERNEL_GID") or DEFAULT_GID)
    provider = settings.settings_of(env).provider or "auto"
    if provider != "local":
        raise LaunchError(f"the spec's provider is {provider}: a swarm service's container cannot nest bubblewrap "
                          "(no unmasked /proc for a service's container), so its provider must be local; "
                          "reinstall the spec with owsandbox install --enterprise-gateway swarm")
    network = env.get("EG_DOCKER_NETWORK") or DEFAULT_NETWORK
    argv = [args.docker, "service", "create", "--detach", "--quiet", "--name", service_name(kernel_id)]
    for label in (f"kernel_id={kernel_id}", *LABELS):
        argv += ["--label", label, "--container-label", label]
    argv += ["--network", network, "--endpoint-mode", "dnsrr", "--restart-condition", "none", "--init",
             "--user", f"{uid}:{gid}", "--cap-drop", "ALL"]
    for name in passed_names(env):
        argv += ["--env", name]  # the value from this environment, as `docker run --env NAME`
    # the proxy removes the service should it give the kernel up (gateway_launcher: --container-proxy)
    return [*argv, image, IN_IMAGE_COMMAND, "gateway-kernel", *gateway_args, "--container-proxy"]


def task_state(args: argparse.Namespace, name: str) -> tuple[str, str]:
    """The service's task: its state in lowercase ('' before it has one) and its error."""
    done = docker(args, "service", "ps", "--no-trunc", "--format", "{{.CurrentState}}\t{{.Error}}", name, timeout=30)
    first = done.stdout.splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    state, _, error = first.partition("\t")
    return (state.split()[0].lower() if state.split() else ""), error.strip()


def follow(args: argparse.Namespace, name: str, seconds: float) -> tuple[bool, str]:
    """Copy the service's output to stderr until the kernel says it answered the gateway (True), or its
    task ends (False, and why), or `seconds` pass (True: the gateway's own timeout takes over)."""
    logs = subprocess.Popen([args.docker, "service", "logs", "--follow", "--raw", name], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    assert logs.stdout is not None
    ended: list[str] = []
    done = threading.Event()

    def watch() -> None:  # the output stream does not end with the task: its state is read beside it
        deadline = time.monotonic() + seconds
        while not done.wait(POLL_SECONDS):
            try:
                state, error = task_state(args, name)
            except LaunchError as exc:
                state, error = "", str(exc)
            if state in ENDED_STATES:
                ended.append(f"its task is {state}" + (f": {error}" if error else ""))
                break
            if time.monotonic() > deadline:
                break
        logs.kill()

    watcher = threading.Thread(target=watch, name="swarm-task-state", daemon=True)
    watcher.start()
    try:
        for raw in logs.stdout:
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            sys.stderr.flush()
            if READY in line and "gateway-kernel" in line:
                return True, ""
        watcher.join()
        return (False, ended[0]) if ended else (True, "")
    finally:
        done.set()
        logs.kill()
        logs.wait()


def launch(argv: list[str], environ: dict[str, str] | None = None) -> int:
    """Create the kernel's service; 0 once its kernel has answered the gateway, 2 with the reason if not."""
    env = dict(os.environ if environ is None else environ)
    try:
        args, gateway_args = parse(argv)
        kernel_id = parse_gateway_args(gateway_args).kernel_id
        if not _NAME.fullmatch(kernel_id):
            raise LaunchError(f"--RemoteProcessProxy.kernel-id {kernel_id!r} is not a service name")
        check_mode(env)
        line = service_argv(args, gateway_args, env, kernel_id)
        network = env.get("EG_DOCKER_NETWORK") or DEFAULT_NETWORK
        described = docker(args, "network", "inspect", "--format", "{{.Scope}} {{.Driver}}", network)
        if described.returncode != 0:
            raise LaunchError(f"EG_DOCKER_NETWORK {network!r}: {described.stderr.strip()} (is this host a swarm "
                              "manager, and the network created?)")
        check_network(network, described.stdout)
        print("owsandbox gateway-swarm: provider local: the service's container is the kernel's sandbox (Docker's "
              "default seccomp profile, no capabilities)", file=sys.stderr, flush=True)
        created = docker(args, *line[1:], env=env, check=True)  # the values of its `--env NAME`s are env's
        if created.stderr.strip():
            print(created.stderr.strip(), file=sys.stderr, flush=True)  # Docker's warnings (an unresolved image)
        name = service_name(kernel_id)
        answered, why = follow(args, name, launch_seconds(env))
        if answered:
            return 0
        docker(args, "service", "rm", name)
        raise LaunchError(f"the kernel's service ended ({why}) before its kernel answered the gateway; its output "
                          "is above")
    except LaunchError as exc:
        print(f"owsandbox gateway-swarm: error: {exc}", file=sys.stderr, flush=True)
        return 2
