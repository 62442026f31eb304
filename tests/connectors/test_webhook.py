"""The callback connector's destination checks (no traffic: pure checks of
URLs and resolved addresses) and its signed, pinned delivery."""

import pytest

from connectors.base import ProviderRejected
from connectors.http_exchange import ExchangeLimits
from connectors.webhook import DestinationRefused, WebhookConnector, address_problem, resolve_destination, url_problem


@pytest.mark.parametrize("address", ["127.0.0.1", "127.8.0.1", "10.0.0.1", "172.16.5.4", "192.168.1.1",
                                     "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1", "240.0.0.1",
                                     "::1", "fe80::1", "fd00:ec2::254", "::ffff:127.0.0.1", "::ffff:10.1.2.3", "::"])
def test_non_public_addresses_are_refused(address):
    assert address_problem(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:4700:4700::1111", "8.8.8.8"])
def test_public_addresses_pass(address):
    assert address_problem(address) is None


@pytest.mark.parametrize("url, require_https, expected", [
    ("https://agent.example/hook", True, None),
    ("http://agent.example/hook", True, "must be https"),
    ("http://agent.example/hook", False, None),
    ("ftp://agent.example/hook", False, "must be"),
    ("https://user:pw@agent.example/hook", True, "credentials"),
    ("https:///hook", True, "no host"),
    ("https://agent.example:99999/", True, "not a URL"),
])
def test_url_checks(url, require_https, expected):
    problem = url_problem(url, require_https=require_https)
    assert (problem is None) if expected is None else (expected in problem)


def test_a_name_that_resolves_to_loopback_is_refused_at_resolution():
    with pytest.raises(DestinationRefused, match="loopback"):
        resolve_destination("http://localhost:9/hook", allow_private=False, require_https=False)
    endpoint = resolve_destination("http://localhost:9/hook", allow_private=True, require_https=False)
    assert endpoint.address in ("127.0.0.1", "::1") and endpoint.host == "localhost"


def test_a_refused_destination_is_a_rejection_and_nothing_is_sent():
    connector = WebhookConnector("callback:1", "http://127.0.0.1:9/hook", lambda body: {},
                                 limits=ExchangeLimits(1, 1, 3, 1024), allow_private=False, require_https=False)
    with pytest.raises(ProviderRejected, match="callback URL refused"):
        connector.send({"id": "e-1"}, idempotency_key="op-1", client_reference="op-1")
