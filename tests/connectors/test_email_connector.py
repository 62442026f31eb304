"""HttpEmailConnector against a real simulator subprocess: outcomes and failure classes."""

from __future__ import annotations

import socket
import threading
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest

from connectors.base import (
    Capabilities,
    Connector,
    NotSupported,
    ProviderAccepted,
    ProviderAuthFailed,
    ProviderIdempotencyConflict,
    ProviderIdempotencyMismatch,
    ProviderLookupAmbiguous,
    ProviderOutcomeUnknown,
    ProviderRejected,
    ProviderThrottled,
    ProviderUnavailable,
)
from connectors.email_http import HttpEmailConnector, parse_retry_after
from connectors.registry import (
    PROVIDER_FOR_SIMULATOR_MODE,
    UnknownProvider,
    connector_registered,
    get_connector,
)
from tests.connectors.support import EMAIL
from tests.support import wait_for


def test_send_returns_a_receipt_with_evidence(start_sim, connector_for):
    sim = start_sim("idempotent")
    connector = connector_for("sim-idempotent", sim)

    receipt = connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    assert receipt.provider_reference.startswith("msg_")
    assert receipt.accepted_at.tzinfo is not None
    assert abs(receipt.accepted_at - datetime.now(timezone.utc)) < timedelta(minutes=1)
    assert receipt.status == "accepted"
    assert receipt.replayed is False
    assert receipt.evidence["status_code"] == 201
    assert receipt.evidence["headers"]["Request-Id"].startswith("req_")
    assert receipt.evidence["idempotency_key_sent"] == "op-1"
    assert sim.messages() == [
        {
            "id": receipt.provider_reference,
            "idempotency_key": "op-1",
            "client_reference": "quote-1",
            "to": EMAIL["to"],
            "subject": EMAIL["subject"],
            "accepted_at": receipt.evidence["response"]["accepted_at"],
        }
    ]


def test_idempotent_resend_with_the_same_key_is_replayed_not_sent_again(start_sim, connector_for):
    sim = start_sim("idempotent")
    connector = connector_for("sim-idempotent", sim)
    first = connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    again = connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    assert again.replayed is True
    assert again.provider_reference == first.provider_reference
    assert again.accepted_at == first.accepted_at
    assert again.evidence["headers"]["Idempotent-Replayed"] == "true"
    assert len(sim.messages()) == 1


def test_reusing_a_key_for_a_different_request_raises_mismatch(start_sim, connector_for):
    sim = start_sim("idempotent")
    connector = connector_for("sim-idempotent", sim)
    connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    with pytest.raises(ProviderIdempotencyMismatch) as raised:
        connector.send({**EMAIL, "subject": "Changed"}, idempotency_key="op-1", client_reference="quote-1")

    assert raised.value.status == 422
    assert len(sim.messages()) == 1


def _send_until_not_in_progress(connector, *, client_reference, key, deadline_seconds=20.0):
    """Retry a 409 the way a worker would, until the first request has finished answering."""

    def sent():
        try:
            return connector.send(EMAIL, idempotency_key=key, client_reference=client_reference)
        except ProviderIdempotencyConflict:
            return None

    return wait_for(sent, timeout=deadline_seconds, interval=0.1, what="the first request to finish answering")


def test_lost_answer_is_unknown_then_conflict_then_replayed_with_the_same_key(start_sim, connector_for):
    sim = start_sim("idempotent", stall_after_accept=1.0)
    impatient = connector_for("sim-idempotent", sim, read_timeout=0.3)

    with pytest.raises(ProviderOutcomeUnknown) as lost:
        impatient.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")
    with pytest.raises(ProviderIdempotencyConflict) as in_progress:
        impatient.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")
    replay = _send_until_not_in_progress(connector_for("sim-idempotent", sim), client_reference="quote-1", key="op-1")

    assert lost.value.status is None
    assert lost.value.may_have_been_accepted
    assert in_progress.value.status == 409
    assert replay.replayed is True
    assert [m["id"] for m in sim.messages()] == [replay.provider_reference]


@pytest.mark.parametrize("provider_name, mode", [("sim-lookup", "lookup"), ("sim-bare", "bare")])
def test_stall_past_the_read_timeout_is_unknown_while_the_message_is_accepted(
    start_sim, connector_for, provider_name, mode
):
    sim = start_sim(mode, stall_after_accept=1.5)
    connector = connector_for(provider_name, sim, read_timeout=0.3)

    with pytest.raises(ProviderOutcomeUnknown):
        connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    assert [m["client_reference"] for m in sim.messages()] == ["quote-1"]


