"""The kernelspec for Jupyter Enterprise Gateway: owsandbox kernels spread over remote hosts.

`owsandbox install --enterprise-gateway ssh --hosts H1,H2` writes a spec whose `metadata.process_proxy`
is the gateway's DistributedProcessProxy with those hosts (round-robin, or least-connection where the
gateway is configured so): for each kernel the gateway logs in to the next host with ssh and runs the
spec's argv there. That argv starts `owsandbox gateway-kernel` (owsandbox.kernelspec.gateway_launcher),
which speaks the gateway's launcher protocol and runs owsandbox's own kernel app, not the gateway's
`launch_ipykernel.py` with plain ipykernel.

The gateway joins the argv with spaces into one shell line on the host, so every word must be one
shell word: the launcher is started by the `owsandbox` command beside the interpreter installing the
spec (a console script: the current folder, which the sandbox may write, is not on its path), never
with `python -c CODE`. That command must exist at the same path on every host (owsandbox installed
in the same place).

`owsandbox install --enterprise-gateway docker --image IMG` writes one whose process proxy is the
gateway's DockerProcessProxy: for each kernel the gateway runs the spec's argv on its own host, here
`owsandbox gateway-docker` (owsandbox.kernelspec.gateway_docker), which starts a container of IMG
with the labels and network the proxy looks for; in it `owsandbox gateway-kernel` answers the gateway
as above. The image is pinned in the argv (a request's KERNEL_IMAGE that differs is refused there),
and so is the docker client: the one on PATH at install time unless `--docker` names it. The network
is not the spec's to choose: the proxy reads the container's address from the network named by the
gateway's own EG_DOCKER_NETWORK (default `bridge`), which it passes to the launcher, so the launcher
takes that one. A container provider inside the container makes no sense, so the spec's provider is
`bwrap` (bubblewrap nested in the container: the default) or `local` (the container itself is the
sandbox, said in the kernel's log and the spec's metadata).

`owsandbox install --enterprise-gateway swarm --image IMG` writes one whose process proxy is the
gateway's DockerSwarmProcessProxy: the argv is `owsandbox gateway-swarm`
(owsandbox.kernelspec.gateway_swarm), which starts each kernel as a one-task Docker Swarm service of
IMG on the overlay network named by the gateway's EG_DOCKER_NETWORK. A service's container cannot be
given what nested bubblewrap needs (Docker's service API has no unmasked /proc for it, and before
Docker 25 no seccomp profile either; `docker service create` has no `--security-opt`), so the swarm
spec's provider is `local`, the container itself being the sandbox; asking
for `bwrap` is refused here, at install, not at the first kernel.

Every spec asks for the launch timeout its kernels need: `KERNEL_LAUNCH_TIMEOUT` in its `env`
(`--launch-timeout`, default `LAUNCH_TIMEOUT_SECONDS`). The gateway's own default is 30 s
(`EG_KERNEL_LAUNCH_TIMEOUT`), and a class of 30 kernels started at once on two hosts of a busy
two-core machine took longer than that (benchmarks/class_load.py: 58 s for all 30, 97 s with two
busy loops besides): the gateway then answered 500 and gave kernels up.
The gateway takes the spec's value as the default a request may override (a `KERNEL_LAUNCH_TIMEOUT`
in the request's env wins: jupyter_server's GatewayClient always sends one, its own 40 s unless
set), and the launcher reads the same value to know how long to wait for the gateway's first
contact before it ends a kernel nobody reached.

`owsandbox install --kernel-provisioner distributed --hosts H1,H2` writes the same remote kernel for a
plain Jupyter server, without a gateway: its `metadata.kernel_provisioner` names gateway_provisioners'
DistributedProvisioner (the gateway's ssh process proxy as a jupyter_client kernel provisioner), through
owsandbox's subclass of it that keeps a restarted kernel on its host, where its sandbox waits for it
(owsandbox.kernelspec.ssh_provisioner). The argv is the one above in the provisioner's spelling, and
passes the server's transport-encryption policy as one word (`--transport-encryption=auto`, or an
empty value), which the launcher honours with CurveZMQ keys in the connection file: the spec says it
supports `curve`. The launch timeout goes into the provisioner's config (its `launch_timeout`) and the
spec's env (the launcher's wait for the first contact), as above.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

PROXIES = {"ssh": "enterprise_gateway.services.processproxies.distributed.DistributedProcessProxy",
           "docker": "enterprise_gateway.services.processproxies.docker_swarm.DockerProcessProxy",
           "swarm": "enterprise_gateway.services.processproxies.docker_swarm.DockerSwarmProcessProxy"}
DOCKER_PROVIDERS = ("bwrap", "local")  # nested bubblewrap, or the container as the sandbox
SWARM_PROVIDERS = ("local",)  # a service's container cannot nest bubblewrap (see the module's docstring)
# An image reference as Docker writes one (name, optional :tag, optional @sha256:digest): one shell word
_IMAGE = re.compile(r"[a-z0-9][a-z0-9._/:-]*(:[A-Za-z0-9._-]+)?(@sha256:[a-f0-9]{64})?")
LAUNCHER_ARGS = ["--RemoteProcessProxy.kernel-id", "{kernel_id}",
                 "--RemoteProcessProxy.response-address", "{response_address}",
                 "--RemoteProcessProxy.public-key", "{public_key}",
                 "--RemoteProcessProxy.port-range", "{port_range}"]
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.:_-]{0,252})")
LAUNCH_TIMEOUT = "KERNEL_LAUNCH_TIMEOUT"  # Enterprise Gateway's name, in the spec's env and a request's
LAUNCH_TIMEOUT_SECONDS = 180  # the default the spec asks for (see the module's docstring)
MAX_LAUNCH_TIMEOUT_SECONDS = 3600  # a launch that needs longer is a broken host, not a slow one


def check_launch_timeout(seconds: float | None) -> int:
    """`--launch-timeout`: whole seconds, 10 to an hour (None: the default)."""
    if seconds is None:
        return LAUNCH_TIMEOUT_SECONDS
    if seconds != int(seconds) or not 10 <= seconds <= MAX_LAUNCH_TIMEOUT_SECONDS:
        raise ValueError(f"--launch-timeout {seconds:g}: whole seconds from 10 to {MAX_LAUNCH_TIMEOUT_SECONDS} "
                         f"(the gateway's own default is 30; this spec's, {LAUNCH_TIMEOUT_SECONDS})")
    return int(seconds)


def parse_hosts(text: str | None) -> list[str]:
    """`--hosts H1,H2`: host names or addresses the gateway can ssh to."""
    hosts = [word.strip() for word in (text or "").split(",")]
    if not text or not all(hosts):
        raise ValueError(f"--hosts {text!r}: give the hosts the gateway starts kernels on, as --hosts h1,h2")
    bad = [h for h in hosts if not _HOST.fullmatch(h)]
    if bad:
        raise ValueError(f"--hosts: {', '.join(map(repr, bad))} is not a host name or address")
    return list(dict.fromkeys(hosts))


def launcher_command(executable: str, flag: str = "--enterprise-gateway") -> str:
    """The `owsandbox` command beside `executable`, checked to be there and to be one shell word."""
    command = Path(executable).parent / "owsandbox"
    if not Path(executable).is_absolute() or not command.is_file():
        raise ValueError(f"{flag}: no owsandbox command beside {executable} ({command}); install "
                         "the spec with the Python that has owsandbox installed")
    if shlex.quote(str(command)) != str(command):
        raise ValueError(f"{flag}: the kernel is started through a shell line on the host, and the path "
                         f"{command} is not one shell word; install owsandbox under a path without spaces")
    return str(command)


def check_image(image: str | None, kind: str = "docker") -> str:
    """`--image`: the kernels' image, a Docker reference that is one shell word."""
    if not image:
        raise ValueError(f"--enterprise-gateway {kind} needs --image IMG: the image the kernels' containers run "
                         "(owsandbox installed in it, with its gateway extra)")
    if not _IMAGE.fullmatch(image):
        raise ValueError(f"--image {image!r} is not an image reference (name[:tag][@sha256:digest])")
    return image


