"""Shared fixtures: a real daemon from the real zipapp, reached through a real relay."""

from __future__ import annotations

from pathlib import Path

import pytest

from owsandbox.runner.bundle import build_runner_zipapp
from owsandbox.runner.client import RunnerClient
from owsandbox.runner.providers.local import LocalProvider


@pytest.fixture(scope="session")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_runner_zipapp(tmp_path_factory.mktemp("dist"))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


@pytest.fixture
def box(zipapp: Path, workspace: Path):
    """(provider, client) on a fresh daemon; the relay never leaves on silence here."""
    provider = LocalProvider(cwd=workspace, runner_path=zipapp, relay_silence_seconds=0)
    provider.create()
    client = RunnerClient(provider.open_runner, ping_seconds=0.5, reconnect_timeout=20)
    try:
        client.connect()
        yield provider, client
    finally:
        client.close()
        provider.destroy()
