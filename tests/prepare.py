"""What tests need installed beyond the project's test extra, made before any test runs.

Three programs live in virtual environments of their own, since their pins are not the project's:
Jupyter Enterprise Gateway (`.venv-eg`), OpenSandbox's server (`.venv-opensandbox-server`) and the
MCP server `mcp-server-time` (`.cache/tests/mcp-server-time`). Their pins are in
tests/requirements/NAME.txt and nowhere else; an environment counts as made only when it holds the
program and a copy of the requirements it was made from equal to today's, so a changed pin makes it
again. `@modelcontextprotocol/server-everything` comes from npm, pinned in tests/npm/package.json,
into `.cache/tests/npm`.

`quick-start` is the wheels of what the README's first command installs (tests/test_readme.py runs
that command for real, in a copy of the project): its `pip install` target with every dependency, and
the build backend that makes the editable install, in `.cache/tests/quick-start-wheels`. The test
points pip there and nowhere else (PIP_NO_INDEX), so that the command makes the user's environment
itself, from nothing, yet no download happens within the test's timeout. The wheels count as made for
the command, the requirements it brings and the Python version they were fetched for (WHEELS_FOR),
so a change to any of them fetches them again.

Who makes them: `.ci/run`, before the test command (`python3 tests/prepare.py`, standard library
only); and the test session itself (tests/conftest.py, `pytest_collection_finish`), for a selected
test marked `needs(NAME)` whose environment is missing, before the first test starts and so outside
every test's timeout, saying what it installs. A test's fixture then only finds the program
(`program`), and fails naming the command that makes it when it is missing.

    python3 tests/prepare.py [NAME ...]      # every one (or those named) that is not made yet, at once
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

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


README = ROOT / "README.md"
PYPROJECT = ROOT / "pyproject.toml"
QUICK_START_WHEELS = CACHE / "quick-start-wheels"
WHEELS_FOR = "made-for.txt"  # inside the wheels' folder: what they were fetched for
# hatchling builds an editable install with `editables` (its get_requires_for_build_editable): pip fetches
# it as it builds, so it is fetched here with the build backend.
EDITABLE_BUILD_REQUIRES = ("editables",)


def quick_start() -> list[str]:
    """The README quick start's commands: its `sh` blocks, one command each (the user's, then the
    contributors'); AssertionError when it is not that shape (tests/test_readme.py holds it so)."""
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", README.read_text(), re.S | re.M)
    assert section, "the README has no quick start"
    blocks = re.findall(r"^```sh\n(.*?)^```", section.group(1), re.S | re.M)
    commands = [[line for line in block.splitlines() if line.strip()] for block in blocks]
    assert [len(block) for block in commands] == [1, 1], f"two blocks of one command each: {commands}"
    return [block[0] for block in commands]


def quick_start_install() -> list[str]:
    """What the README's first command gives `pip install` (`-e .[lab]`), as words."""
    first = quick_start()[0]
    found = re.search(r"\bpip install ([^&;|]+)", first)
    if not found:
        raise RuntimeError(f"the README's first command installs nothing with pip: {first}")
    return shlex.split(found.group(1))


def build_requires() -> list[str]:
    """pyproject.toml's [build-system] requires (what building the project fetches)."""
    found = re.search(r"^\[build-system\]\s*^requires\s*=\s*\[([^\]]*)\]", PYPROJECT.read_text(), re.M)
    if not found:
        raise RuntimeError("pyproject.toml has no [build-system] requires = [...]")
    return re.findall(r"[\"']([^\"']+)[\"']", found.group(1))


_PYTHON_TAG = "import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())"


def _python_tag() -> str:
    """This Python's version and platform (`cpython-311 linux-x86_64`): what a wheel is for. The wheels
    are fetched with `python3` (the README's command's) and checked by the Python running this, the same
    one where the test environment was made with `python3` as the README's second command does."""
    return f"{sys.implementation.cache_tag} {sysconfig.get_platform()}"


def _dependencies(words: list[str]) -> list[str]:
    """The project's requirements that installing `words` (`-e .[lab]`) brings: its dependencies and
    those of the extras named (an extra that names the project's own extras, too), as pyproject.toml
    says them; its whole [project] tables as text where Python has no tomllib (3.10)."""
    try:
        import tomllib
    except ImportError:
        text = PYPROJECT.read_text()
        return [found.group(0) for found in re.finditer(r"^\[project(\.optional-dependencies)?\]\n.*?(?=^\[|\Z)",
                                                         text, re.S | re.M)]
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    wanted = list(project.get("dependencies", []))
    extras = [extra for word in words if word.startswith(".[") for extra in word[2:].rstrip("]").split(",")]
    seen: set[str] = set()
    while extras:
        extra = extras.pop().strip()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in optional.get(extra, []):
            own = re.fullmatch(rf"{re.escape(project['name'])}\[([^\]]+)\]", requirement.strip())
            if own:
                extras.extend(own.group(1).split(","))
            else:
                wanted.append(requirement)
    return sorted(set(wanted))