def docker_client(given: str | None, kind: str = "docker") -> str:
    """The docker client the gateway-side launcher runs: `--docker`, else the one on PATH now, checked."""
    found = shutil.which(given or "docker")
    if found is None or not os.path.isabs(found):
        raise ValueError(f"--docker {given}: not an executable program" if given else
                         f"--enterprise-gateway {kind}: no docker client on PATH; name it with --docker PATH")
    if shlex.quote(found) != found:
        raise ValueError(f"--docker: the path {found} is not one shell word")
    return found


def docker_spec(spec: dict[str, Any], image: str | None, docker: str | None, executable: str,
                launch_timeout: int = LAUNCH_TIMEOUT_SECONDS) -> dict[str, Any]:
    """`spec` turned into DockerProcessProxy's kernelspec (see the module's docstring)."""
    from .. import settings

    env = dict(spec.get("env") or {})
    provider = env[settings.PROVIDER] = settings.settings_of(env).provider or "bwrap"
    if provider not in DOCKER_PROVIDERS:
        raise ValueError(f"--enterprise-gateway docker: --provider {provider!r} cannot run inside the kernel's "
                         "container; choose bwrap (bubblewrap nested in it, the default) or local (the "
                         "container itself is the sandbox)")
    image = check_image(image)
    argv = [launcher_command(executable), "gateway-docker", "--image", image, "--docker", docker_client(docker),
            *LAUNCHER_ARGS]
    return _remote(dict(spec, env=env), "docker", argv, {"image_name": image},
                   {"provider": provider, "image": image,
                    "sandbox": "bubblewrap in the container" if provider == "bwrap" else "the container"},
                   launch_timeout)


