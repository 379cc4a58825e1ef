"""Every `OWSANDBOX_*` setting, named in one place: what it does and who reads it.

A kernel is configured by its environment (the kernelspec's `env`, `owsandbox install --env`, a
hub's spawner), so the names are an interface as much as the magics are. Each is spelled only here
and read only here (tests/test_import_contracts.py holds both): `Settings.from_env(env)` reads every
one once, each with the grammar of its kind (a switch, a number, a size, a list, text), and an
invalid value is a `SettingsError` naming the variable, the value and what it takes. The process
makes its `Settings` where it starts (the kernel, a CLI command, a launcher) and hands it to what it
opens; a caller given none reads the environment as it is then (`settings_of`: an invalid value is
an error where that setting is read, so an argument given instead still wins), so one process may
still open several sandboxes with different settings. `owsandbox settings` lists them (`describe`)
from the same definitions. Standard library only, and it imports nothing of the package: the
channel and the kernelspec use it too.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple


class SettingsError(ValueError):
    """An `OWSANDBOX_*` variable whose value its kind does not take; the message names both."""

    def __init__(self, message: str, name: str = "") -> None:
        super().__init__(message)
        self.name = name


# -- the grammar, one per kind ------------------------------------------------------------------
TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size_bytes(text: str) -> int | None:
    """`2G`, `512M`, `1.5G`, `1048576` (K, M, G, T are powers of 1024; a trailing B or iB is allowed)
    as bytes; None when `text` is not a size. The one size grammar: the limits use it too."""
    found = _SIZE.fullmatch(text)
    if not found:
        return None
    return int(float(found.group(1)) * _UNITS[found.group(2).upper()])


def switch(text: str) -> bool | None:
    """1, true, yes, on as True; 0, false, no, off or nothing as False (any case); else None."""
    said = text.strip().lower()
    return True if said in TRUE else False if said in FALSE else None


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list, each item stripped, empty items left out."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


#: The limits a box takes (`OWSANDBOX_LIMITS`, `owsandbox install --limit`): their one list, here so
#: that the setting is checked where it is read, whichever provider then uses it (or none does).
LIMIT_NAMES = ("memory", "pids", "tmp", "shm", "cpu")
#: The words `%sandbox` shows for some limits, which a person may well write instead of the names.
_LIMIT_WORDS = {"processes": "pids", "/tmp": "tmp", "/dev/shm": "shm", "cpus": "cpu"}


def unknown_limit(name: str) -> str | None:
    """None for a limit's name; else why it is none, with the names and the one meant when that is plain
    (a word `%sandbox` shows, or a close spelling): a wrong name is never quietly no limit."""
    if name in LIMIT_NAMES:
        return None
    import difflib  # only for a wrong name: not on every start's path

    meant = _LIMIT_WORDS.get(name) or next(iter(difflib.get_close_matches(name, LIMIT_NAMES, n=1)), None)
    return (f"no limit is named {name!r}" + (f" (did you mean {meant}?)" if meant else "")
            + f"; the limits are {', '.join(LIMIT_NAMES)}")


def limit_items(text: str) -> tuple[str, ...]:
    """`memory=2G, pids=512` as its items (a list's grammar), each NAME=VALUE with a known NAME; a
    ValueError naming the first that is not. The values are their reader's to judge (the limits')."""
    items = names(text)
    for item in items:
        name, sep, _ = item.partition("=")
        if not sep:
            raise ValueError(f"{item!r} is not NAME=VALUE (example: pids=512)")
        problem = unknown_limit(name.strip().lower())
        if problem:
            raise ValueError(problem)
    return items


class Setting(NamedTuple):
    name: str
    reader: str  # the module that uses it
    meaning: str
    kind: str = "text"  # text, switch, number, size, list, limits (a list of NAME=VALUE with known names)
    takes: str = ""  # what a value must be, for errors and `owsandbox settings`
    secret: bool = False  # `owsandbox settings` says it is set, never shows it
    least: float | None = None  # a number's smallest value

    @property
    def field(self) -> str:
        """The `Settings` attribute that holds its value."""
        return self.name.removeprefix("OWSANDBOX_").lower()

    def parse(self, raw: str) -> Any:
        """The value of `raw` (the variable's text) for this kind; SettingsError when it takes no such value.
        An empty value is the default (None for a number or a size)."""
        text = raw.strip()
        if self.kind == "switch":
            value = switch(text)
            if value is None:
                raise SettingsError(f"{self.name}={text!r} is neither 1 (yes, true, on) nor 0 (no, false, off, "
                                    "or empty)", self.name)
            return value
        if self.kind == "list":
            return names(text)
        if self.kind == "limits":
            try:
                return limit_items(text)
            except ValueError as exc:
                raise SettingsError(f"{self.name}={text!r}: {exc}", self.name) from None
        if self.kind == "text" or not text:
            return text if self.kind == "text" else None
        if self.kind == "size":
            size = size_bytes(text)
            if size is None:
                raise SettingsError(f"{self.name}={text!r} is not {self.takes}", self.name)
            return size
        try:
            number = float(text)
        except ValueError:
            number = None
        # infinity too is no number here: a wait of `inf` seconds never ends, a rate of `inf` is no pace
        if number is None or not math.isfinite(number) or (self.least is not None and number < self.least):
            raise SettingsError(f"{self.name}={text!r} is not {self.takes}", self.name)
        return number


_ALL: list[Setting] = []
_TAKES = {"switch": "1 (yes, true, on) or 0 (no, false, off, or empty)", "list": "a list, A,B,...",
          "limits": f"a list of NAME=VALUE, NAME one of {', '.join(LIMIT_NAMES)}",
          "text": "text", "size": "a size (examples: 500M, 8G)", "number": "a number"}


def _setting(name: str, reader: str, meaning: str, kind: str = "text", takes: str = "", secret: bool = False,
             least: float | None = None) -> str:
    _ALL.append(Setting("OWSANDBOX_" + name, reader, meaning, kind, takes or _TAKES[kind], secret, least))
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
                  "seconds a container outlives its kernel, for a restart to find it", "number",
                  "a number of seconds, 0 or more", least=0)
CONTAINER_USER = _setting("CONTAINER_USER", "host.providers.container", "the user a container's shells run as")
CONTAINER_OPTIONS = _setting("CONTAINER_OPTIONS", "host.providers.container",
                             "more options for the engine's `run` (the safe ones only)")
WRITABLE_ROOT = _setting("WRITABLE_ROOT", "host.providers.container", "1: a container's root file system is writable",
                         "switch")
OPENSANDBOX_SERVER = _setting("OPENSANDBOX_SERVER", "host.providers.opensandbox_lifecycle",
                              "the OpenSandbox lifecycle server that makes a sandbox per kernel")
OPENSANDBOX_API_KEY = _setting("OPENSANDBOX_API_KEY", "host.providers.opensandbox_lifecycle",
                               "the lifecycle server's API key", secret=True)
OPENSANDBOX_TIMEOUT = _setting("OPENSANDBOX_TIMEOUT", "host.providers.opensandbox_lifecycle",
                               "the sandbox's lifetime, renewed while the kernel runs", "number",
                               "a number of seconds")
OPENSANDBOX_READY_TIMEOUT = _setting("OPENSANDBOX_READY_TIMEOUT", "host.providers.opensandbox_lifecycle",
                                     "seconds to wait for a new sandbox to be ready", "number", "a number of seconds")
OPENSANDBOX_SERVER_PROXY = _setting("OPENSANDBOX_SERVER_PROXY", "host.providers.opensandbox_lifecycle",
                                    "1: reach the sandbox through the lifecycle server's proxy, not its endpoint",
                                    "switch")
EXECD_URL = _setting("EXECD_URL", "channel.endpoint", "an execd endpoint (OpenSandbox's, or one's own) for %attach")
EXECD_TOKEN = _setting("EXECD_TOKEN", "channel.endpoint", "that endpoint's access token", secret=True)
EXECD_HEADERS = _setting("EXECD_HEADERS", "channel.endpoint", "routing headers for that endpoint, a JSON object",
                         secret=True)

# -- what a box may do -------------------------------------------------------------------------
NETWORK = _setting("NETWORK", "host.isolation.policy", "1: the box may reach the network (default: no network)",
                   "switch")
LIMITS = _setting("LIMITS", "host.isolation.policy",
                  "the box's limits, NAME=VALUE,...: memory=2G, pids=512, tmp=1G, shm=256M, cpu=1.5 "
                  "(default: on, with the defaults %sandbox shows)", kind="limits")
ENV = _setting("ENV", "host.isolation.policy", "names of the host's variables passed into the box, A,B", kind="list")
HOME_VISIBLE = _setting("HOME_VISIBLE", "host.isolation.guard",
                        "dot entries of a home workspace the box may see, .name,...", kind="list")
WRITABLE = _setting("WRITABLE", "host.isolation.guard",
                    "paths the workspace guard leaves writable, .venv,... (the box may plant code there; never the "
                    "kernel's own environment)", kind="list")

# -- teaching ----------------------------------------------------------------------------------
BASELINE = _setting("BASELINE", "host.snapshots.stopped",
                    "the folder or snapshot a lab's `%snapshot restore --baseline` returns to")
SNAPSHOT_DIR = _setting("SNAPSHOT_DIR", "host.snapshots.store", "where snapshots are kept")
SNAPSHOT_LIMIT = _setting("SNAPSHOT_LIMIT", "host.snapshots.store", "the snapshot store's size limit", kind="size")
OUTPUT_RATE = _setting("OUTPUT_RATE", "kernel.kernel",
                       "bytes a second of output streamed to the notebook before a live tail takes its place "
                       "(default 500000: half a default Jupyter server's iopub_data_rate_limit; 0: not paced)",
                       "number", "a number of bytes a second (0: not paced)", least=0)
RECORD = _setting("RECORD", "kernel.teaching.recording", "a folder where every session is recorded (a course's)")
RECORD_LIMIT = _setting("RECORD_LIMIT", "kernel.teaching.recording", "the size limit of one recording", kind="size")

# -- the host's own --------------------------------------------------------------------------
LOG = _setting("LOG", "logs", "debug or info: owsandbox's own logs (default: warnings)")
LAB_TERMINALS = _setting("LAB_TERMINALS", "terminal.launch", "set by JupyterLab's terminal manager: `%terminal open` "
                         "opens a JupyterLab terminal", kind="switch")
PREVIEW_BASE_URL = _setting("PREVIEW_BASE_URL", "kernel.magics.preview", "set by the Jupyter server's "
                            "owsandbox.preview extension: its base URL, under which `%preview` links are served")
SHUTDOWN_WAIT_TIME = _setting("SHUTDOWN_WAIT_TIME", "kernelspec.provisioner",
                              "in a Jupyter server's environment: seconds a distributed kernel asked to shut down "
                              "may take before it is killed (default 15)", "number", "a number of seconds, 0 or more",
                              least=0)

#: Set in a box's environment by its provider: which kind of sandbox this is (`bwrap`, `container`).
SANDBOX_KIND = "OWSANDBOX_SANDBOX"
#: The variables a box's shells see (a contract with what runs there, not a setting); the box itself
#: sets the shell's name.
IN_THE_BOX = (SANDBOX_KIND, "OWSANDBOX_SHELL")


def describe() -> list[Setting]:
    """Every setting, in the order above."""
    return list(_ALL)


class _Invalid:
    """Where a lenient `Settings` holds a value its kind does not take: reading it raises the error."""

    __slots__ = ("error",)

    def __init__(self, error: SettingsError) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"<invalid: {self.error}>"


@dataclass(frozen=True, repr=False)
class Settings:
    """Every setting's value, as its kind parses it (one attribute a setting: `OWSANDBOX_IMAGE` is
    `image`). Empty text and lists where a variable is not set, None for a number or a size not set
    (its reader's default then), False for a switch. Made by `from_env`; a test may make one with
    `Settings(network=True)`."""

    provider: str = ""
    workspace: str = ""
    exec: str = ""
    box_cwd: str = ""
    image: str = ""
    engine: str = ""
    linger: float | None = None
    container_user: str = ""
    container_options: str = ""
    writable_root: bool = False
    opensandbox_server: str = ""
    opensandbox_api_key: str = field(default="", repr=False)
    opensandbox_timeout: float | None = None
    opensandbox_ready_timeout: float | None = None
    opensandbox_server_proxy: bool = False
    execd_url: str = ""
    execd_token: str = field(default="", repr=False)
    execd_headers: str = field(default="", repr=False)
    network: bool = False
    limits: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    home_visible: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    baseline: str = ""
    snapshot_dir: str = ""
    snapshot_limit: int | None = None
    output_rate: float | None = None
    record: str = ""
    record_limit: int | None = None
    log: str = ""
    lab_terminals: bool = False
    preview_base_url: str = ""
    shutdown_wait_time: float | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, strict: bool = True) -> Settings:
        """Every `OWSANDBOX_*` setting of `env`, each read once; SettingsError naming each invalid one.
        Not `strict`: an invalid one is an error only where it is read (an argument given instead of a
        setting wins over a wrong one, as it always has)."""
        values, errors = _parse(env)
        if errors and strict:
            raise errors[0] if len(errors) == 1 else SettingsError("; ".join(map(str, errors)), errors[0].name)
        for error in errors:
            values[_BY_NAME[error.name].field] = _Invalid(error)
        return cls(**values)

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if type(value) is _Invalid:
            raise SettingsError(str(value.error), value.error.name)
        return value

    def __repr__(self) -> str:
        shown = []
        for setting in _ALL:
            value = object.__getattribute__(self, setting.field)
            shown.append(f"{setting.field}={'...' if setting.secret and value else value!r}")
        return f"Settings({', '.join(shown)})"


def _parse(env: Mapping[str, str]) -> tuple[dict[str, Any], list[SettingsError]]:
    values: dict[str, Any] = {}
    errors: list[SettingsError] = []
    for setting in _ALL:
        raw = env.get(setting.name)
        if raw is None:
            continue
        try:
            values[setting.field] = setting.parse(raw)
        except SettingsError as exc:
            errors.append(exc)
    return values, errors


def shown(env: Mapping[str, str]) -> list[tuple[Setting, str | None, SettingsError | None]]:
    """What `owsandbox settings` prints: each setting, its text in `env` (None: not set; a secret's is
    never shown) and its error if the text is invalid."""
    found = []
    for setting in _ALL:
        raw = env.get(setting.name)
        error = None
        if raw is not None:
            try:
                setting.parse(raw)
            except SettingsError as exc:
                error = exc
        found.append((setting, "(set, not shown)" if raw is not None and setting.secret else raw, error))
    return found


def problems(env: Mapping[str, str]) -> list[SettingsError]:
    """Each invalid setting of `env`, one error each (what `owsandbox settings` reports)."""
    return _parse(env)[1]


def read(name: str, env: Mapping[str, str] | None = None) -> Any:
    """One setting's value from `env` (None: this process's environment now), by its kind, whatever the
    others say: for a check that must not fail on another setting's mistake (which folders a box may
    write, as this machine's programs are looked up)."""
    setting = _BY_NAME[name]
    raw = (os.environ if env is None else env).get(name)
    return getattr(Settings(), setting.field) if raw is None else setting.parse(raw)


def settings_of(given: Settings | Mapping[str, str] | None = None) -> Settings:
    """`given` as Settings: itself, parsed from a mapping of variables, or (None) from this process's
    environment as it is now: for a caller that was handed no Settings. Parsed leniently: an invalid
    setting is a SettingsError where it is read."""
    if isinstance(given, Settings):
        return given
    return Settings.from_env(os.environ if given is None else given, strict=False)


_BY_NAME = {setting.name: setting for setting in _ALL}
assert [f.name for f in fields(Settings)] == [setting.field for setting in _ALL], "a setting without its field"
