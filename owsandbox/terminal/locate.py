"""Which kernel a terminal is for, and where its sandbox's execd endpoint is, from what the host owns.

`owsandbox shell --existing [FILE]` follows `jupyter console --existing`: a connection file by path,
by name in Jupyter's runtime folder (`kernel-<id>.json`, `<id>`, or a part of the name), or with none
the newest connection file whose kernel has a live owsandbox sandbox. A kernel finds its sandbox by a
key made from its connection file (`sandbox_key`); the `local` and `bwrap` providers keep each
keyed sandbox's state in a folder of that name in this user's private runtime folder. Everything the
terminal connects with comes from there, never from the box: the execd socket the host made
(`run/execd.sock`, inherited by the box's daemon, so the box cannot swap it) and the token in the
host's record of the sandbox (`daemon.json`, which the box cannot reach). A container keeps its state
in a folder of its engine's (`ENGINE-DIGEST/owsandbox-UID-KEY`), where the host records the engine's
`exec -i` relay to its endpoint (`host/providers/container_door.py`; `door_in`): the Jupyter server's
`%preview` proxy goes in that way, and a terminal is told that the sandbox is a container. A kernel
whose sandbox is elsewhere (ssh, OpenSandbox) has no such folder, and the error says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..channel.endpoint import TOKEN_HEADER, ExecdEndpoint

if TYPE_CHECKING:
    from ..host.providers.container_door import ContainerDoor

EXECD_SOCKET = ("run", "execd.sock")  # in a sandbox's state folder, made by the host
RECORD = "daemon.json"  # the host's record of the sandbox, with the execd token the daemon gave it
PROBE_TIMEOUT_SECONDS = 5.0
_TOKEN = re.compile(r"[A-Za-z0-9_\-]{16,200}")  # secrets.token_urlsafe's alphabet
_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_GATEWAY_STEM = re.compile(f"kernel-({_UUID})_[a-z0-9_]{{8}}")  # tempfile.mkstemp(prefix="kernel-<id>_")
_KERNEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ENGINE_FOLDER = re.compile(r"(podman|docker)-[0-9a-f]{12}")  # ContainerProvider.engine_folder_name


class NoSandbox(RuntimeError):
    """No live owsandbox sandbox for the kernel asked for (or for any kernel); the message says why."""


@dataclass(frozen=True)
class KernelSandbox:
    """A running kernel's sandbox, as a terminal reaches it."""

    connection_file: Path
    key: str
    state_dir: Path
    endpoint: ExecdEndpoint

    @property
    def kernel_id(self) -> str:
        return self.key.removeprefix("kernel-")


def sandbox_key(connection_file: str) -> str:
    """The key a kernel finds its sandbox by, from its connection file, which every client keeps across a
    restart: its name where Jupyter's servers and consoles give it one (`kernel-<id>.json`; Enterprise
    Gateway's launchers add a random `_XXXXXXXX` per start, which is dropped), else a digest of its path
    (jupyter_client's own managers write a temporary `tmpXXXX.json`)."""
    stem = os.path.splitext(os.path.basename(connection_file))[0]
    gateway = _GATEWAY_STEM.fullmatch(stem)
    if gateway:
        return f"kernel-{gateway.group(1)}"
    if stem.startswith("kernel-"):
        return stem
    path = os.path.realpath(connection_file)
    return "kernel-file-" + hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def kernel_key(connection_file: str, environ: dict[str, str] | None = None) -> str:
    """The key of the sandbox of the kernel running here: `sandbox_key` of its connection file, which
    `owsandbox shell --existing` finds it by too. Enterprise Gateway's launchers name that file by the
    kernel's id (`kernel-<id>_<random>.json`, or `kernel-<id>.json` with owsandbox's own), so a restart
    finds its box. KERNEL_ID, which the gateway also sets, names the key only for a kernel without a
    connection file: any process started under a gateway's kernel inherits it, and two kernels started
    from one (papermill runs, say) must not share a sandbox. A KERNEL_ID that cannot name a folder is
    refused: it would otherwise pick another kernel's sandbox or a path outside."""
    if connection_file:
        return sandbox_key(connection_file)
    kernel_id = (os.environ if environ is None else environ).get("KERNEL_ID", "")
    if not _KERNEL_ID.fullmatch(kernel_id):
        raise ValueError(f"KERNEL_ID {kernel_id!r} is not a kernel id (letters, digits, '-', '_' and '.', "
                         "at most 128, starting with a letter or digit), and there is no connection file")
    return f"kernel-{kernel_id}"


