"""`%network on|off` where the provider cannot switch the network: a refusal that says why and what to do."""

from __future__ import annotations

import pytest

from owsandbox.host.providers import ContainerProvider, ExecProvider, LocalProvider
from owsandbox.host.providers.base import NetworkNotChanged
from owsandbox.host.providers.opensandbox import OpenSandboxProvider
from owsandbox.host.providers.opensandbox_lifecycle import OpenSandboxLifecycleProvider


@pytest.mark.unit
@pytest.mark.parametrize(("provider", "words"), [
    (LocalProvider, "no isolation): commands use this machine's network"),
    (ContainerProvider, "start the kernel with OWSANDBOX_NETWORK=1 (owsandbox install --env OWSANDBOX_NETWORK=1)"),
    (ExecProvider, "the box has its own network, which owsandbox does not control"),
    (OpenSandboxProvider, "set by its server"),
    (OpenSandboxLifecycleProvider, "set by its server"),
])
@pytest.mark.parametrize("on", [True, False])
def test_a_provider_that_cannot_switch_its_network_says_why(provider, words, on):
    with pytest.raises(NetworkNotChanged, match=words.replace("(", r"\(").replace(")", r"\)")):
        provider.__new__(provider).set_network(on)  # nothing is started: the refusal needs no box


def test_network_on_in_the_local_sandbox_is_refused_by_name(fresh_kernel):
    refused = fresh_kernel.run("%network on")
    assert refused.status == "error" and refused.error["ename"] == "NetworkNotChanged", refused.outputs
    assert refused.error["evalue"].startswith("%network on: there is no sandbox here (no isolation)")
    assert fresh_kernel.run("%network").text() == "network: this machine's own (no sandbox)\n"
    assert "usage: %network" in fresh_kernel.run("%network --help").text()
    assert "invalid choice: 'maybe'" in fresh_kernel.run("%network maybe").error["evalue"]
