"""A consumer failure whose message the database cannot store is still
recorded, escaped, as a failed delivery: whatever a consumer raises, the
relay records it and retries, as the worker does with whatever a handler
raises (test_worker_survives_any_outcome.py)."""

import pytest
from django.db import transaction

from jobs.models import OutboxEvent
from jobs.outbox import outbox_consumer, outbox_emit, outbox_relay

pytestmark = pytest.mark.django_db(transaction=True)


@outbox_consumer("test.nul_error")
def refuse_with_a_nul(event) -> None:
    raise ValueError("cannot parse 'a\x00b'")


def test_a_consumer_error_with_a_nul_byte_is_recorded_escaped_and_retried():
    with transaction.atomic():
        outbox_emit(tenant="studio", aggregate_type="invoice", aggregate_id=1, event_type="test.nul_error")
    # One delivery (limit=1): the retry's full-jitter backoff can be a few
    # milliseconds, and an unbounded call would then rightly deliver it again.
    outbox_relay(limit=1)
    event = OutboxEvent.objects.get()
    assert (event.state, event.attempts) == ("PENDING", 1)
    assert "cannot parse 'a\\x00b'" in event.last_error
