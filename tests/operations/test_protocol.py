"""The operation protocol against a real simulator over real HTTP, one
attempt at a time in this process (the worker's own bookkeeping)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from connectors.base import Capabilities, Connector
from connectors.email_http import HttpEmailConnector
from connectors.registry import build_http_connector, connector_registered
from jobs import interventions
from jobs.actions import JobContext
from jobs.errors import AuthError, Conflict, NeedsAttention, PermanentError, TransientError
from jobs.models import Job
from operations.digest import request_digest
from operations.errors import ConnectorPaused, DigestMismatch
from operations.models import ConnectorPause, Operation, OperationEvent
from operations.protocol import operation_perform
from operations.services import connector_pause_clear

from tests.connectors.support import raw_request

from .support import EMAIL, attempt, enqueue_email, job, wait_for

pytestmark = pytest.mark.django_db


def operation(key="send-quote-017", tenant="studio") -> Operation:
    return Operation.objects.get(job__tenant=tenant, job__key=key)


def event_kinds(op: Operation) -> list[str]:
    return list(OperationEvent.objects.filter(operation=op).values_list("kind", flat=True))


class SpyConnector(Connector):
    """Wraps a real connector; records the operation's state at each send."""

    def __init__(self, real: Connector):
        self.real, self.name, self.capabilities = real, real.name, real.capabilities
        self.states_at_send: list[str] = []

    def send(self, request, *, idempotency_key, client_reference):
        self.states_at_send.append(Operation.objects.get(intent_key=idempotency_key).state)
        return self.real.send(request, idempotency_key=idempotency_key, client_reference=client_reference)

    def lookup(self, client_reference):
        return self.real.lookup(client_reference)


def test_intent_is_persisted_before_the_request_leaves_and_a_direct_receipt_follows(store, start_sim, provider):
    sim = start_sim("idempotent")
    provider(sim)
    spy = SpyConnector(build_http_connector("sim-idempotent"))
    enqueue_email(store)

    with connector_registered("sim-idempotent", lambda: spy):
        result = attempt(store)

    op = operation()
    assert spy.states_at_send == ["INTENDED"]
    assert (op.state, op.attempts, op.kind, op.step) == ("ACCEPTED", 1, "email.send", "send")
    assert op.provider == "sim-idempotent"
    assert op.request == EMAIL
    assert op.request_digest == request_digest(EMAIL)
    assert event_kinds(op) == ["intend", "accept"]
    [message] = sim.messages()
    assert message["idempotency_key"] == message["client_reference"] == op.intent_key
    assert op.receipt.how == "direct"
    assert op.receipt.provider_reference == message["id"]
    assert op.receipt.evidence["status_code"] == 201
    assert op.receipt.evidence["headers"]["Request-Id"].startswith("req_")
    assert job().state == "DONE"
    assert result == {"operation": str(op.id), "provider": "sim-idempotent",
                      "provider_reference": message["id"], "receipt": "direct"}


def test_timeout_after_acceptance_is_unknown_and_the_retry_reconciles_by_lookup(store, start_sim, provider):
    sim = start_sim("idempotent", stall_after_accept=2)
    provider(sim, read_timeout=0.3)
    enqueue_email(store)

    first = attempt(store)

    assert isinstance(first, TransientError)
    assert operation().state == "UNKNOWN"
    assert job().state == "READY"
    assert "outcome unknown" in job().last_error

    attempt(store)

    op = operation()
    assert len(sim.messages()) == 1
    assert (op.state, op.attempts, op.receipt.how) == ("ACCEPTED", 1, "lookup")
    assert job().state == "DONE"


def test_provider_with_only_idempotency_keys_reconciles_by_resending_the_same_key(store, start_sim, provider):
    sim = start_sim("idempotent", stall_after_accept=0.8)
    provider(sim, read_timeout=0.3)
    key_only = HttpEmailConnector(sim.url, "test-key", Capabilities(idempotency_key=True, lookup=False),
                                  connect_timeout=1.0, read_timeout=0.3, name="keys-only")
    enqueue_email(store, provider="keys-only")

    with connector_registered("keys-only", lambda: key_only):
        assert isinstance(attempt(store), TransientError)
        # The provider answers 409 while the first request with this key is
        # still being answered; probing with the identical request is free
        # (afterwards it is a replay), so wait until that answer is over.
        op = operation()
        probe = {**op.request, "client_reference": op.intent_key}
        wait_for(lambda: raw_request(sim.url, "POST", "/v1/messages", body=probe,
                                     headers={"Idempotency-Key": op.intent_key}).status != 409,
                 what="the provider to finish answering the first request")
        attempt(store)

    op = operation()
    assert len(sim.messages()) == 1
    assert (op.state, op.attempts, op.receipt.how) == ("ACCEPTED", 2, "idempotent_replay")
    assert op.receipt.provider_reference == sim.messages()[0]["id"]
    assert "resend_same_key" in event_kinds(op)
    assert job().state == "DONE"


