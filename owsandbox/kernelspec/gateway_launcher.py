"""`owsandbox gateway-kernel`: owsandbox's kernel started on a remote host by Jupyter Enterprise Gateway.

Enterprise Gateway's remote process proxies (DistributedProcessProxy over ssh, and the container ones)
start a launcher on the host and wait for it to send back the kernel's connection information,
encrypted with the gateway's public key, to `--RemoteProcessProxy.response-address`. The gateway's own
launcher (`launch_ipykernel.py`) then runs plain ipykernel `IPKernelApp`, not owsandbox's app, whose
orderly exit (owsandbox.kernel.app) would be lost. So owsandbox speaks that protocol itself and starts
its own app:

* the connection file is `kernel-<id>.json` in Jupyter's runtime folder on the host (the gateway's
  launcher adds a random part per start): the same name after a restart, which `owsandbox shell
  --existing` on that host finds;
* the kernel's ports and the launcher's signal port are bound on the address the gateway will connect
  to, not on every interface: where its ssh session came in (`SSH_CONNECTION`'s server address: the
  host as `--hosts` names it, for the ssh proxy), else the address facing the gateway (the one packets
  to the response address leave from: a container's). A host with two addresses whose route to the
  gateway leaves from the other one was answered on the wrong one: the gateway's connection was
  refused, it gave the kernel up within seconds, and the kernel ran on, orphaned, with its sandbox;
* a kernel the gateway never reaches ends itself: when nothing has come to the signal port (the
  gateway's first liveness poll comes seconds after its answer) within the launch timeout
  (`KERNEL_LAUNCH_TIMEOUT`, as the gateway has it, and half that more, at most `CONTACT_GRACE_SECONDS`), the sandbox is
  ended, the connection file removed, and the process exits, saying why. Not in a container started
  by `owsandbox gateway-docker` or `gateway-swarm` (`--container-proxy`): the gateway's container
  proxies never come to the signal port but to interrupt (their liveness poll asks Docker), so the
  watch would end every such kernel after its launch timeout; and those proxies remove the container
  or service themselves when they give a kernel up, so it cannot orphan;
* the payload is the gateway's version 1: the connection information AES-encrypted with a fresh key,
  that key RSA-encrypted (PKCS#1 v1.5) with the gateway's public key, both base64 in a JSON object;
* a thread answers the gateway on the signal port while the kernel runs: `{"signum": N}` (0 is the
  gateway's liveness poll) is sent to the kernel's own process. The gateway asks for SIGTERM right
  after its `shutdown_request` (DistributedProcessProxy.shutdown_listener), and a kernel ended by
  SIGTERM cannot tell a shutdown from a restart, so its sandbox would linger as for a restart; so
  SIGTERM is held for `TERM_GRACE_SECONDS`, in which the kernel ends as the request says (its box
  ended, or kept for the restart), and sent only to a kernel still running then. SIGKILL is not
  held. `{"shutdown": 1}` is noted only: the port answers until the kernel exits, so the gateway's
  liveness poll sees the kernel alive as long as it is (a restart waits for the old kernel to end).

It refuses, before the kernel starts: `/` as the workspace, and a host where bubblewrap does not work
when the spec chose no provider (`auto` would run the cells on the host unisolated) or chose `bwrap`
(which would fail only at the first cell). The launcher protocol has no word for a refusal, and the
ssh proxy has no local process to see fail: it would wait out its whole launch timeout (30 s) and then
point at the kernel's log on the host. So the refusal is sent as the answer, a connection whose shell
port is the reason (`REFUSED`), which the gateway rejects at once, quoting it in its 500 answer
("... expected an int, not the str 'owsandbox refused this kernel: ...'"); the kernel's log has it too.
Once the gateway has a real answer the launcher says so on stderr (`READY`): `owsandbox gateway-docker`
waits for that line in the container's output.

gateway_provisioners' remote provisioners (the same process proxies, for a plain Jupyter server without a
gateway: `owsandbox install --kernel-provisioner distributed`) speak the same protocol, and the server
may also ask for transport encryption: `--transport-encryption auto|required` (its own spec's spelling,
an empty value when it asks for none; owsandbox's spec passes it as one word,
`--transport-encryption=POLICY`). Then the kernel gets a CurveZMQ key pair of its own, in its connection
file (ipykernel binds its ports as a CurveZMQ server with it) and in the answer, from which the server's
clients take it; a refusal carries one too, or the provisioner would report the missing keys instead
of the reason. A value it does not know is refused, not ignored.

Needs pycryptodomex (the gateway uses it on its side too): `pip install 'owsandbox[gateway]'`.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import random
import secrets
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .. import settings

LAUNCHER_VERSION = 1  # the payload format of Enterprise Gateway's launchers that this one speaks
REFUSED = "owsandbox refused this kernel: "  # a refusal's "shell port", the reason after it
KERNEL_PORTS = ("shell_port", "iopub_port", "stdin_port", "hb_port", "control_port")
LISTEN_TIMEOUT_SECONDS = 5.0
TERM_GRACE_SECONDS = 3.0  # below jupyter_client's 5 s wait before the gateway kills the kernel
PORT_TRIES = 20
READY = "answered the gateway"  # in the line said once the connection information is sent
LAUNCH_TIMEOUT_SECONDS = 30.0  # Enterprise Gateway's own default for KERNEL_LAUNCH_TIMEOUT
CONTACT_GRACE_SECONDS = 15.0  # at most, past the launch timeout, before a kernel never contacted ends itself
KERNEL_MADE_POLL_SECONDS = 0.05  # how often an unreached kernel's end looks whether the kernel is made
UNREACHED_STATUS = 3  # the exit status of a kernel the gateway never reached

log = logging.getLogger("owsandbox.gateway")


class LaunchError(RuntimeError):
    """The gateway's arguments or the host cannot start the kernel; the message says which."""


