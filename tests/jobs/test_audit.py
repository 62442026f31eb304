"""The consistency audit files what no machine will fix, once, with evidence."""

import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from jobs import interventions
from jobs.audit import consistency_audit
from jobs.models import Job
from operations.models import Operation, OperationState
from tests.factories import OperationFactory, OutboxEventFactory, TimerFactory

pytestmark = pytest.mark.django_db


def unknown_operation(store, key, *, hours_ago):
    job = store.enqueue("studio", key)
    op = OperationFactory(job=job, provider="sim-idempotent", state=OperationState.UNKNOWN, attempts=1,
                          last_error="read timeout")
    Operation.objects.filter(pk=op.pk).update(updated_at=timezone.now() - timedelta(hours=hours_ago))
    return op


def test_the_audit_files_a_stale_lease_and_an_old_unknown_operation_once_with_evidence(store, capsys):
    store.enqueue("studio", "send-quote-7")
    store.claim("studio", "send-quote-7", "host:1:dead", now=time.time() - 3600, ttl=30)
    store.enqueue("studio", "fresh-lease")
    store.claim("studio", "fresh-lease", "host:2:alive", ttl=30)
    old = unknown_operation(store, "send-invoice-9", hours_ago=30)  # past sim-idempotent's 24 h
    unknown_operation(store, "send-invoice-10", hours_ago=2)  # still reconcilable

    report = consistency_audit()

    assert report.filed == {"stale-lease": 1, "unknown-operation": 1}
    stale = Job.objects.get(key__startswith="audit-stale-lease-")
    assert stale.state == "NEEDS_ATTENTION" and stale.action == "jobs.audit_finding" and stale.tenant == "studio"
    assert stale.payload["evidence"]["job"] == "studio/send-quote-7"
    assert stale.payload["evidence"]["worker_id"] == "host:1:dead"
    assert stale.payload["evidence"]["expired_for_seconds"] >= 3000
    escalation = stale.events.get(kind="escalate")
    assert escalation.actor == "audit" and "send-quote-7" in escalation.reason
    assert escalation.detail["evidence"]["lease_epoch"] == 1
    item = Job.objects.get(key=f"audit-unknown-operation-{old.pk}")
    assert item.state == "NEEDS_ATTENTION"
    assert item.payload["evidence"]["job"] == "studio/send-invoice-9"
    assert item.payload["evidence"]["provider_retention_seconds"] == 86400

    again = consistency_audit()
    assert again.filed == {} and again.already_filed == {"stale-lease": 1, "unknown-operation": 1}
    assert Job.objects.filter(action="jobs.audit_finding").count() == 2

    # The command runs the same audit and says what it found.
    call_command("audit")
    assert "already filed" in capsys.readouterr().out


def test_the_audit_files_quarantined_outbox_events_and_long_overdue_timers(store):
    now = timezone.now()
    event = OutboxEventFactory(aggregate_id="17", event_type="quote.accepted", state="QUARANTINED", attempts=10,
                               last_error="consumer crashed", created_at=now)
    overdue = TimerFactory(scheduled_for=now - timedelta(hours=3), reason="invoice reminder", job_key="remind-42",
                           created_at=now - timedelta(days=1))
    TimerFactory(scheduled_for=now - timedelta(minutes=1), reason="just due", created_at=now)

    report = consistency_audit()

    assert report.filed == {"quarantined-outbox": 1, "overdue-timer": 1}
    outbox_item = Job.objects.get(key=f"audit-quarantined-outbox-{event.pk}")
    assert outbox_item.payload["evidence"]["last_error"] == "consumer crashed"
    timer_item = Job.objects.get(key=f"audit-overdue-timer-{overdue.pk}")
    assert timer_item.payload["evidence"]["job"] == "remind-42"
    assert consistency_audit().filed == {}


def test_retrying_an_audit_item_rechecks_its_condition(store):
    from jobs.actions import JobContext, get_action
    from jobs.errors import NeedsAttention

    op = unknown_operation(store, "send-invoice-9", hours_ago=30)
    consistency_audit()
    key = f"audit-unknown-operation-{op.pk}"
    handler = get_action("jobs.audit_finding").handler

    def attempt():
        interventions.job_retry(tenant="studio", key=key, reason="looked at it", actor="op")
        store.claim("studio", key, "w1")
        return handler(JobContext(job=Job.objects.get(key=key), worker_id="w1", store=store))

    with pytest.raises(NeedsAttention, match="still found"):
        attempt()
    store.fail_with("studio", key, "w1", Job.objects.get(key=key).lease_epoch, NeedsAttention("still found"))
    Operation.objects.filter(pk=op.pk).update(state=OperationState.ACCEPTED)
    assert attempt() == {"condition_gone": True}