def swarm_spec(spec: dict[str, Any], image: str | None, docker: str | None, executable: str,
               launch_timeout: int = LAUNCH_TIMEOUT_SECONDS) -> dict[str, Any]:
    """`spec` turned into DockerSwarmProcessProxy's kernelspec (see the module's docstring)."""
    from .. import settings

    env = dict(spec.get("env") or {})
    provider = env[settings.PROVIDER] = settings.settings_of(env).provider or "local"
    if provider not in SWARM_PROVIDERS:
        raise ValueError(f"--enterprise-gateway swarm: --provider {provider!r} cannot run in a swarm service's "
                         "container: Docker's service API cannot give it the unmasked /proc (nor, before Docker 25, "
                         "the seccomp profile) that bubblewrap needs to nest, so the container itself is the sandbox "
                         "(--provider local, the default here); --enterprise-gateway docker nests bubblewrap")
    image = check_image(image, "swarm")
    argv = [launcher_command(executable), "gateway-swarm", "--image", image, "--docker",
            docker_client(docker, "swarm"), *LAUNCHER_ARGS]
    return _remote(dict(spec, env=env), "swarm", argv, {"image_name": image},
                   {"provider": provider, "image": image, "sandbox": "the container (a swarm service's task)"},
                   launch_timeout)


def _remote(spec: dict[str, Any], kind: str, argv: list[str], proxy_config: dict[str, Any],
            facts: dict[str, Any], launch_timeout: int) -> dict[str, Any]:
    """`spec` as the gateway's kernelspec of `kind`: the proxy runs `argv`, configured with `proxy_config`;
    `facts` go with the kind under the spec's owsandbox metadata; `launch_timeout` into its env."""
    metadata = dict(spec.get("metadata") or {})
    metadata["process_proxy"] = {"class_name": PROXIES[kind], "config": proxy_config}
    metadata["owsandbox"] = {**metadata.get("owsandbox", {}), "enterprise_gateway": kind, **facts,
                             "launch_timeout": launch_timeout}
    env = {**(spec.get("env") or {}), LAUNCH_TIMEOUT: str(launch_timeout)}
    return {**spec, "argv": argv, "env": env, "metadata": metadata}


