"""The package's shape, counted: `os.environ` reads, method names spelled outside `protocol/`, modules
over 600 lines and functions over 60, and copies of the `inside()` test. For a before/after
beside a change: run it on this tree and on an older one (`git archive REV owsandbox | tar -x -C DIR`).

Run: `python benchmarks/code_shape.py [PACKAGE_FOLDER]` (default: this repository's `owsandbox`).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

MODULE_LINES = 600
FUNCTION_LINES = 60
RUNNER_METHOD = re.compile(r"(runner|session|shell|fs|proc|box)\.[a-z_]+|\$/ping")
NOT_METHODS = {"runner.sock"}


def environ_reads(tree: ast.AST) -> int:
    """`os.environ[...]`, `os.environ.get/pop(...)`, `X in os.environ`, `os.getenv(...)` (writes not counted)."""
    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_environ(node.value):
            count += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "pop") and is_environ(node.func.value):
                count += 1
            elif node.func.attr == "getenv":
                count += 1
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            count += any(is_environ(comparator) for comparator in node.comparators)
    return count


def main() -> None:
    package = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "owsandbox")
    methods_file = package / "protocol" / "methods.py"
    spelled = {node.value for node in ast.walk(ast.parse(methods_file.read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               and RUNNER_METHOD.fullmatch(node.value)}
    reads = spellings = 0
    big_modules: list[str] = []
    long_functions: list[str] = []
    inside_copies = 0
    for source in sorted(package.rglob("*.py")):
        text = source.read_text(encoding="utf-8")
        tree = ast.parse(text)
        name = source.relative_to(package).as_posix()
        reads += environ_reads(tree)
        if not name.startswith("protocol/"):
            spellings += sum(1 for node in ast.walk(tree) if isinstance(node, ast.Constant)
                             and isinstance(node.value, str) and node.value not in NOT_METHODS
                             and (node.value in spelled or RUNNER_METHOD.fullmatch(node.value)))
        lines = text.count("\n")
        if lines > MODULE_LINES:
            big_modules.append(f"{name} ({lines})")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    long_functions.append(f"{name}:{node.name} ({length})")
        inside_copies += text.count('rstrip("/") + "/"')
    print(f"os.environ reads: {reads}")
    print(f"method names spelled outside protocol/: {spellings}")
    print(f"modules over {MODULE_LINES} lines: {len(big_modules)}: {', '.join(big_modules)}")
    print(f"functions over {FUNCTION_LINES} lines: {len(long_functions)}: {', '.join(long_functions)}")
    print(f"inside() tests spelled out: {inside_copies}")


if __name__ == "__main__":
    main()
