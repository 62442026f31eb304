"""A lost commit (an asynchronous replica promoted after the primary crashed)
forgets that an email was sent: the operation and its receipt are gone and
the job is READY again. The job runs again and records the same intent
again: its idempotency key and client reference are derived from the
obligation, so the provider sees the same message. Run on both databases."""

import pytest

from jobs.models import Job, JobEvent
from operations.models import Operation, OperationEvent, Receipt

from .support import EMAIL, attempt, enqueue_email, job

pytestmark = pytest.mark.django_db


def lose_the_commits_since_enqueue() -> None:
    """What the promoted replica holds: the job as enqueued, nothing of its run."""
    operations = Operation.objects.filter(job__tenant="studio", job__key="send-quote-017")
    Receipt.objects.filter(operation__in=operations).delete()
    OperationEvent.objects.filter(operation__in=operations).delete()
    operations.delete()
    enqueued = job()
    JobEvent.objects.filter(job_id=enqueued.pk).exclude(kind="enqueue").delete()
    Job.objects.filter(pk=enqueued.pk).update(state="READY", attempts=0, result=None, finished_at=None,
                                              worker_id="", next_attempt_at=None, last_error="")


def sent_twice_after_a_lost_commit(store, sim, provider, mode):
    provider(sim)
    enqueue_email(store, mode=mode)
    attempt(store)
    assert job().state == "DONE"
    first_key = Operation.objects.get().intent_key

    lose_the_commits_since_enqueue()
    attempt(store)

    assert job().state == "DONE"
    operation = Operation.objects.get()
    assert operation.intent_key == first_key
    return operation


def test_an_email_sent_again_after_a_lost_commit_reaches_an_idempotent_provider_as_one_message(
    store, start_sim, provider
):
    sim = start_sim("idempotent")
    operation = sent_twice_after_a_lost_commit(store, sim, provider, "idempotent")

    [message] = sim.messages()
    assert message["idempotency_key"] == message["client_reference"] == operation.intent_key
    assert message["subject"] == EMAIL["subject"]
    assert operation.receipt.how == "idempotent_replay"
    assert operation.receipt.provider_reference == message["id"]


def test_a_lookup_only_provider_asked_before_a_first_send_finds_the_message_the_lost_commit_forgot(
    store, start_sim, provider, settings
):
    settings.OPERATIONS_LOOKUP_BEFORE_FIRST_SEND = ["sim-lookup"]
    sim = start_sim("lookup")
    operation = sent_twice_after_a_lost_commit(store, sim, provider, "lookup")

    [message] = sim.messages()
    assert operation.receipt.how == "lookup"
    assert operation.receipt.provider_reference == message["id"]
    assert [e.kind for e in operation.events.all()] == ["intend", "accept"]


def test_a_lookup_only_provider_not_asked_before_a_first_send_gets_the_message_twice(store, start_sim, provider):
    """What the docs warn of: without the lookup (or synchronous replication),
    a provider that cannot deduplicate holds the message twice."""
    sim = start_sim("lookup")
    sent_twice_after_a_lost_commit(store, sim, provider, "lookup")

    assert len(sim.messages()) == 2
