"""What a kernel imports to start: only what answers kernel_info and runs a first plain cell. The rest
(the magics, %attach and its WebSocket channel, the completion code, the display sanitisers, the box's
own shell code, the providers not chosen) is imported where it is first used. benchmarks/kernel_start.py
measures the start itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

DEFERRED = ["owsandbox.kernel.magics.table", "owsandbox.kernel.magics.attach", "owsandbox.kernel.magics.teaching",
            "owsandbox.kernel.magics.files", "owsandbox.kernel.magics.placement",
            "owsandbox.kernel.editing.completeness",
            "owsandbox.kernel.attach.session", "owsandbox.kernel.editing.completion",
            "owsandbox.kernel.display.untrusted", "owsandbox.channel.channel", "owsandbox.box.shell.bash",
            "owsandbox.host.providers.container", "owsandbox.host.providers.exec", "owsandbox.host.snapshots.store",
            "websockets"]


def test_the_kernels_module_leaves_what_a_start_does_not_need_unimported():
    probe = ("import json, sys; import owsandbox.kernel.__main__; "
             f"print(json.dumps([name for name in {DEFERRED!r} if name in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout) == []


@pytest.mark.unit
def test_the_channels_names_are_its_modules_objects_when_asked_for():
    import owsandbox.channel as channel
    from owsandbox.channel import endpoint, errors, execdws, jsonlines
    from owsandbox.channel.channel import ExecdJsonLineChannel
    from owsandbox.channel.control import ExecdControl

    assert set(channel.__all__) == set(channel._FROM)
    assert channel.ExecdEndpoint is endpoint.ExecdEndpoint and channel.ReplayGap is errors.ReplayGap
    assert channel.STDOUT == execdws.STDOUT and channel.Record is jsonlines.Record
    assert channel.ExecdJsonLineChannel is ExecdJsonLineChannel and channel.ExecdControl is ExecdControl
    with pytest.raises(AttributeError, match="module 'owsandbox.channel' has no attribute 'Nothing'"):
        channel.Nothing  # noqa: B018


@pytest.mark.unit
def test_a_provider_imported_when_first_asked_for_is_the_same_class():
    import owsandbox.host.providers as providers
    from owsandbox.host.providers.container import ContainerProvider
    from owsandbox.host.providers.exec import ExecProvider

    assert providers.ContainerProvider is ContainerProvider and providers.ExecProvider is ExecProvider
    assert providers.resolve("container").provider_class() is ContainerProvider  # type: ignore[attr-defined]
    assert providers.enforcement_of("container") == ContainerProvider.enforcement
    assert providers.enforcement_of("exec") == ExecProvider.enforcement
    with pytest.raises(AttributeError, match="has no attribute 'NoProvider'"):
        providers.NoProvider  # noqa: B018


@pytest.mark.unit
def test_the_sandbox_asks_what_isolates_it_when_first_needed_not_while_the_kernel_is_made(monkeypatch, tmp_path):
    """`auto` probes bubblewrap with a process of its own: on the thread that starts the box, or for the banner."""
    from owsandbox.kernel import sandbox as sandbox_module
    from owsandbox.settings import Settings

    asked: list[str] = []
    monkeypatch.setattr(sandbox_module, "enforcement_of", lambda name: asked.append(name) or "bubblewrap")
    made = sandbox_module.Sandbox(cwd=str(tmp_path), provider="auto", settings=Settings())
    assert asked == []
    assert made.isolation_note() == "isolated by bubblewrap" and made.enforcement == "bubblewrap"
    assert asked == ["auto"]
