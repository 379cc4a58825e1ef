"""Who may import whom: the layers stay apart because a test fails when one reaches into another.

* The box (`owsandbox/runner/box/`) runs in whatever image the sandbox has: the standard library only
  (tested in test_runner_packaging.py).
* The channel (`owsandbox/channel/`) is the execd client behind `%attach`: it knows nothing of the
  kernel.
* The kernel talks to the box through the runner protocol: of the box it imports `protocol` only,
  never the box's scanners or shells.
"""

from __future__ import annotations

import ast
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
    found = sorted((PACKAGE / folder).glob("*.py"))
    assert found, folder
    return found


def test_the_resolver_sees_relative_imports() -> None:
    seen = imported_modules(PACKAGE / "kernel" / "kernel.py")
    assert "owsandbox.runner.box.protocol" in seen and "owsandbox.kernel.magics" in seen


@pytest.mark.parametrize("source", sources("channel"), ids=lambda path: path.name)
def test_the_channel_imports_nothing_of_the_kernel_or_the_runner(source: Path) -> None:
    wrong = {name for name in imported_modules(source) if not name.startswith("owsandbox.channel")
             and name != "owsandbox"}
    assert not wrong, f"channel/{source.name} imports {sorted(wrong)}"


@pytest.mark.parametrize("source", sources("kernel"), ids=lambda path: path.name)
def test_the_kernel_imports_only_the_protocol_of_the_box(source: Path) -> None:
    box = {name for name in imported_modules(source) if name.startswith("owsandbox.runner.box")}
    wrong = box - {"owsandbox.runner.box", "owsandbox.runner.box.protocol"}
    assert not wrong, f"kernel/{source.name} imports {sorted(wrong)} of the box"
