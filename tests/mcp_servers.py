"""Real MCP servers nobody here wrote, installed once into `.cache/tests/` of the checkout and reused
(offline after that): `@modelcontextprotocol/server-everything` from npm (pinned in
tests/npm/package.json, which .ci/run installs the same way) and `mcp-server-time` from the package
index, in a virtual environment of its own. An install that fails is a test failure, not a skip,
when running as root (as CI does: it must run there); elsewhere a missing npm or node skips with
its reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "tests"
PACKAGE = Path(__file__).resolve().parent / "npm" / "package.json"
EVERYTHING = "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
NODE = "/usr/bin/node"


def _cannot(why: str) -> None:
    if os.geteuid() == 0:
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def npm_folder() -> Path:
    """tests/npm/package.json installed in CACHE/npm (again whenever that file changed)."""
    folder = CACHE / "npm"
    npm = shutil.which("npm")
    if not os.path.exists(NODE) or npm is None:
        _cannot(f"server-everything needs {NODE} and npm")
    wanted = PACKAGE.read_text()
    installed = folder / "package.json"
    if not (installed.exists() and installed.read_text() == wanted and (folder / EVERYTHING).exists()):
        folder.mkdir(parents=True, exist_ok=True)
        installed.write_text(wanted)
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=folder,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not (folder / EVERYTHING).exists():
            installed.unlink(missing_ok=True)  # the next run tries again
            _cannot(f"npm install of tests/npm/package.json failed: {done.stderr.strip()[-500:]}")
    return folder


def everything_command() -> str:
    return f"{NODE} {npm_folder() / EVERYTHING} stdio"


def mcp_server_time() -> Path:
    """`mcp-server-time` in CACHE/mcp-server-time (a virtual environment), installed on first use."""
    venv = CACHE / "mcp-server-time"
    program = venv / "bin" / "mcp-server-time"
    if program.exists():
        return program
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True,
                       timeout=120)
        done = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "mcp-server-time"],
                              capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        _cannot(f"no virtual environment for mcp-server-time: {exc}")
    if done.returncode != 0 or not program.exists():
        _cannot(f"mcp-server-time could not be installed: {done.stderr.strip()[-300:]}")
    return program
