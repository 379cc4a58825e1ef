"""What tests need installed beyond the project's test extra, made before any test runs.

Three programs live in virtual environments of their own, since their pins are not the project's:
Jupyter Enterprise Gateway (`.venv-eg`), OpenSandbox's server (`.venv-opensandbox-server`) and the
MCP server `mcp-server-time` (`.cache/tests/mcp-server-time`). Their pins are in
tests/requirements/NAME.txt and nowhere else; an environment counts as made only when it holds the
program and a copy of the requirements it was made from equal to today's, so a changed pin makes it
again. `@modelcontextprotocol/server-everything` comes from npm, pinned in tests/npm/package.json,
into `.cache/tests/npm`.

Who makes them: `.ci/run`, before the test command (`python3 tests/prepare.py`, standard library
only); and the test session itself (tests/conftest.py, `pytest_collection_finish`), for a selected
test marked `needs(NAME)` whose environment is missing, before the first test starts and so outside
every test's timeout, saying what it installs. A test's fixture then only finds the program
(`program`), and fails naming the command that makes it when it is missing.

    python3 tests/prepare.py [NAME ...]      # every one (or those named) that is not made yet
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "tests" / "requirements"
CACHE = ROOT / ".cache" / "tests"
NPM_PACKAGE = ROOT / "tests" / "npm" / "package.json"
EVERYTHING = "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
MADE_FROM = "made-from-requirements.txt"  # inside an environment: the requirements it was made from
INSTALL_SECONDS = 900


@dataclass(frozen=True)
class Environment:
    """A virtual environment made from tests/requirements/NAME.txt, holding `bin/PROGRAM`."""

    name: str
    folder: Path
    program_name: str

    @property
    def requirements(self) -> Path:
        return REQUIREMENTS / f"{self.name}.txt"

    @property
    def pins(self) -> list[str]:
        """The requirement lines (what `pip install` is given)."""
        lines = (line.split("#", 1)[0].strip() for line in self.requirements.read_text().splitlines())
        return [line for line in lines if line]

    @property
    def program(self) -> Path:
        return self.folder / "bin" / self.program_name

    @property
    def command(self) -> str:
        """The command that makes it, for a message."""
        return f"python3 tests/prepare.py {self.name}"

    def made(self) -> bool:
        stamp = self.folder / MADE_FROM
        return self.program.exists() and stamp.exists() and stamp.read_text() == self.requirements.read_text()

    def make(self, python: str = sys.executable) -> None:
        """Make it (again) from its requirements; raises RuntimeError with pip's words when that fails.
        One at a time across processes (test workers may start together)."""
        with _locked(CACHE / f"{self.name}.lock"):
            if self.made():
                return
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            _run([python, "-m", "venv", "--clear", str(self.folder)], f"python3 -m venv {self.folder}")
            _run([str(self.folder / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                  "-r", str(self.requirements)], f"pip install -r {self.requirements.relative_to(ROOT)}")
            if not self.program.exists():
                raise RuntimeError(f"{self.requirements.relative_to(ROOT)} installed no {self.program_name}")
            shutil.copyfile(self.requirements, self.folder / MADE_FROM)


ENVIRONMENTS = {env.name: env for env in (
    Environment("enterprise-gateway", ROOT / ".venv-eg", "jupyter-enterprisegateway"),
    Environment("opensandbox-server", ROOT / ".venv-opensandbox-server", "opensandbox-server"),
    Environment("mcp-server-time", CACHE / "mcp-server-time", "mcp-server-time"),
)}


def npm_made() -> bool:
    folder = CACHE / "npm"
    installed = folder / "package.json"
    return installed.exists() and installed.read_text() == NPM_PACKAGE.read_text() and (folder / EVERYTHING).exists()


def make_npm() -> None:
    """tests/npm/package.json installed in .cache/tests/npm; RuntimeError when npm fails or is missing."""
    folder = CACHE / "npm"
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed (apt-get install npm)")
    with _locked(CACHE / "npm.lock"):
        if npm_made():
            return
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "package.json").write_text(NPM_PACKAGE.read_text())
        try:
            _run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], "npm install", cwd=folder)
        except RuntimeError:
            (folder / "package.json").unlink(missing_ok=True)  # the next run tries again
            raise
        if not (folder / EVERYTHING).exists():
            raise RuntimeError(f"npm install of tests/npm/package.json made no {EVERYTHING}")


NEEDS = {**{name: (env.made, env.make) for name, env in ENVIRONMENTS.items()}, "npm": (npm_made, make_npm)}


def what(name: str) -> str:
    """What making `name` installs, in words."""
    if name == "npm":
        return f"{NPM_PACKAGE.relative_to(ROOT)} into {(CACHE / 'npm').relative_to(ROOT)}"
    env = ENVIRONMENTS[name]
    return f"{', '.join(env.pins)} into {env.folder.relative_to(ROOT)}"


def _run(argv: list[str], what_: str, cwd: Path | None = None) -> None:
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_SECONDS)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"{what_} failed: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(f"{what_} failed (status {done.returncode}): {(done.stdout + done.stderr).strip()[-1500:]}")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def main(names: list[str]) -> int:
    unknown = [name for name in names if name not in NEEDS]
    if unknown:
        print(f"tests/prepare.py: no {', '.join(unknown)}; known: {', '.join(NEEDS)}", file=sys.stderr)
        return 2
    failed = 0
    for name in names or list(NEEDS):
        made, make = NEEDS[name]
        if made():
            continue
        print(f"tests/prepare.py: installing {what(name)}", flush=True)
        try:
            make()
        except RuntimeError as exc:
            print(f"tests/prepare.py: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main(sys.argv[1:]))
