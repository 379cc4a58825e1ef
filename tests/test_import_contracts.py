"""Who may import whom: the layers stay apart because a test fails when one reaches into another.

* `owsandbox/protocol/` is the runner protocol's one owner (framing, method names, messages, errors):
  it imports nothing else of the package, so both ends can hold it.
* The box (`owsandbox/box/`) runs in whatever image the sandbox has, in another process and another
  trust domain: the standard library (tested in test_runner_packaging.py) and the protocol only.
* The channel (`owsandbox/channel/`) is the execd client behind `%attach`: it knows nothing of the
  kernel, the host or the box.
* The host (`owsandbox/host/`) starts and reaches boxes. It never imports the kernel; of the box it
  may use only what it runs on this side for the `local` and `direct` providers (named below).
* The kernel talks to the box through the host and the protocol, never the box's own modules.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "owsandbox"


def imported_modules(source: Path) -> set[str]:
    """Absolute names of the owsandbox modules `source` imports (relative imports resolved)."""
    module = ".".join(source.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if source.name == "__init__.py" else module.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import protocol`
    return {name for name in found if name.split(".")[0] == "owsandbox"}


def sources(folder: str) -> list[Path]:
    found = sorted(path for path in (PACKAGE / folder).rglob("*.py") if "__pycache__" not in path.parts)
    assert found, folder
    return found


def name_of(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def outside(names: set[str], *allowed: str) -> set[str]:
    """The names that are neither the package root nor in one of the `allowed` packages."""
    return {name for name in names if name != "owsandbox"
            and not any(name == prefix or name.startswith(prefix + ".") for prefix in allowed)}


def test_the_resolver_sees_relative_imports() -> None:
    seen = imported_modules(PACKAGE / "kernel" / "kernel.py")
    assert "owsandbox.protocol" in seen and "owsandbox.kernel.magics.framework" in seen
    deep = imported_modules(PACKAGE / "box" / "shell" / "bash.py")
    assert "owsandbox.protocol" in deep


@pytest.mark.parametrize("source", sources("protocol"), ids=name_of)
def test_the_protocol_imports_nothing_else_of_the_package(source: Path) -> None:
    wrong = outside(imported_modules(source), "owsandbox.protocol")
    assert not wrong, f"{name_of(source)} imports {sorted(wrong)}"


@pytest.mark.parametrize("source", sources("box"), ids=name_of)
def test_the_box_imports_only_itself_and_the_protocol(source: Path) -> None:
    wrong = outside(imported_modules(source), "owsandbox.box", "owsandbox.protocol")
    assert not wrong, f"{name_of(source)} imports {sorted(wrong)}"


@pytest.mark.parametrize("source", sources("channel"), ids=name_of)
def test_the_channel_imports_nothing_of_the_kernel_the_host_or_the_box(source: Path) -> None:
    wrong = outside(imported_modules(source), "owsandbox.channel", "owsandbox.settings")
    assert not wrong, f"{name_of(source)} imports {sorted(wrong)}"


# What the host runs of the box on its own side: the detached daemon's start and stop (`local`,
# `bwrap`, the forward bridge), the one /proc reader, the shells for `direct`, and the bootstrap's
# source, which `opensandbox` sends into a box. Anything else of the box is the box's business.
HOST_USES_OF_THE_BOX = {"owsandbox.box", "owsandbox.box.daemonctl", "owsandbox.box.procstat",
                        "owsandbox.box.shell.registry", "owsandbox.box.bootstrap"}


@pytest.mark.parametrize("source", sources("host"), ids=name_of)
def test_the_host_never_imports_the_kernel_and_little_of_the_box(source: Path) -> None:
    names = imported_modules(source)
    wrong = outside(names, "owsandbox.host", "owsandbox.protocol", "owsandbox.channel", "owsandbox.logs",
                    "owsandbox.settings", "owsandbox.box")
    reach = {name for name in names if name.startswith("owsandbox.box") and name not in HOST_USES_OF_THE_BOX
             and name.rsplit(".", 1)[0] not in HOST_USES_OF_THE_BOX - {"owsandbox.box"}}
    assert not wrong and not reach, f"{name_of(source)} imports {sorted(wrong | reach)}"


@pytest.mark.parametrize("source", [*sources("host/isolation"),
                                    *(path for path in sources("host/snapshots") if path.name != "stopped.py")],
                         ids=name_of)
def test_isolation_and_the_snapshot_store_never_import_the_providers(source: Path) -> None:
    """The providers apply the isolation and use the store; the other way round is a cycle. (Only
    `snapshots/stopped.py` reaches a provider: it stops one's box around a restore.)"""
    reach = {name for name in imported_modules(source) if name.startswith("owsandbox.host.providers")}
    assert not reach, f"{name_of(source)} imports {sorted(reach)}"


@pytest.mark.parametrize("source", sources("kernel") + sources("kernelspec"), ids=name_of)
def test_the_kernel_never_imports_the_box(source: Path) -> None:
    box = {name for name in imported_modules(source) if name.startswith("owsandbox.box")}
    assert not box, f"{name_of(source)} imports {sorted(box)} of the box"


def test_method_names_are_spelled_only_by_the_protocol() -> None:
    """A method or notification name in quotes anywhere outside `protocol/` is a second owner of the
    protocol: the names `protocol/methods.py` spells (`$/ping` among them), and any name of the runner's
    namespaces (`shell.`, `fs.`, ...) it does not."""
    from owsandbox.protocol import methods

    spelled = {value for name, value in vars(methods).items() if name.isupper() and isinstance(value, str)}
    assert len(spelled) >= 20 and methods.PING in spelled
    wrong = []
    for source in sources(""):
        if source.is_relative_to(PACKAGE / "protocol"):
            continue
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and (node.value in spelled or looks_like_a_method(node.value)):
                wrong.append(f"{name_of(source)}:{node.lineno} {node.value!r}")
    assert not wrong, wrong


def looks_like_a_method(value: object) -> bool:
    """A string shaped like a name of the runner protocol's namespaces (files such as `runner.sock` aside)."""
    return isinstance(value, str) and RUNNER_METHOD.fullmatch(value) is not None and value not in NOT_METHODS


RUNNER_METHOD = re.compile(r"(runner|session|shell|fs|proc|box)\.[a-z_]+|\$/ping")
NOT_METHODS = {"runner.sock"}


def test_the_method_finder_sees_names_the_protocol_does_not_spell() -> None:
    assert looks_like_a_method("shell.resize") and looks_like_a_method("$/ping") and looks_like_a_method("fs.read")
    assert not looks_like_a_method("runner.sock") and not looks_like_a_method("$/progress")  # an LSP name


def test_every_owsandbox_setting_is_named_by_the_settings_module() -> None:
    """`OWSANDBOX_*` names are an interface: each is spelled as a value only in `settings.py`, and
    any other mention (a message, a docstring) names one that exists, so none is a typo."""
    import re

    from owsandbox import settings

    known = {setting.name for setting in settings.describe()} | set(settings.IN_THE_BOX)
    assert len(known) >= 30
    mention = re.compile(r"OWSANDBOX_[A-Z_]*[A-Z]")
    unknown, spelled = [], []
    for source in sources(""):
        text = source.read_text(encoding="utf-8")
        unknown += [f"{name_of(source)}: {name}" for name in mention.findall(text) if name not in known]
        if source == PACKAGE / "settings.py" or source.is_relative_to(PACKAGE / "box"):
            continue  # the box sets its own two in its shells
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
                spelled.append(f"{name_of(source)}:{node.lineno} {node.value}")
    assert not unknown, unknown
    assert not spelled, spelled


def test_the_settings_module_imports_nothing_of_the_package() -> None:
    assert outside(imported_modules(PACKAGE / "settings.py")) == set()


def test_the_kernel_asks_the_box_through_the_sandbox_api_only() -> None:
    """Of the method names, the kernel names only the live notifications it reads; every request goes
    through `host/api.py` (and the host's client and nothing else spells the session's own)."""
    from owsandbox.protocol import methods

    notifications = ("SHELL_OUTPUT", "SHELL_PROGRESS", "SHELL_INPUT_WANTED")
    allowed = {f"owsandbox.protocol.methods.{name}" for name in notifications}
    wrong = {}
    for source in sources("kernel") + sources("box") + sources("host"):
        names = {name for name in imported_modules(source) if name.startswith("owsandbox.protocol.methods.")}
        if source.is_relative_to(PACKAGE / "kernel"):
            names -= allowed
        elif source.is_relative_to(PACKAGE / "host"):
            names = set() if source.name in ("api.py", "client.py") else names
        else:
            continue  # the box routes on them
        if names:
            wrong[name_of(source)] = sorted(names)
    assert not wrong, wrong
    assert methods.REQUESTS >= {methods.SHELL_RUN, methods.FS_READ}


# -- settings are read in one place -------------------------------------------------------------------

def _setting_constants() -> dict[str, str]:
    from owsandbox import settings

    return {name: value for name, value in vars(settings).items()
            if name.isupper() and isinstance(value, str) and value.startswith("OWSANDBOX_")}


def _is_settings_module(module: str | None) -> bool:
    return bool(module) and (module == "settings" or module.endswith(".settings") or module == "owsandbox.settings")


def setting_reads(text: str, aliases: dict[str, str], where: str = "") -> list[str]:
    """The places in `text` (a module's source) that read an `OWSANDBOX_*` variable out of a mapping:
    `X.get(NAME)`, `X.pop(NAME)`, `X[NAME]`, `NAME in X`, `os.getenv(NAME)`, where NAME is the settings
    module's constant (`settings.NETWORK`, `from ..settings import NETWORK`) or a module's alias of one
    (`NETWORK_ENV = settings.NETWORK`, imported from its module or not). Writing one for a child
    (`os.environ[NAME] = "1"`, `setdefault`) is not a read."""
    constants = _setting_constants()
    tree = ast.parse(text)
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.name in constants and _is_settings_module(node.module)) or alias.name in aliases:
                    bound.add(alias.asname or alias.name)
    bound |= {name for name in aliases if any(isinstance(node, ast.Assign) and any(
        isinstance(target, ast.Name) and target.id == name for target in node.targets) for node in tree.body)}

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "settings":
            return node.attr in constants
        return isinstance(node, ast.Name) and node.id in bound

    found = []
    for node in ast.walk(tree):
        read = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            read = node.func.attr in ("get", "pop", "getenv") and named(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            read = named(node.slice)
        elif isinstance(node, ast.Compare):
            read = any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and named(node.left)
        if read:
            found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return found


def setting_aliases(texts: list[str]) -> dict[str, str]:
    """Module-level names bound to a settings constant (`LIMITS_ENV = settings.LIMITS`), package-wide."""
    constants = _setting_constants()
    aliases: dict[str, str] = {}
    for text in texts:
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = node.value
                if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                        and value.value.id == "settings" and value.attr in constants):
                    aliases[node.targets[0].id] = constants[value.attr]
                elif isinstance(value, ast.Name) and value.id in constants:
                    aliases[node.targets[0].id] = constants[value.id]
    return aliases