def test_lookup_recovers_a_receipt_whose_answer_was_lost(start_sim, connector_for):
    sim = start_sim("lookup", stall_after_accept=1.5)
    with pytest.raises(ProviderOutcomeUnknown):
        connector_for("sim-lookup", sim, read_timeout=0.3).send(
            EMAIL, idempotency_key="op-1", client_reference="quote-1"
        )

    found = connector_for("sim-lookup", sim).lookup("quote-1")

    assert found is not None
    assert found.provider_reference == sim.messages()[0]["id"]
    assert found.replayed is False
    assert found.evidence["matches"] == 1


@pytest.mark.parametrize("provider_name, mode", [("sim-idempotent", "idempotent"), ("sim-lookup", "lookup")])
def test_lookup_returns_none_for_an_unknown_reference(start_sim, connector_for, provider_name, mode):
    sim = start_sim(mode)
    connector = connector_for(provider_name, sim)
    connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    assert connector.lookup("quote-2") is None
    assert connector.lookup("quote-1") is not None


def test_lookup_reports_duplicates_as_ambiguous_and_adopts_none(start_sim, connector_for):
    sim = start_sim("lookup")
    connector = connector_for("sim-lookup", sim)
    first = connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")
    second = connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    with pytest.raises(ProviderLookupAmbiguous) as ambiguous:
        connector.lookup("quote-1")

    assert ambiguous.value.evidence["matches"] == 2
    assert first.provider_reference in str(ambiguous.value) and second.provider_reference in str(ambiguous.value)


def test_lookup_counts_only_messages_carrying_the_reference(start_sim, connector_for):
    # A provider whose lookup ignores the filter answers with everything.
    sim = start_sim("lookup", lookup_ignores_reference=True)
    connector = connector_for("sim-lookup", sim)
    connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")
    ours = connector.send(EMAIL, idempotency_key="op-2", client_reference="quote-2")

    found = connector.lookup("quote-2")

    assert found.provider_reference == ours.provider_reference
    assert found.evidence["matches"] == 1
    assert connector.lookup("quote-9") is None


def test_lookup_mode_connector_does_not_send_the_idempotency_key(start_sim, connector_for):
    sim = start_sim("lookup")
    connector = connector_for("sim-lookup", sim)

    connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")
    connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    assert [m["idempotency_key"] for m in sim.messages()] == [None, None]


def test_capabilities_come_from_the_declaration_not_the_provider(start_sim, connector_for, refused_url):
    # A provider declared bare is treated as bare even when the server behind
    # it could do more: no key is sent, no lookup is attempted.
    sim = start_sim("idempotent")
    connector = connector_for("sim-bare", sim)

    connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")
    connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    assert [m["idempotency_key"] for m in sim.messages()] == [None, None]
    with pytest.raises(NotSupported):
        connector.lookup("quote-1")
    # NotSupported is decided before any I/O: nothing listens here.
    with pytest.raises(NotSupported):
        connector_for("sim-bare", refused_url).lookup("quote-1")


def test_declared_lookup_against_a_bare_provider_is_rejected(start_sim, connector_for):
    sim = start_sim("bare")

    with pytest.raises(ProviderRejected) as raised:
        connector_for("sim-lookup", sim).lookup("quote-1")

    assert raised.value.status == 404


def test_connection_refused_is_unavailable_and_definitely_not_accepted(connector_for, refused_url):
    connector = connector_for("sim-idempotent", refused_url)

    with pytest.raises(ProviderUnavailable) as raised:
        connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    assert not isinstance(raised.value, ProviderOutcomeUnknown)
    assert raised.value.may_have_been_accepted is False
    assert raised.value.status is None
    assert "ConnectionRefusedError" in raised.value.evidence["error"]


def test_peer_closing_without_an_answer_is_unknown(connector_for):
    # A real socket server that reads the request and hangs up without a
    # word: the request arrived, so the outcome is unknown.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def hang_up():
        connection, _ = listener.accept()
        connection.recv(65536)
        connection.close()

    server = threading.Thread(target=hang_up, daemon=True)
    server.start()
    try:
        with pytest.raises(ProviderOutcomeUnknown) as raised:
            connector_for("sim-idempotent", f"http://127.0.0.1:{port}").send(
                EMAIL, idempotency_key="op-1", client_reference="quote-1"
            )
    finally:
        server.join(timeout=5)
        listener.close()

    assert raised.value.may_have_been_accepted


@pytest.mark.parametrize("provider_name, mode", [("sim-idempotent", "idempotent"), ("sim-lookup", "lookup")])
def test_rejected_credentials_raise_auth_failed(start_sim, connector_for, provider_name, mode):
    sim = start_sim(mode, reject_auth=True)
    connector = connector_for(provider_name, sim)

    with pytest.raises(ProviderAuthFailed) as on_send:
        connector.send(EMAIL, idempotency_key="op-1", client_reference="quote-1")
    with pytest.raises(ProviderAuthFailed):
        connector.lookup("quote-1")

    assert on_send.value.status == 401
    assert sim.messages() == []