PROVISIONERS = {"distributed": "owsandbox-distributed-provisioner"}  # --kernel-provisioner KIND: its entry point
PROVISIONER_ARGS = ["--kernel-id", "{kernel_id}", "--response-address", "{response_address}",
                    "--public-key", "{public_key}", "--port-range", "{port_range}",
                    "--transport-encryption={transport_encryption}"]


def provisioner_spec(spec: dict[str, Any], kind: str, hosts: list[str] | None, executable: str,
                     launch_timeout: float | None = None) -> dict[str, Any]:
    """`spec` (owsandbox's kernel.json) turned into the kernelspec of a jupyter_client kernel provisioner
    that starts the kernel on `hosts` (see the module's docstring)."""
    if kind not in PROVISIONERS:
        raise ValueError(f"--kernel-provisioner {kind!r}: the kinds are {', '.join(PROVISIONERS)} "
                         "(gateway_provisioners' DistributedProvisioner: ssh to --hosts)")
    if not hosts:
        raise ValueError(f"--kernel-provisioner {kind} needs --hosts H1,H2: the hosts the Jupyter server starts "
                         "kernels on over ssh")
    seconds = check_launch_timeout(launch_timeout)
    if importlib.util.find_spec("gateway_provisioners") is None:
        raise ValueError(f"--kernel-provisioner {kind}: gateway_provisioners is not installed beside owsandbox here, "
                         "where the Jupyter server runs the provisioner: pip install 'owsandbox[provisioners]'")
    metadata = dict(spec.get("metadata") or {})
    metadata["kernel_provisioner"] = {"provisioner_name": PROVISIONERS[kind],
                                      "config": {"remote_hosts": hosts, "launch_timeout": seconds}}
    metadata["supported_encryption"] = ["curve"]
    metadata["owsandbox"] = {**metadata.get("owsandbox", {}), "kernel_provisioner": kind, "hosts": hosts,
                             "launch_timeout": seconds}
    env = {**(spec.get("env") or {}), LAUNCH_TIMEOUT: str(seconds)}
    return {**spec, "argv": [launcher_command(executable, "--kernel-provisioner"), "gateway-kernel",
                             *PROVISIONER_ARGS], "env": env, "metadata": metadata}


def gateway_spec(spec: dict[str, Any], kind: str, hosts: list[str] | None, executable: str,
                 image: str | None = None, docker: str | None = None,
                 launch_timeout: float | None = None) -> dict[str, Any]:
    """`spec` (owsandbox's kernel.json) turned into the gateway's remote kernelspec."""
    if kind not in PROXIES:
        raise ValueError(f"--enterprise-gateway {kind!r}: the kinds are {', '.join(PROXIES)}")
    seconds = check_launch_timeout(launch_timeout)
    if kind in ("docker", "swarm"):
        if hosts:
            raise ValueError(f"--hosts is for --enterprise-gateway ssh: {kind}'s kernels run where Docker puts them")
        made = docker_spec if kind == "docker" else swarm_spec
        return made(spec, image, docker, executable, seconds)
    if image or docker:
        raise ValueError("--image and --docker with --enterprise-gateway are for its docker and swarm kinds")
    if not hosts:
        raise ValueError("--enterprise-gateway ssh needs --hosts H1,H2: the hosts the gateway starts kernels on")
    return _remote(spec, kind, [launcher_command(executable), "gateway-kernel", *LAUNCHER_ARGS],
                   {"remote_hosts": ",".join(hosts)}, {"hosts": hosts}, seconds)