def test_a_500_is_unknown_and_the_retry_sends_with_the_same_idempotency_key(store, start_sim, provider):
    failing = start_sim("idempotent", error_rate=1.0)
    provider(failing)
    enqueue_email(store)

    assert isinstance(attempt(store), TransientError)
    assert operation().state == "UNKNOWN"
    failing.stop()
    healthy = start_sim("idempotent")  # the same provider, back from its outage
    provider(healthy)
    attempt(store)

    op = operation()
    [message] = healthy.messages()
    assert message["idempotency_key"] == op.intent_key
    assert (op.state, op.attempts, op.receipt.how) == ("ACCEPTED", 2, "direct")
    assert event_kinds(op) == ["intend", "unknown", "lookup_miss", "accept"]
    assert job().state == "DONE"


def test_lookup_only_provider_does_not_trust_a_miss_while_a_request_may_still_arrive(
    store, start_sim, provider, settings
):
    failing = start_sim("lookup", error_rate=1.0)
    provider(failing)
    enqueue_email(store, mode="lookup")
    assert isinstance(attempt(store), TransientError)
    failing.stop()
    healthy = start_sim("lookup")
    provider(healthy)

    too_soon = attempt(store)

    assert isinstance(too_soon, TransientError)
    assert "may still arrive" in str(too_soon)
    assert healthy.messages() == []
    assert job().next_attempt_at > timezone.now()

    settings.OPERATIONS_LOOKUP_SETTLE_SECONDS = 0
    attempt(store)
    assert len(healthy.messages()) == 1
    assert operation().receipt.how == "direct"


def test_bare_provider_timeout_needs_investigation_and_is_never_resent(store, start_sim, provider):
    sim = start_sim("bare", stall_after_accept=2)
    provider(sim, read_timeout=0.3)
    enqueue_email(store, mode="bare")

    outcome = attempt(store)

    assert isinstance(outcome, NeedsAttention)
    op = operation()
    assert op.state == "NEEDS_INVESTIGATION"
    assert job().state == "NEEDS_ATTENTION"
    assert "neither lookup nor idempotency keys" in job().last_error
    assert op.intent_key in job().last_error

    interventions.job_retry(tenant="studio", key="send-quote-017", reason="try again", actor="ops")
    again = attempt(store)

    assert isinstance(again, NeedsAttention)
    assert "under investigation" in str(again)
    assert len(sim.messages()) == 1
    assert operation().attempts == 1


def test_same_step_with_a_different_request_is_a_digest_mismatch_and_sends_nothing(store, start_sim, provider):
    failing = start_sim("idempotent", error_rate=1.0)
    provider(failing)
    enqueue_email(store)
    assert isinstance(attempt(store), TransientError)
    Job.objects.filter(key="send-quote-017").update(payload={**job().payload, "subject": "A different quote"})
    healthy = start_sim("idempotent", db_name="other.sqlite3")
    provider(healthy)

    outcome = attempt(store)

    assert isinstance(outcome, DigestMismatch)
    assert job().state == "NEEDS_ATTENTION"
    assert "different request" in job().last_error
    assert healthy.messages() == [] and failing.messages() == []
    assert "digest_mismatch" in event_kinds(operation())
    assert operation().attempts == 1


