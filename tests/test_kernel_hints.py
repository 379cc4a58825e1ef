"""The hint after a failing command whose cause is the sandbox's missing network (sans-I/O)."""

from __future__ import annotations

import pytest

from owsandbox.kernel.cell.hints import NO_NETWORK_HINT, network_hint

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("message", [
    "curl: (6) Could not resolve host: example.org",
    "socket.gaierror: [Errno -3] Temporary failure in name resolution",
    "wget: unable to resolve host address 'example.org'",
    "ssh: Could not resolve hostname x: Name or service not known",
    "npm ERR! getaddrinfo ENOTFOUND registry.npmjs.org",
    "pip: Failed to establish a new connection: [Errno 101] Network is unreachable",
])
def test_a_lookup_failure_on_a_box_without_network_gets_the_hint(message: str) -> None:
    assert network_hint({"exit_code": 1, "output": "working...\n" + message + "\n"}, "none") == NO_NETWORK_HINT


@pytest.mark.parametrize("result, network", [
    ({"exit_code": 6, "output": "curl: (6) Could not resolve host: example.org\n"}, "outbound"),  # a real DNS fault
    ({"exit_code": 6, "output": "curl: (6) Could not resolve host: example.org\n"}, None),  # cannot tell
    ({"exit_code": 0, "output": "Could not resolve host: printed by a test that passed\n"}, "none"),
    ({"exit_code": 2, "output": "ls: cannot access '/nowhere': No such file or directory\n"}, "none"),
])
def test_no_hint_where_the_network_is_not_the_cause(result: dict, network: str | None) -> None:
    assert network_hint(result, network) is None