def parse(argv: list[str]) -> argparse.Namespace:
    """The gateway's launcher arguments, in its two spellings (`--kernel-id`, `--RemoteProcessProxy.kernel-id`)."""
    parser = argparse.ArgumentParser(prog="owsandbox gateway-kernel",
                                     description="Start owsandbox's kernel for Jupyter Enterprise Gateway.")
    for name, metavar in (("kernel-id", "ID"), ("response-address", "IP:PORT"), ("public-key", "KEY"),
                          ("port-range", "LOWER..UPPER")):
        dest = name.replace("-", "_")
        parser.add_argument(f"--{name}", f"--RemoteProcessProxy.{name}", dest=dest, metavar=metavar)
    # gateway_provisioners' policy for CurveZMQ on the kernel's ports: its own spec passes it as two words, one
    # empty when the server asks for none; owsandbox's spec as one word, `--transport-encryption=POLICY`
    parser.add_argument("--transport-encryption", dest="transport_encryption", nargs="?", default=None,
                        metavar="auto|required|disabled")
    parser.add_argument("--container-proxy", action="store_true",
                        help="in a container of owsandbox gateway-docker or gateway-swarm: the gateway's container "
                             "proxy removes it should it give the kernel up, so no watch for an unreached kernel")
    for ignored in ("spark-context-initialization-mode", "cluster-type"):  # the Python launcher's; no Spark here
        parser.add_argument(f"--{ignored}", f"--RemoteProcessProxy.{ignored}", dest=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    missing = [f"--RemoteProcessProxy.{n}" for n in ("kernel-id", "response-address", "public-key")
               if not getattr(args, n.replace("-", "_"))]
    if missing:
        raise LaunchError(f"the gateway did not pass {', '.join(missing)}: the kernelspec's argv must have "
                          "them ({kernel_id}, {response_address}, {public_key}), as owsandbox install "
                          "--enterprise-gateway writes it")
    args.address = response_address(args.response_address)
    args.ports = port_range(args.port_range)
    args.curve = curve_policy(args.transport_encryption)
    return args


def curve_policy(text: str | None) -> str | None:
    """`--transport-encryption`: "auto" or "required" (CurveZMQ keys in the connection file), or None: none
    asked for (no value, "disabled", or the placeholder left by a server that substitutes none)."""
    policy = (text or "").strip().lower()
    if not policy or policy == "disabled" or (policy.startswith("{") and policy.endswith("}")):
        return None
    if policy not in ("auto", "required"):
        raise LaunchError(f"--transport-encryption {text!r}: expected auto, required or disabled")
    return policy


def curve_keys(policy: str | None) -> dict[str, bytes]:
    """A fresh CurveZMQ key pair for the kernel's ports when `policy` asks for one (what the connection file and
    the answer carry); none when libzmq cannot do it and the policy is "auto", said in the kernel's log."""
    if policy is None:
        return {}
    import zmq

    if not zmq.has("curve"):
        if policy == "required":
            raise LaunchError("--transport-encryption required: this host's libzmq was built without CurveZMQ")
        log.warning("the server asked for transport encryption (auto), and this host's libzmq has no CurveZMQ: "
                    "the kernel's ports are not encrypted")
        return {}
    public, secret = zmq.curve_keypair()
    return {"curve_publickey": public, "curve_secretkey": secret}


def response_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"--RemoteProcessProxy.response-address {text!r}: expected IP:PORT")
    return host, int(port)