def test_invalid_message_is_rejected_with_the_providers_reason(start_sim, connector_for):
    sim = start_sim("idempotent")

    with pytest.raises(ProviderRejected) as raised:
        connector_for("sim-idempotent", sim).send(
            {**EMAIL, "to": "nobody"}, idempotency_key="op-1", client_reference="quote-1"
        )

    assert raised.value.status == 422
    assert "'to'" in raised.value.detail
    assert raised.value.evidence["response"]["error"] == "validation_error"
    assert sim.messages() == []


def test_throttling_raises_throttled_with_the_providers_retry_after(start_sim, connector_for):
    sim = start_sim("idempotent", throttle_rate=1.0, retry_after=7)

    with pytest.raises(ProviderThrottled) as raised:
        connector_for("sim-idempotent", sim).send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    assert raised.value.status == 429
    assert raised.value.retry_after == 7.0
    assert sim.messages() == []


def test_server_error_is_an_unknown_outcome(start_sim, connector_for):
    sim = start_sim("idempotent", error_rate=1.0)

    with pytest.raises(ProviderOutcomeUnknown) as raised:
        connector_for("sim-idempotent", sim).send(EMAIL, idempotency_key="op-1", client_reference="quote-1")

    assert raised.value.status == 500
    assert sim.messages() == []


def test_retry_after_accepts_seconds_and_http_dates():
    in_ten_seconds = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=10), usegmt=True)

    assert parse_retry_after("3") == 3.0
    assert 8.0 < parse_retry_after(in_ten_seconds) <= 10.0
    assert parse_retry_after(None) == 1.0
    assert parse_retry_after("soon", default=2.5) == 2.5
    assert parse_retry_after("-4") == 0.0


@pytest.mark.parametrize(
    "provider_name, capabilities",
    [
        ("sim-idempotent", Capabilities(idempotency_key=True, lookup=True, retry_ceiling=30.0, idempotency_retention=86400.0)),
        ("sim-lookup", Capabilities(idempotency_key=False, lookup=True, retry_ceiling=30.0, idempotency_retention=86400.0)),
        ("sim-bare", Capabilities(idempotency_key=False, lookup=False, retry_ceiling=30.0, idempotency_retention=86400.0)),
    ],
)
def test_registry_builds_connectors_with_declared_capabilities_from_settings(
    settings, monkeypatch, provider_name, capabilities
):
    settings.PROVIDER_URL = "http://provider.invalid:9000/"
    settings.PROVIDER_CONNECT_TIMEOUT = 0.7
    settings.PROVIDER_READ_TIMEOUT = 1.3
    monkeypatch.setenv("PROVIDER_API_KEY", "from-the-environment")

    connector = get_connector(provider_name)

    assert isinstance(connector, HttpEmailConnector)
    assert connector.name == provider_name
    assert connector.capabilities == capabilities
    assert connector.base_url == "http://provider.invalid:9000"
    assert (connector.connect_timeout, connector.read_timeout) == (0.7, 1.3)
    assert connector.api_key == "from-the-environment"


def test_registry_sends_through_settings_provider_url(settings, start_sim):
    sim = start_sim("idempotent")
    settings.PROVIDER_URL = sim.url

    receipt = get_connector(PROVIDER_FOR_SIMULATOR_MODE["idempotent"]).send(
        EMAIL, idempotency_key="op-1", client_reference="quote-1"
    )

    assert [m["id"] for m in sim.messages()] == [receipt.provider_reference]


def test_registry_rejects_unknown_providers():
    with pytest.raises(UnknownProvider):
        get_connector("carrier-pigeon")


def test_registered_connector_overrides_and_is_restored(settings):
    settings.PROVIDER_URL = "http://provider.invalid"

    class FakeConnector(Connector):
        name = "sim-idempotent"
        capabilities = Capabilities(idempotency_key=True, lookup=False)

        def send(self, request, *, idempotency_key, client_reference):
            return ProviderAccepted("fake-1", datetime.now(timezone.utc))

        def lookup(self, client_reference):
            raise NotSupported("fake")

    fake = FakeConnector()
    with connector_registered("sim-idempotent", lambda: fake):
        assert get_connector("sim-idempotent") is fake
        with connector_registered("carrier-pigeon", lambda: fake):
            assert get_connector("carrier-pigeon") is fake

    assert isinstance(get_connector("sim-idempotent"), HttpEmailConnector)
    with pytest.raises(UnknownProvider):
        get_connector("carrier-pigeon")
