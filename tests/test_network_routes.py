"""The routes that keep the host's own addresses out of a networked box's reach, as text: which addresses
of `ip -json address show` become refusing routes, and what a namespace without IPv6 is given."""

from __future__ import annotations

import json

import pytest

from owsandbox.host.isolation.network import REFUSED_RANGES, NetworkError, host_addresses, refusing_routes

pytestmark = pytest.mark.unit

LISTED = json.dumps([
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1"}, {"family": "inet6", "local": "::1"}]},
    {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "192.0.2.10"},
                                     {"family": "inet6", "local": "fe80::1%eth0"}]},
    {"ifname": "bridge", "addr_info": [{"family": "inet", "local": "203.0.113.1"},
                                       {"family": "inet6", "local": "2001:db8:88::1"}, {"local": "not an address"}]},
    {"ifname": "again", "addr_info": [{"family": "inet", "local": "203.0.113.1"}]},
])


def test_every_address_but_loopback_becomes_a_one_address_prefix_once():
    assert host_addresses(LISTED) == ["192.0.2.10/32", "fe80::1/128", "203.0.113.1/32", "2001:db8:88::1/128"]


def test_the_routes_refuse_each_address_and_the_link_local_ranges_and_can_be_set_again():
    lines = refusing_routes(["203.0.113.1/32", "2001:db8:88::1/128"]).splitlines()
    assert lines == [f"route replace unreachable {p}" for p in ["203.0.113.1/32", "2001:db8:88::1/128",
                                                                 *REFUSED_RANGES]]
    assert "169.254.0.0/16" in REFUSED_RANGES and "fe80::/10" in REFUSED_RANGES


def test_a_machine_without_ipv6_gets_no_ipv6_route():
    assert ":" not in refusing_routes(["203.0.113.1/32", "2001:db8:88::1/128"], ipv6=False)


@pytest.mark.parametrize("said", ["", "{", "[1,"])
def test_what_ip_printed_that_is_not_json_is_an_error_naming_the_command(said):
    with pytest.raises(NetworkError, match="ip -json address show"):
        host_addresses(said)


def test_json_of_another_shape_gives_no_address_rather_than_a_crash():
    assert host_addresses(json.dumps({"addr_info": []})) == [] and host_addresses(json.dumps([1, None])) == []