def runtime_dir() -> Path:
    """Jupyter's runtime folder, where servers and consoles write connection files."""
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir())


def connection_files() -> list[Path]:
    """The kernels' connection files in Jupyter's runtime folder, newest first."""
    found = []
    for path in runtime_dir().glob("kernel-*.json"):
        try:
            found.append((path.stat().st_mtime, path))
        except OSError:
            continue  # gone meanwhile
    return [path for _, path in sorted(found, reverse=True)]


def resolve_connection_file(name: str) -> Path:
    """A connection file named as `jupyter console --existing` takes it: a path, a file in the runtime
    folder, or a part of a name there (the newest match)."""
    given = Path(name).expanduser()
    if given.is_file():
        return given.resolve()
    folder = runtime_dir()
    for candidate in (name, f"{name}.json", f"kernel-{name}.json"):
        if os.sep not in candidate and (folder / candidate).is_file():
            return folder / candidate
    matches = [path for path in connection_files() if name in path.name]
    if matches:
        return matches[0]
    raise NoSandbox(f"no connection file '{name}': not a file, and nothing of that name in {folder}")


def _private_problem(path: Path) -> str | None:
    """Why `path` is not a folder only this user can enter (None when it is one); nothing is made."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path} cannot be read: {exc}"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder of its own (a link or a file is there)"
    if info.st_uid != os.getuid():
        return f"{path} belongs to user id {info.st_uid}, not to you ({os.getuid()})"
    if info.st_mode & 0o077:
        return f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}, not 700)"
    return None


def state_folder(key: str) -> Path:
    """The sandbox's state folder for `key`, in the first private runtime folder that has it: the local
    or bwrap provider's (`ROOT/KEY`), else a container's (`ROOT/ENGINE-DIGEST/owsandbox-UID-KEY`; of two
    engines' with this key, the one whose lease was renewed last)."""
    from ..host.privatedir import runtime_candidates

    problems: list[str] = []
    for root in runtime_candidates():
        folder = root / key
        if not os.path.lexists(folder):
            continue
        problem = _private_problem(root) or _private_problem(folder)
        if problem is not None:
            problems.append(problem)
            continue
        return folder
    found = _container_folders(key, problems)
    if found:
        return max(found, key=_lease_time)
    looked = ", ".join(str(root) for root in runtime_candidates())
    why = f" ({'; '.join(problems)})" if problems else ""
    raise NoSandbox(f"no sandbox state for {key} in {looked}{why}: the kernel has no sandbox of the local, bwrap "
                    "or container provider on this machine (an ssh or OpenSandbox box has none here), or it has "
                    "ended")


def _container_folders(key: str, problems: list[str]) -> list[Path]:
    """The private state folders of containers with `key`, in every engine's folder (podman-…, docker-…)
    of every private runtime folder; why any other was passed over goes to `problems`."""
    from ..host.privatedir import runtime_candidates
    from ..host.providers.container import container_name

    name = container_name(os.getuid(), key)
    found = []
    for root in runtime_candidates():
        if _private_problem(root) is not None:
            continue
        try:
            engines = [entry for entry in root.iterdir() if _ENGINE_FOLDER.fullmatch(entry.name)]
        except OSError:
            continue
        for engine_folder in engines:
            folder = engine_folder / name
            if not os.path.lexists(folder):
                continue
            problem = _private_problem(engine_folder) or _private_problem(folder)
            if problem is not None:
                problems.append(problem)
                continue
            found.append(folder)
    return found


def _lease_time(folder: Path) -> float:
    try:
        return (folder / "lease").stat().st_mtime
    except OSError:
        return 0.0


def door_in(folder: Path) -> ExecdEndpoint | ContainerDoor:
    """How the execd endpoint of the sandbox whose state is in `folder` is reached: the host's socket
    (local, bwrap: `endpoint_in`), or for a container the engine's relay the host recorded there
    (`container_door`). Only the host's own files decide."""
    from ..host.providers import container_door

    if _ENGINE_FOLDER.fullmatch(folder.parent.name):
        try:
            return container_door.read(folder)
        except container_door.DoorRefused as exc:
            raise NoSandbox(str(exc)) from None
    return endpoint_in(folder)


def endpoint_in(folder: Path) -> ExecdEndpoint:
    """The execd endpoint of the sandbox whose state is in `folder`: the host's socket and record only."""
    sock = folder.joinpath(*EXECD_SOCKET)
    try:
        info = os.lstat(sock)
    except OSError:
        raise NoSandbox(f"{folder.name}'s sandbox has no execd socket ({sock} is missing): it has ended") from None
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
        raise NoSandbox(f"{sock} is not a socket of yours: refusing to connect to it")
    try:
        record = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError) as exc:
        raise NoSandbox(f"{folder.name}'s sandbox has no readable record ({folder / RECORD}: {exc})") from None
    token = record.get("execd_token") if isinstance(record, dict) else None
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise NoSandbox(f"{folder.name}'s sandbox was started by an older owsandbox, whose record has no "
                        "execd token: restart the kernel to open a terminal in its sandbox")
    return ExecdEndpoint(unix_socket=str(sock), headers={TOKEN_HEADER: token})