def test_settings_are_read_from_the_environment_only_by_the_settings_module() -> None:
    """`Settings.from_env` reads every `OWSANDBOX_*` variable, with one grammar for each kind; nothing
    else in the package looks one up in `os.environ` (or in a mapping handed to it) by itself."""
    outside_settings = [source for source in sources("")
                        if source != PACKAGE / "settings.py" and not source.is_relative_to(PACKAGE / "box")]
    texts = {source: source.read_text(encoding="utf-8") for source in outside_settings}
    aliases = setting_aliases(list(texts.values()))
    assert {"EXEC_ENV", "IMAGE_ENV", "PROVIDER_ENV"} <= set(aliases)  # the resolver sees the aliases
    wrong = [read for source, text in texts.items() for read in setting_reads(text, aliases, name_of(source))]
    assert not wrong, wrong


def test_the_settings_read_finder_finds_every_spelling_of_a_read() -> None:
    reads = setting_reads(
        "import os\nfrom .. import settings\nfrom ..settings import NETWORK\nfrom .policy import NETWORK_ENV\n"
        "a = os.environ.get(settings.NETWORK, '')\nb = env.get(NETWORK_ENV)\nc = os.environ[NETWORK]\n"
        "d = NETWORK_ENV in os.environ\ne = os.getenv(settings.LIMITS)\n"
        "os.environ[settings.LAB_TERMINALS] = '1'\nf = os.environ.get('PATH')\n",
        {"NETWORK_ENV": "OWSANDBOX_NETWORK"})
    assert [read.split(" ", 1)[0] for read in reads] == [":5", ":6", ":7", ":8", ":9"], reads