def wheels_for() -> str:
    """What the quick start's wheels are fetched for: the command's `pip install`, the build, the
    Python and the requirements that install brings."""
    words = quick_start_install()
    return "\n".join([f"pip install {shlex.join(words)}",
                      f"build: {', '.join([*build_requires(), *EDITABLE_BUILD_REQUIRES])}",
                      f"python: {_python_tag()}", *_dependencies(words)]) + "\n"


def quick_start_made() -> bool:
    stamp = QUICK_START_WHEELS / WHEELS_FOR
    return stamp.exists() and stamp.read_text() == wheels_for()


def make_quick_start_wheels() -> None:
    """Fetch (and build, for a package that has no wheel) every wheel the README's first command
    installs, with the `pip` of a fresh virtual environment of `python3` (the one that command makes),
    into QUICK_START_WHEELS; RuntimeError with pip's words when that fails."""
    python3 = shutil.which("python3")
    if python3 is None:
        raise RuntimeError("no python3 on PATH (the README's first command runs it)")
    with _locked(CACHE / "quick-start-wheels.lock"):
        if quick_start_made():
            return
        stamp = wheels_for()
        target = [str(ROOT) + word[1:] if word.startswith(".") else word
                  for word in quick_start_install() if word not in ("-e", "--editable")]
        if any(word.startswith("-") for word in target):
            raise RuntimeError(f"the README's pip install has options this cannot fetch for: {target}")
        partial = QUICK_START_WHEELS.with_name(QUICK_START_WHEELS.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="owsandbox-quick-start-") as folder:
            venv = Path(folder) / "venv"
            _run([python3, "-m", "venv", str(venv)], f"{python3} -m venv")
            theirs = subprocess.run([str(venv / "bin" / "python"), "-c", _PYTHON_TAG], capture_output=True,
                                    text=True, timeout=60).stdout.strip()
            if theirs != _python_tag():
                raise RuntimeError(f"python3 on PATH is {theirs or '?'}, but {sys.executable} is {_python_tag()}: the "
                                   "wheels would be for another Python than the one that checks them (make the test "
                                   "environment with that python3, as the README's second command does)")
            _run([str(venv / "bin" / "pip"), "wheel", "--quiet", "--disable-pip-version-check", "--wheel-dir",
                  str(partial), *target, *build_requires(), *EDITABLE_BUILD_REQUIRES],
                 f"pip wheel {' '.join(quick_start_install())} (the README's first command's)")
        for own in partial.glob("owsandbox-*.whl"):  # the command installs the project from its folder
            own.unlink()
        (partial / WHEELS_FOR).write_text(stamp)
        shutil.rmtree(QUICK_START_WHEELS, ignore_errors=True)
        partial.rename(QUICK_START_WHEELS)


NEEDS = {**{name: (env.made, env.make) for name, env in ENVIRONMENTS.items()}, "npm": (npm_made, make_npm),
         "quick-start": (quick_start_made, make_quick_start_wheels)}


def what(name: str) -> str:
    """What making `name` installs, in words."""
    if name == "npm":
        return f"{NPM_PACKAGE.relative_to(ROOT)} into {(CACHE / 'npm').relative_to(ROOT)}"
    if name == "quick-start":
        return (f"the wheels of the README's first command (pip install {' '.join(quick_start_install())}, and "
                f"its build) into {QUICK_START_WHEELS.relative_to(ROOT)}")
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
    """Make every one of `names` (all when none is named) that is not made yet, all at once: each is
    mostly pip or npm waiting on downloads and unpacking, so one after another took minutes longer."""
    unknown = [name for name in names if name not in NEEDS]
    if unknown:
        print(f"tests/prepare.py: no {', '.join(unknown)}; known: {', '.join(NEEDS)}", file=sys.stderr)
        return 2
    missing = [name for name in names or list(NEEDS) if not NEEDS[name][0]()]
    with ThreadPoolExecutor(max_workers=max(1, len(missing))) as pool:
        failed = sum(not ok for ok in pool.map(_make, missing))
    return 1 if failed else 0


def _make(name: str) -> bool:
    """Make `name`, saying what and how long; False (and pip's or npm's words) when that fails."""
    _say(f"installing {what(name)}")
    started = time.monotonic()
    try:
        NEEDS[name][1]()
    except RuntimeError as exc:
        _say(str(exc), sys.stderr)
        return False
    _say(f"{name} made in {time.monotonic() - started:.0f} s")
    return True


def _say(text: str, stream: TextIO = sys.stdout) -> None:
    """A line in one write: `print` writes the text and its newline apart, and the items are made in
    threads at once, so their lines would run together."""
    stream.write(f"tests/prepare.py: {text}\n")
    stream.flush()


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main(sys.argv[1:]))