def answering(endpoint: ExecdEndpoint) -> str | None:
    """None when the endpoint answers an authorised request; else what went wrong."""
    from ..channel.control import ExecdControl
    from ..channel.errors import ExecdError

    try:
        ExecdControl(endpoint, timeout=PROBE_TIMEOUT_SECONDS).list_sessions()
    except ExecdError as exc:
        return str(exc)
    return None


def sandbox_of(connection_file: Path) -> KernelSandbox:
    """The live sandbox of the kernel with this connection file; NoSandbox naming why there is none."""
    key = sandbox_key(str(connection_file))
    folder = state_folder(key)
    if _ENGINE_FOLDER.fullmatch(folder.parent.name):
        raise NoSandbox(f"the sandbox of {key} is a container ({folder.parent.name.split('-')[0]}): a terminal "
                        "reaches a sandbox of the local or bwrap provider only (open one in the box with "
                        f"{folder.parent.name.split('-')[0]} exec -it {folder.name} bash)")
    endpoint = endpoint_in(folder)
    problem = answering(endpoint)
    if problem is not None:
        raise NoSandbox(f"the sandbox of {key} does not answer ({problem}): it has ended or is ending")
    return KernelSandbox(connection_file, key, folder, endpoint)


def find_sandbox(existing: str | None) -> KernelSandbox:
    """The sandbox for `--existing [existing]`: that connection file's, or with none the newest kernel's
    that has a live owsandbox sandbox."""
    if existing:
        return sandbox_of(resolve_connection_file(existing))
    files = connection_files()
    for path in files:
        try:
            return sandbox_of(path)
        except NoSandbox:
            continue
    raise NoSandbox(f"no running owsandbox kernel with a live sandbox: {len(files)} connection file(s) in "
                    f"{runtime_dir()}, none of them an owsandbox kernel's whose sandbox (local or bwrap) answers. "
                    "Name one: owsandbox shell --existing CONNECTION_FILE (%terminal open in the notebook prints it)")
