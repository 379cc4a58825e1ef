"""The provider contract (`providers/base.py`) and the one place names become providers (`resolve`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from owsandbox.host.providers import (
    RUNNER_PROVIDERS,
    BwrapProvider,
    ContainerProvider,
    ExecProvider,
    LocalProvider,
    Provider,
    resolve,
)
from owsandbox.host.providers.boxed import ProgramBoxProvider
from owsandbox.host.providers.opensandbox import OpenSandboxProvider
from owsandbox.host.providers.questions import BoxQuestions, SnapshotSite
from owsandbox.host.snapshots.stopped import SnapshotsRefused, target_of
from owsandbox.kernel.sandbox import Sandbox, SandboxUnavailable

pytestmark = pytest.mark.unit


def test_a_name_resolves_to_its_factory_and_direct_only_where_the_caller_runs_commands():
    for name, factory in RUNNER_PROVIDERS.items():
        assert resolve(name) is factory and resolve(name, direct=True) is factory
    assert resolve("direct", direct=True) is None


def test_an_unknown_name_names_the_providers_the_caller_can_use():
    with pytest.raises(ValueError) as workspace_error:
        resolve("no-such-box", direct=True)
    assert str(workspace_error.value) == ("unknown sandbox provider 'no-such-box'; "
                                          "known providers: direct, auto, bwrap, container, exec, local, opensandbox")
    with pytest.raises(ValueError) as kernel_error:
        resolve("direct", source="OWSANDBOX_PROVIDER")  # the kernel always has a box
    assert str(kernel_error.value) == ("unknown sandbox provider 'direct' (from OWSANDBOX_PROVIDER); "
                                       "known providers: auto, bwrap, container, exec, local, opensandbox")


def test_the_kernel_reports_an_unknown_name_in_every_cell(tmp_path):
    sandbox = Sandbox(cwd=str(tmp_path), provider="nope")
    sandbox.start_in_background()  # nothing to start
    with pytest.raises(SandboxUnavailable, match=r"unknown sandbox provider 'nope' \(from OWSANDBOX_PROVIDER\); "
                                                 "known providers: auto, bwrap"):
        sandbox.wait(1)
    assert sandbox.describe()["error"].startswith("unknown sandbox provider 'nope'")


def test_the_contract_is_abstract_and_every_provider_fulfils_it():
    with pytest.raises(TypeError):
        Provider()  # type: ignore[abstract]
    assert Provider.__abstractmethods__ == {"create", "open_runner", "destroy"}  # the lifecycle, and only it
    assert ProgramBoxProvider.__abstractmethods__ == {"_run_bootstrap", "_disconnect", "open_runner"}
    for cls in (LocalProvider, BwrapProvider, ExecProvider, OpenSandboxProvider):
        assert not cls.__abstractmethods__, cls
    assert issubclass(ExecProvider, ProgramBoxProvider) and issubclass(OpenSandboxProvider, ProgramBoxProvider)


def test_the_defaults_of_a_provider_with_nothing_more_to_say():
    calls: list[str] = []

    class Minimal(Provider):
        name = "minimal"

        def create(self) -> None:
            calls.append("create")

        def open_runner(self) -> Any:
            raise NotImplementedError

        def destroy(self) -> None:
            calls.append("destroy")

    box = Minimal()
    box.release()  # a box that cannot outlive its provider ends with it
    assert calls == ["destroy"]
    assert box.reused is False and box.fallback_reason is None and box.shares_host_files is False
    assert box.describe() == {"provider": "minimal", "enforcement": "none"} and box.headline() == ["minimal"]
    assert box.limit_counters() == {} and box.limit_report() is None and box.network_state() is None
    hello = {"execd": {"unix_socket": "/run/x.sock", "token": "t"}}
    assert box.execd_socket(hello) == "/run/x.sock" and box.execd_endpoint(hello).unix_socket == "/run/x.sock"
    assert box.snapshot_site() is None
    with pytest.raises(SnapshotsRefused, match="^snapshots are not available with the minimal provider: it does not "
                                               "say how to stop its box while the host puts the files back$"):
        target_of(box)


def test_what_the_kernel_may_ask_is_an_interface_apart_from_the_lifecycle():
    lifecycle = {"create", "open_runner", "destroy", "release"}
    asked = {name for name in vars(BoxQuestions) if not name.startswith("_")}
    assert not lifecycle & asked and issubclass(Provider, BoxQuestions)
    assert {"headline", "describe", "limit_counters", "limit_report", "set_network", "network_state", "after_cell",
            "execd_endpoint", "snapshot_site"} <= asked
    assert not any(hasattr(cls, "restart_daemon") for cls in (Provider, LocalProvider, BwrapProvider, ExecProvider,
                                                               ContainerProvider, OpenSandboxProvider))


def test_snapshots_follow_the_capability_a_provider_offers_not_its_class(tmp_path):
    """A provider of no known class that offers a snapshot site gets snapshots; the site's folder is resolved."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    stops: list[str] = []

    @contextmanager
    def stopped() -> Iterator[None]:
        stops.append("stopped")
        yield

    class Offering(BoxQuestions):
        name = "offering"

        def snapshot_site(self) -> SnapshotSite:
            return SnapshotSite(str(tmp_path / "link"), None, stopped)

    target = target_of(Offering())
    assert target.workspace == str(tmp_path / "real") and not target.scope.excluded
    with target.stopped():
        pass
    assert stops == ["stopped"]
    for cls in (BwrapProvider, ContainerProvider):  # the two that take them override the capability
        assert cls.snapshot_site is not BoxQuestions.snapshot_site, cls
    for cls in (LocalProvider, ExecProvider, OpenSandboxProvider):
        assert cls.snapshot_site is BoxQuestions.snapshot_site
        assert cls.snapshots_refused != BoxQuestions.snapshots_refused


def test_auto_says_why_it_does_not_isolate(monkeypatch, tmp_path):
    from owsandbox.host.providers import bwrap

    monkeypatch.setattr(bwrap, "bwrap_problem", lambda: "bubblewrap (bwrap) is not installed")
    provider = RUNNER_PROVIDERS["auto"](cwd=tmp_path)
    assert type(provider) is LocalProvider and provider.fallback_reason is not None
    assert "bubblewrap (bwrap) is not installed" in provider.headline()[1]
    assert LocalProvider(cwd=tmp_path).fallback_reason is None
