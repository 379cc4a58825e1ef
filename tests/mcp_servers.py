"""Real MCP servers nobody here wrote, installed into `.cache/tests/` of the checkout before the tests
(tests/prepare.py: by .ci/run, or by the test session before its first test, for the tests marked
`needs("npm", "mcp-server-time")`): `@modelcontextprotocol/server-everything` from npm (pinned in
tests/npm/package.json) and `mcp-server-time` from the package index (pinned in
tests/requirements/mcp-server-time.txt), in a virtual environment of its own. One that is missing is a
test failure, not a skip, when running as root (as CI does: it must run there); elsewhere it skips
with its reason and the command that installs it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .prepare import CACHE, ENVIRONMENTS, EVERYTHING, npm_made

NODE = "/usr/bin/node"


def _cannot(why: str) -> None:
    if os.geteuid() == 0:
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def npm_folder() -> Path:
    """tests/npm/package.json installed in CACHE/npm."""
    if not os.path.exists(NODE):
        _cannot(f"server-everything needs {NODE} and npm")
    if not npm_made():
        _cannot("tests/npm/package.json is not installed in .cache/tests/npm: run `python3 tests/prepare.py npm`")
    return CACHE / "npm"


def everything_command() -> str:
    return f"{NODE} {npm_folder() / EVERYTHING} stdio"


def mcp_server_time() -> Path:
    """`mcp-server-time` in its virtual environment."""
    env = ENVIRONMENTS["mcp-server-time"]
    if not env.made():
        _cannot(f"mcp-server-time is not installed: run `{env.command}`")
    return env.program