def test_401_pauses_the_connector_for_that_tenant_and_provider_until_an_operator_clears_it(
    store, start_sim, provider
):
    refusing = start_sim("idempotent", reject_auth=True)
    provider(refusing)
    enqueue_email(store, "q-1")
    enqueue_email(store, "q-2")
    enqueue_email(store, "q-3", tenant="bakery")

    first = attempt(store, key="q-1")

    assert isinstance(first, AuthError)
    assert job(key="q-1").state == "NEEDS_ATTENTION"
    assert operation("q-1").state == "FAILED"
    pause = ConnectorPause.objects.get(tenant="studio", provider="sim-idempotent", cleared_at=None)
    assert pause.status_code == 401

    second = attempt(store, key="q-2")

    assert isinstance(second, ConnectorPaused)
    assert "paused for tenant studio since" in str(second)
    assert "by HTTP 401" in str(second) and "an operator must" in str(second).lower()
    assert job(key="q-2").state == "NEEDS_ATTENTION"
    assert not Operation.objects.filter(job__key="q-2").exists()  # nothing was even intended

    # Another tenant's credentials are not this tenant's: it still dispatches.
    assert isinstance(attempt(store, "bakery", "q-3"), AuthError)
    assert operation("q-3", "bakery").attempts == 1

    connector_pause_clear(tenant="studio", provider="sim-idempotent", actor="ops", reason="key rotated")
    healthy = start_sim("idempotent", db_name="healthy.sqlite3")
    provider(healthy)
    interventions.job_retry(tenant="studio", key="q-2", reason="credentials fixed", actor="ops")
    attempt(store, key="q-2")

    assert job(key="q-2").state == "DONE"
    assert len(healthy.messages()) == 1
    assert refusing.messages() == []


def test_422_validation_rejects_the_operation_and_sends_the_job_to_review(store, start_sim, provider):
    sim = start_sim("idempotent")
    provider(sim)
    enqueue_email(store, to="not-an-address")

    outcome = attempt(store)

    assert isinstance(outcome, PermanentError)
    assert operation().state == "REJECTED"
    assert job().state == "WAITING_REVIEW"
    assert "'to' must be an email address" in job().wait_reason
    assert sim.messages() == []


def test_429_retries_after_the_providers_retry_after_then_sends(store, start_sim, provider):
    throttling = start_sim("idempotent", throttle_rate=1.0, retry_after=7)
    provider(throttling)
    enqueue_email(store)

    before = timezone.now()
    outcome = attempt(store)

    assert isinstance(outcome, TransientError) and outcome.retry_after == 7
    assert operation().state == "FAILED"
    delay = job().next_attempt_at - before
    assert timedelta(seconds=6) < delay < timedelta(seconds=9)
    assert job().state == "READY"

    healthy = start_sim("idempotent", db_name="healthy.sqlite3")
    provider(healthy)
    attempt(store)
    op = operation()
    assert (op.state, op.attempts, op.receipt.how) == ("ACCEPTED", 2, "direct")
    assert "lookup_miss" not in event_kinds(op)  # the provider said it did not accept: no need to ask
    assert len(healthy.messages()) == 1


def test_unreachable_provider_fails_the_attempt_without_doubt(store, provider, refused_url):
    provider(refused_url)
    enqueue_email(store)

    outcome = attempt(store)

    assert isinstance(outcome, TransientError)
    assert operation().state == "FAILED"
    assert job().state == "READY"


def test_an_accepted_operation_is_not_sent_again_by_the_next_lease_holder(store, start_sim, provider,
                                                                          refused_url):
    sim = start_sim("idempotent")
    provider(sim)
    enqueue_email(store)
    store.claim("studio", "send-quote-017", "w1", ttl=60)
    ctx = JobContext(job=job(), worker_id="w1", store=store)
    operation_perform(ctx, step="send", provider="sim-idempotent", request=EMAIL)
    # w1 dies before finishing the job; its lease runs out and w2 takes over.
    Job.objects.filter(key="send-quote-017").update(lease_until=timezone.now() - timedelta(seconds=1))
    provider(refused_url)  # any I/O now would fail: none must happen

    result = attempt(store, worker="w2")

    assert result["receipt"] == "direct"
    assert job().state == "DONE"
    assert len(sim.messages()) == 1


def test_a_fenced_out_worker_cannot_record_an_intent_or_send(store, start_sim, provider):
    sim = start_sim("idempotent")
    provider(sim)
    enqueue_email(store)
    store.claim("studio", "send-quote-017", "w1", ttl=60)
    stale = JobContext(job=job(), worker_id="w1", store=store)
    Job.objects.filter(key="send-quote-017").update(lease_until=timezone.now() - timedelta(seconds=1))
    assert store.claim("studio", "send-quote-017", "w2", ttl=60) == 2

    with pytest.raises(Conflict):
        operation_perform(stale, step="send", provider="sim-idempotent", request=EMAIL)

    assert not Operation.objects.exists()
    assert sim.messages() == []


def test_a_malformed_payload_goes_to_review_without_an_intent(store):
    store.enqueue("studio", "send-quote-017", action="connectors.send_email", payload={"subject": "no recipient"})

    outcome = attempt(store)

    assert isinstance(outcome, PermanentError)
    assert job().state == "WAITING_REVIEW"
    assert not Operation.objects.exists()
