"""The HTTP connector trusts no provider answer blindly: a lookup adopts only
a message carrying our reference (two for it are ambiguous, never a guess), a
slow drip cannot outlast the overall deadline, an answer larger than the
limit is not read."""

from __future__ import annotations

import threading
import time

import pytest

from connectors.base import ProviderLookupAmbiguous, ProviderOutcomeUnknown
from connectors.email_http import HttpEmailConnector
from connectors.registry import PROVIDER_CAPABILITIES
from tests.connectors.fakeprovider import FakeProvider, drip, message, reply_json
from tests.connectors.support import EMAIL


def connector(url: str, **limits) -> HttpEmailConnector:
    return HttpEmailConnector(url, "test-key", PROVIDER_CAPABILITIES["sim-lookup"], 1.0, limits.pop("read", 3.0),
                              name="sim-lookup", **limits)


@pytest.fixture
def fake():
    started = []

    def start(answer):
        provider = FakeProvider(answer).start()
        started.append(provider)
        return provider

    yield start
    for provider in started:
        provider.stop()


def lookup_answering(*messages):
    """A provider whose lookup ignores the client_reference filter."""
    return lambda handler, method, path, body: reply_json(handler, 200, {"data": list(messages)})


def test_a_lookup_ignores_messages_that_carry_another_reference(fake):
    provider = fake(lookup_answering(message("someone-else", "msg-other")))
    assert connector(provider.url).lookup("op-mine") is None


def test_a_lookup_adopts_the_one_message_that_carries_our_reference(fake):
    provider = fake(lookup_answering(message("someone-else", "msg-other"), message("op-mine", "msg-mine")))
    found = connector(provider.url).lookup("op-mine")
    assert found.provider_reference == "msg-mine"
    assert (found.evidence["matches"], found.evidence["ignored"]) == (1, 1)


def test_a_lookup_with_two_messages_for_our_reference_is_ambiguous_never_a_guess(fake):
    provider = fake(lookup_answering(message("op-mine", "msg-1"), message("op-mine", "msg-2")))
    with pytest.raises(ProviderLookupAmbiguous) as ambiguous:
        connector(provider.url).lookup("op-mine")
    assert "msg-1" in str(ambiguous.value) and "msg-2" in str(ambiguous.value)
    assert ambiguous.value.evidence["matches"] == 2


def test_a_slow_drip_answer_cannot_outlast_the_overall_deadline(fake):
    stop = threading.Event()
    provider = fake(lambda handler, method, path, body: drip(handler, every=0.2, stop=stop))
    started = time.monotonic()
    try:
        with pytest.raises(ProviderOutcomeUnknown, match="longer than 1.5s"):
            # Every read finishes well within read_timeout; only the deadline can stop it.
            connector(provider.url, read=3.0, total_timeout=1.5).send(EMAIL, idempotency_key="k",
                                                                      client_reference="op-1")
    finally:
        stop.set()
    # Not asserting speed, only that the deadline (not the 100 KB drip, ~20 s) ended it.
    assert time.monotonic() - started < 15


def test_an_answer_larger_than_the_limit_is_not_read(fake):
    huge = {"data": [message("op-mine", "msg-mine")], "padding": "x" * 200_000}
    provider = fake(lambda handler, method, path, body: reply_json(handler, 200, huge))
    with pytest.raises(ProviderOutcomeUnknown, match="larger than 65536 bytes"):
        connector(provider.url, max_response_bytes=65536).lookup("op-mine")


def test_the_default_deadline_covers_connecting_sending_and_reading():
    assert connector("http://127.0.0.1:9", read=3.0).total_timeout == 1.0 + 2 * 3.0