def port_range(text: str | None) -> tuple[int, int]:
    """`LOWER..UPPER` (`0..0` or none: any port)."""
    if not text:
        return 0, 0
    lower, sep, upper = text.partition("..")
    if not sep or not lower.isdigit() or not upper.isdigit() or int(lower) > int(upper) or int(upper) > 65535:
        raise LaunchError(f"--RemoteProcessProxy.port-range {text!r}: expected LOWER..UPPER, as 40000..41000")
    return int(lower), int(upper)


def facing_address(gateway: tuple[str, int]) -> str:
    """This host's address that the gateway's packets come back to: the source of a route to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(gateway)  # UDP: no packet is sent, the kernel only picks the route
        return str(probe.getsockname()[0])


def gateway_side_address(gateway: tuple[str, int], environ: dict[str, str] | None = None) -> str:
    """The address of this host that the gateway will connect to: the one its ssh session reached (the
    third word of `SSH_CONNECTION`) when that is an IPv4 address of this host, else `facing_address`."""
    env = os.environ if environ is None else environ
    words = env.get("SSH_CONNECTION", "").split()
    if len(words) == 4:
        reached = words[2]
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((reached, 0))  # an address of this host (and IPv4), or OSError
            return reached
        except (OSError, ValueError):
            log.warning("SSH_CONNECTION names %s, which is not an IPv4 address of this host: the kernel listens "
                        "on the address facing the gateway instead", reached)
    return facing_address(gateway)


def launch_timeout(environ: dict[str, str] | None = None) -> float:
    """The gateway's launch timeout, as its request gives it to the kernel (KERNEL_LAUNCH_TIMEOUT)."""
    said = (os.environ if environ is None else environ).get("KERNEL_LAUNCH_TIMEOUT", "")
    try:
        seconds = float(said)
    except ValueError:
        return LAUNCH_TIMEOUT_SECONDS
    return seconds if 0 < seconds < 86_400 else LAUNCH_TIMEOUT_SECONDS


def bound_socket(ip: str, ports: tuple[int, int]) -> socket.socket:
    """A TCP socket bound on `ip`, on a port within `ports` (any where the range is 0..0)."""
    lower, upper = ports
    last: OSError | None = None
    for _ in range(PORT_TRIES if upper else 1):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((ip, random.randint(lower, upper) if upper else 0))
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise LaunchError(f"no free port on {ip} within {lower}..{upper} after {PORT_TRIES} tries: {last}")


def connection_file(kernel_id: str) -> Path:
    from jupyter_core.paths import jupyter_runtime_dir

    folder = Path(jupyter_runtime_dir())
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / f"kernel-{kernel_id}.json"


def write_connection(path: Path, ip: str, ports: tuple[int, int],
                     curve: dict[str, bytes] | None = None) -> dict[str, Any]:
    """The kernel's five ports (chosen, then freed for the kernel to bind), its key and `curve`'s keys (the
    kernel's ports then speak CurveZMQ only), written to `path`."""
    from jupyter_client.connect import write_connection_file

    held = [bound_socket(ip, ports) for _ in KERNEL_PORTS]
    chosen = {name: sock.getsockname()[1] for name, sock in zip(KERNEL_PORTS, held, strict=True)}
    for sock in held:
        sock.close()
    write_connection_file(str(path), ip=ip, key=secrets.token_hex(16).encode(), transport="tcp",
                          signature_scheme="hmac-sha256", kernel_name="", **chosen, **(curve or {}))
    return json.loads(path.read_text(encoding="utf-8"))


def encrypted(info: dict[str, Any], public_key: str) -> bytes:
    """The gateway's version 1 payload for `info`."""
    try:
        from Cryptodome.Cipher import AES, PKCS1_v1_5
        from Cryptodome.PublicKey import RSA
        from Cryptodome.Util.Padding import pad
    except ImportError:
        raise LaunchError("pycryptodomex is not installed where the kernel runs: the connection information "
                          "is sent encrypted to the gateway (pip install 'owsandbox[gateway]')") from None
    try:
        gateway_key = RSA.import_key(base64.b64decode(public_key.encode()))
    except (ValueError, IndexError, TypeError) as exc:
        raise LaunchError(f"--RemoteProcessProxy.public-key is not an RSA public key: {exc}") from None
    aes_key = secrets.token_bytes(16)
    sealed = AES.new(aes_key, AES.MODE_ECB).encrypt(pad(json.dumps(info).encode(), 16))
    payload = {"version": LAUNCHER_VERSION,
               "key": base64.b64encode(PKCS1_v1_5.new(gateway_key).encrypt(aes_key)).decode(),
               "conn_info": base64.b64encode(sealed).decode()}
    return base64.b64encode(json.dumps(payload).encode())


