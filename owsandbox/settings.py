"""Every `OWSANDBOX_*` setting, named in one place: what it does and who reads it.

A kernel is configured by its environment (the kernelspec's `env`, `owsandbox install --env`, a
hub's spawner), so the names are an interface as much as the magics are. Each is spelled only here
(tests/test_import_contracts.py holds that); the module that reads one imports its name from here and
reads it where it is used, at the time it is used, so that one process may open several sandboxes
with different settings. `owsandbox settings` lists them (`describe`). Standard library only, and it
imports nothing of the package: the channel and the kernelspec use it too.
"""

from __future__ import annotations

from typing import NamedTuple


class Setting(NamedTuple):
    name: str
    reader: str  # the module that reads it
    meaning: str


_ALL: list[Setting] = []


def _setting(name: str, reader: str, meaning: str) -> str:
    _ALL.append(Setting("OWSANDBOX_" + name, reader, meaning))
    return "OWSANDBOX_" + name


# -- which sandbox, where ----------------------------------------------------------------------
PROVIDER = _setting("PROVIDER", "host.workspace", "the provider: auto, bwrap, local, exec, container, opensandbox, "
                    "direct (default auto: bwrap where bubblewrap works, else local)")
WORKSPACE = _setting("WORKSPACE", "kernel.sandbox", "the kernel's workspace folder (default: the notebook's folder)")
EXEC = _setting("EXEC", "host.providers.exec", "the exec provider's command prefix, as in `ssh me@host`")
BOX_CWD = _setting("BOX_CWD", "host.providers.boxed", "the folder shells start in, inside an exec/opensandbox box")
IMAGE = _setting("IMAGE", "host.providers.container", "the container provider's image")
ENGINE = _setting("ENGINE", "host.providers.container", "the container engine: podman or docker")
LINGER = _setting("LINGER", "host.providers.container",
                  "seconds a container outlives its kernel, for a restart to find it")
CONTAINER_USER = _setting("CONTAINER_USER", "host.providers.container", "the user a container's shells run as")
CONTAINER_OPTIONS = _setting("CONTAINER_OPTIONS", "host.providers.container",
                             "more options for the engine's `run` (the safe ones only)")
WRITABLE_ROOT = _setting("WRITABLE_ROOT", "host.providers.container", "1: a container's root file system is writable")
OPENSANDBOX_SERVER = _setting("OPENSANDBOX_SERVER", "host.providers.opensandbox_lifecycle",
                              "the OpenSandbox lifecycle server that makes a sandbox per kernel")
OPENSANDBOX_API_KEY = _setting("OPENSANDBOX_API_KEY", "host.providers.opensandbox_lifecycle",
                               "the lifecycle server's API key")
OPENSANDBOX_TIMEOUT = _setting("OPENSANDBOX_TIMEOUT", "host.providers.opensandbox_lifecycle",
                               "the sandbox's lifetime, renewed while the kernel runs")
OPENSANDBOX_READY_TIMEOUT = _setting("OPENSANDBOX_READY_TIMEOUT", "host.providers.opensandbox_lifecycle",
                                     "seconds to wait for a new sandbox to be ready")
OPENSANDBOX_SERVER_PROXY = _setting("OPENSANDBOX_SERVER_PROXY", "host.providers.opensandbox_lifecycle",
                                    "1: reach the sandbox through the lifecycle server's proxy, not its endpoint")
EXECD_URL = _setting("EXECD_URL", "channel.endpoint", "an execd endpoint (OpenSandbox's, or one's own) for %attach")
EXECD_TOKEN = _setting("EXECD_TOKEN", "channel.endpoint", "that endpoint's access token")
EXECD_HEADERS = _setting("EXECD_HEADERS", "channel.endpoint", "routing headers for that endpoint, a JSON object")

# -- what a box may do -------------------------------------------------------------------------
NETWORK = _setting("NETWORK", "host.isolation.policy", "1: the box may reach the network (default: no network)")
LIMITS = _setting("LIMITS", "host.isolation.policy",
                  "the box's limits, NAME=VALUE,...: memory=2G, pids=512, tmp=1G, shm=256M, cpu=1.5; or off "
                  "(default: on, with the defaults %sandbox shows)")
ENV = _setting("ENV", "host.isolation.policy", "names of the host's variables passed into the box, A,B")
HOME_VISIBLE = _setting("HOME_VISIBLE", "host.isolation.guard",
                        "dot entries of a home workspace the box may see, .name,...")
WRITABLE = _setting("WRITABLE", "host.isolation.guard",
                    "paths the workspace guard leaves writable, .venv,... (the box may plant code there; never the "
                    "kernel's own environment)")

# -- teaching ----------------------------------------------------------------------------------
BASELINE = _setting("BASELINE", "host.snapshots.stopped",
                    "the folder or snapshot a lab's `%snapshot restore --baseline` returns to")
SNAPSHOT_DIR = _setting("SNAPSHOT_DIR", "host.snapshots.store", "where snapshots are kept")
SNAPSHOT_LIMIT = _setting("SNAPSHOT_LIMIT", "host.snapshots.store", "the snapshot store's size limit")
OUTPUT_RATE = _setting("OUTPUT_RATE", "kernel.kernel",
                       "bytes a second of output streamed to the notebook before a live tail takes its place "
                       "(default 500000: half a default Jupyter server's iopub_data_rate_limit; 0: not paced)")
RECORD = _setting("RECORD", "kernel.teaching.recording", "a folder where every session is recorded (a course's)")
RECORD_LIMIT = _setting("RECORD_LIMIT", "kernel.teaching.recording", "the size limit of one recording")

# -- the host's own --------------------------------------------------------------------------
LOG = _setting("LOG", "logs", "debug or info: owsandbox's own logs (default: warnings)")
LAB_TERMINALS = _setting("LAB_TERMINALS", "terminal.launch", "set by JupyterLab's terminal manager: `%terminal open` "
                         "opens a JupyterLab terminal")

#: Set in a box's environment by its provider: which kind of sandbox this is (`bwrap`, `container`).
SANDBOX_KIND = "OWSANDBOX_SANDBOX"
#: The variables a box's shells see (a contract with what runs there, not a setting); the box itself
#: sets the shell's name.
IN_THE_BOX = (SANDBOX_KIND, "OWSANDBOX_SHELL")


def describe() -> list[Setting]:
    """Every setting, in the order above."""
    return list(_ALL)
