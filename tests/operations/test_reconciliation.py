"""Reconciliation when the provider misbehaves on the way back: a lookup that
itself fails (5xx, timeout, 429, 401), a lookup that answers with messages
that are not ours, several messages for one reference, and a provider that
says our idempotency key belongs to a different request. All against the
real simulator over real HTTP (its lookup faults), one attempt at a time."""

from datetime import timedelta

import pytest

from jobs.clock import db_now
from jobs.errors import AuthError, TransientError
from operations.errors import DigestMismatch
from operations.models import ConnectorPause, Operation, OperationEvent, Receipt
from tests.connectors.support import message, raw_request

from .support import attempt, enqueue_email, job

pytestmark = pytest.mark.django_db


def operation() -> Operation:
    return Operation.objects.get(job__tenant="studio", job__key="send-quote-017")


def kinds() -> list[str]:
    return list(OperationEvent.objects.filter(operation=operation()).values_list("kind", flat=True))


@pytest.fixture
def in_doubt(store, start_sim, provider):
    """An email whose first send answered 500: the provider may hold it, so
    the operation is UNKNOWN and the next attempt must reconcile first."""

    def make(mode: str = "idempotent") -> Operation:
        failing = start_sim(mode, error_rate=1.0, db_name="failing.sqlite3")
        provider(failing)
        enqueue_email(store, mode=mode)
        assert isinstance(attempt(store), TransientError)
        assert operation().state == "UNKNOWN"
        failing.stop()
        return operation()

    return make


@pytest.mark.parametrize("fault", ["500", "timeout"])
def test_a_lookup_that_fails_keeps_the_operation_in_doubt_sends_nothing_and_retries(
    store, start_sim, provider, in_doubt, fault
):
    in_doubt()
    if fault == "timeout":
        sim = start_sim("idempotent", lookup_stall=3)
        provider(sim, read_timeout=0.3)
    else:
        sim = start_sim("idempotent", lookup_fault=fault)
        provider(sim)

    outcome = attempt(store)

    assert isinstance(outcome, TransientError)
    assert "still unreconciled" in str(outcome) and "lookup of" in str(outcome)
    assert operation().state == "UNKNOWN"
    assert operation().attempts == 1
    assert kinds()[-1] == "lookup_failed"
    assert job().state == "READY"
    assert sim.messages() == []  # never sent while its fate is unknown

    healthy = start_sim("idempotent", db_name="healthy.sqlite3")
    provider(healthy)
    attempt(store)
    assert (operation().state, operation().attempts) == ("ACCEPTED", 2)
    assert kinds()[-2:] == ["lookup_miss", "accept"]
    assert len(healthy.messages()) == 1


def test_a_throttled_lookup_comes_back_after_the_providers_retry_after(store, start_sim, provider, in_doubt):
    in_doubt()
    sim = start_sim("idempotent", lookup_fault="429", retry_after=7)
    provider(sim)

    # The retry is due by the database's clock (PostgreSQL's now() stands at
    # the test transaction's start, before the simulator was started).
    before = db_now()
    outcome = attempt(store)

    assert isinstance(outcome, TransientError) and outcome.retry_after == 7
    assert operation().state == "UNKNOWN"
    assert kinds()[-1] == "lookup_failed"
    assert timedelta(seconds=6) < job().next_attempt_at - before < timedelta(seconds=9)
    assert sim.messages() == []


def test_a_lookup_refused_for_credentials_pauses_the_connector_and_leaves_the_operation_in_doubt(
    store, start_sim, provider, in_doubt
):
    in_doubt()
    sim = start_sim("idempotent", lookup_fault="401")
    provider(sim)

    outcome = attempt(store)

    assert isinstance(outcome, AuthError)
    assert "while a lookup" in str(outcome)
    assert operation().state == "UNKNOWN"  # a refused lookup says nothing about the message
    assert kinds()[-1] == "auth_refused"
    assert job().state == "NEEDS_ATTENTION"
    pause = ConnectorPause.objects.get(tenant="studio", provider="sim-idempotent", cleared_at=None)
    assert pause.status_code == 401 and pause.operation_id == operation().id
    assert sim.messages() == []


def test_a_lookup_that_ignores_the_reference_does_not_adopt_another_message(
    store, start_sim, provider, in_doubt, settings
):
    in_doubt("lookup")
    settings.OPERATIONS_LOOKUP_SETTLE_SECONDS = 0
    sim = start_sim("lookup", lookup_ignores_reference=True)
    provider(sim)
    someone_else = raw_request(sim.url, "POST", "/v1/messages", body=message("another-operation")).body

    attempt(store)

    op = operation()
    ours = [m for m in sim.messages() if m["client_reference"] == op.intent_key]
    assert len(ours) == 1
    assert op.receipt.provider_reference == ours[0]["id"] != someone_else["id"]
    assert op.receipt.how == "direct"
    assert "lookup_miss" in kinds()


def test_several_messages_for_one_reference_need_investigation_and_none_is_adopted(
    store, start_sim, provider, in_doubt
):
    in_doubt("lookup")
    sim = start_sim("lookup")
    provider(sim)
    reference = operation().intent_key
    first = raw_request(sim.url, "POST", "/v1/messages", body=message(reference)).body
    second = raw_request(sim.url, "POST", "/v1/messages", body=message(reference)).body

    attempt(store)

    op = operation()
    # Which message is the receipt (and whether the customer got two) is for
    # a human to say: no guess, no receipt, nothing resent.
    assert op.state == "NEEDS_INVESTIGATION"
    assert not Receipt.objects.filter(operation=op).exists()
    investigate = OperationEvent.objects.filter(operation=op).latest("id")
    assert "ambiguous" in investigate.reason
    assert first["id"] in investigate.reason and second["id"] in investigate.reason
    assert job().state == "NEEDS_ATTENTION"
    assert len(sim.messages()) == 2  # nothing more was sent


def test_a_key_the_provider_holds_for_a_different_request_needs_investigation_and_sends_nothing(
    store, start_sim, provider, in_doubt
):
    in_doubt()
    sim = start_sim("idempotent")
    provider(sim)
    # The provider already holds our idempotency key, for other content.
    key = operation().intent_key
    other = raw_request(sim.url, "POST", "/v1/messages", body=message("not-ours", subject="Something else"),
                        headers={"Idempotency-Key": key})
    assert other.status == 201

    outcome = attempt(store)

    assert isinstance(outcome, DigestMismatch)
    assert "already used for a different request" in str(outcome)
    assert operation().state == "NEEDS_INVESTIGATION"
    assert kinds()[-1] == "digest_mismatch"
    assert job().state == "NEEDS_ATTENTION"
    assert len(sim.messages()) == 1  # only the other request's message