def send_to_gateway(address: tuple[str, int], payload: bytes) -> None:
    try:
        with socket.create_connection(address, timeout=LISTEN_TIMEOUT_SECONDS) as sock:
            sock.sendall(payload)
    except OSError as exc:
        raise LaunchError(f"the gateway's response address {address[0]}:{address[1]} cannot be reached "
                          f"from this host: {exc}") from None


def listen_for_gateway(sock: socket.socket, pid: int, contacted: threading.Event | None = None) -> threading.Thread:
    """Answer the gateway's requests on the signal port until it says shutdown (or the kernel exits);
    `contacted` is set at the gateway's first request."""

    sock.listen(1)  # before the gateway hears of the port: its first liveness poll must not be refused

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            if contacted is not None:
                contacted.set()
            with conn:
                conn.settimeout(LISTEN_TIMEOUT_SECONDS)
                data = b""
                try:
                    while chunk := conn.recv(4096):
                        data += chunk
                    request = json.loads(data or b"{}")
                except (OSError, ValueError) as exc:
                    log.warning("a request on the gateway's signal port was not read: %s", exc)
                    continue
            if not isinstance(request, dict):
                log.warning("a request on the gateway's signal port was not an object: %r", request)
                continue
            signum = request.get("signum")
            if isinstance(signum, int) and signum == signal.SIGTERM:
                log.info("the gateway asks for SIGTERM: sent in %g s if the kernel has not ended by then",
                         TERM_GRACE_SECONDS)
                held = threading.Timer(TERM_GRACE_SECONDS, os.kill, (pid, signal.SIGTERM))
                held.daemon = True
                held.start()
            elif isinstance(signum, int) and signum >= 0:
                if signum:
                    log.info("the gateway sends signal %d", signum)
                os.kill(pid, signum)
            if request.get("shutdown"):
                log.info("the gateway's listener shutdown: the port answers until the kernel exits")

    thread = threading.Thread(target=serve, name="gateway-signals", daemon=True)
    thread.start()
    return thread


def end_if_never_contacted(contacted: threading.Event, seconds: float, path: Path) -> threading.Thread:
    """A watch: if the gateway has not come to the signal port within `seconds`, it gave the kernel up
    (its connection refused, its launch timed out): end the sandbox, remove the connection file, exit."""

    def watch() -> None:
        if contacted.wait(seconds):
            return
        said = (f"owsandbox gateway-kernel: the gateway did not reach this kernel within {seconds:g} s (its launch "
                "timeout, KERNEL_LAUNCH_TIMEOUT, and a grace): it gave the kernel up, so the kernel ends with its "
                f"sandbox (it listened on {_listening_on(path)})\n")
        os.write(2, said.encode())  # the process's stderr, the kernel's log: sys.stderr is the kernel's stream now
        from ..kernel.ending import end_then_exit

        path.unlink(missing_ok=True)
        end_then_exit(_end_the_kernels_sandbox, UNREACHED_STATUS)

    thread = threading.Thread(target=watch, name="gateway-contact", daemon=True)
    thread.start()
    return thread


def _end_the_kernels_sandbox() -> None:
    """End the sandbox of the kernel this process runs, a start under way included. The kernel may not
    be made yet (the app is still starting, on a busy machine): its sandbox starts as it is made, so
    this waits for it (end_then_exit bounds the wait), rather than leave a box that starts after it."""
    from ..kernel.app import OwSandboxKernelApp

    while not (OwSandboxKernelApp.initialized() and OwSandboxKernelApp.instance().kernel is not None):
        time.sleep(KERNEL_MADE_POLL_SECONDS)
    OwSandboxKernelApp.instance().kernel.end_for_good("the gateway never reached the kernel")


def _listening_on(path: Path) -> str:
    try:
        return str(json.loads(path.read_text()).get("ip"))
    except (OSError, ValueError):
        return "an unknown address"


def check_place(environ: dict[str, str] | None = None) -> None:
    """Refuse what a gateway's host must not do quietly: make `/` the workspace (a login or a container
    whose working folder is the root), or run cells unisolated because bubblewrap does not work there
    (`auto` would fall back to `local`; a spec that wants that says `--provider local`)."""
    given = settings.settings_of(environ)
    workspace = Path(given.workspace or os.getcwd()).resolve()
    if workspace == Path("/"):
        raise LaunchError("the workspace would be / (the folder the kernel starts in): give the kernel its "
                          "folder with KERNEL_WORKING_DIR in the request's env, or OWSANDBOX_WORKSPACE in the spec")
    provider = given.provider or "auto"
    if provider in ("auto", "bwrap"):
        from ..host.providers import bwrap_problem

        problem = bwrap_problem()
        if problem is not None and provider == "bwrap":
            raise LaunchError(f"the spec's provider is bwrap, and {problem}. In a container, bubblewrap needs "
                              "the user namespaces and the /proc mount that `owsandbox gateway-docker` allows it")
        if problem is not None:
            raise LaunchError(f"no sandbox on this host: {problem}. The kernel would run cells on the host "
                              "itself; install bubblewrap here, or choose a provider in the spec "
                              "(owsandbox install --provider ...; --provider local to accept no isolation)")


def refusal(kernel_id: str, reason: str, curve: str | None = None) -> dict[str, Any]:
    """The answer that tells the gateway the kernel was refused, and why (see the module's docstring). Where the
    server asked for transport encryption (`curve`), it has a key pair too: gateway_provisioners checks for the
    keys first, and would report their absence ("the launcher ... predates transport encryption") instead of
    the refusal, which it reports as the shell port that is not a number."""
    answer = {"kernel_id": kernel_id, "pid": os.getpid(), "pgid": os.getpgid(0), "shell_port": REFUSED + reason}
    try:
        keys = curve_keys(curve)
    except LaunchError:
        keys = {}
    return {**answer, **{name: key.decode() for name, key in keys.items()}}


def tell_refused(args: argparse.Namespace, reason: str) -> None:
    """Send `refusal` to the gateway, if it can be: a failure here leaves the gateway to its timeout."""
    try:
        send_to_gateway(args.address, encrypted(refusal(args.kernel_id, reason, args.curve), args.public_key))
    except LaunchError as exc:
        log.warning("the gateway was not told of the refusal: %s", exc)


def launch(argv: list[str]) -> int:
    """Tell the gateway where the kernel listens, then run owsandbox's kernel app until it shuts down."""
    path: Path | None = None
    args: argparse.Namespace | None = None
    sending = False  # from then on a failure is in answering: there is no telling the gateway either
    try:
        args = parse(argv)
        working_dir = os.environ.get("KERNEL_WORKING_DIR")
        if working_dir:
            try:
                os.chdir(working_dir)
            except OSError as exc:
                raise LaunchError(f"KERNEL_WORKING_DIR {working_dir!r}: {exc}") from None
        check_place()
        ip = gateway_side_address(args.address)
        path = connection_file(args.kernel_id)
        info = write_connection(path, ip, args.ports, curve_keys(args.curve))
        signals = bound_socket(ip, args.ports)
        info.update(pid=os.getpid(), pgid=os.getpgid(0), comm_port=signals.getsockname()[1],
                    kernel_id=args.kernel_id)
        sending = True
        payload = encrypted(info, args.public_key)
        contacted = threading.Event()
        listen_for_gateway(signals, os.getpid(), contacted)
        send_to_gateway(args.address, payload)
        timeout = launch_timeout()
        if args.container_proxy:
            print("owsandbox gateway-kernel: started for the gateway's container proxy, which removes the container "
                  "should it give the kernel up: no watch for an unreached kernel", file=sys.stderr, flush=True)
        else:
            end_if_never_contacted(contacted, timeout + min(CONTACT_GRACE_SECONDS, max(1.0, timeout / 2)), path)
    except LaunchError as exc:
        if path is not None:
            path.unlink(missing_ok=True)
        print(f"owsandbox gateway-kernel: error: {exc}", file=sys.stderr, flush=True)
        if args is not None and not sending:
            tell_refused(args, str(exc))
        return 2
    print(f"owsandbox gateway-kernel: kernel {args.kernel_id} {READY}; it listens on {ip} (connection file "
          f"{path})", file=sys.stderr, flush=True)
    from ..kernel.app import OwSandboxKernelApp
    from ..kernel.kernel import OwSandboxKernel

    try:
        OwSandboxKernelApp.launch_instance(argv=["-f", str(path)], kernel_class=OwSandboxKernel)
    finally:
        signals.close()
        path.unlink(missing_ok=True)
    return 0
