"""Store.enqueue records who asked for the work and why, and can create a job
that waits for a reviewer before it may run (contract C1)."""

import pytest

from jobs.models import Job

pytestmark = pytest.mark.django_db


def test_a_job_enqueued_for_review_cannot_run_until_a_reviewer_resumes_it(store):
    job = store.enqueue("studio", "k1", action="jobs.noop", actor="agent:rules", reason="looks overdue",
                        detail={"proposal": {"id": 7}}, review="proposed by agent:rules: looks overdue")
    assert (job.state, job.wait_reason) == ("WAITING_REVIEW", "proposed by agent:rules: looks overdue")
    created = job.events.get()
    assert (created.kind, created.to_state, created.actor, created.reason) == (
        "enqueue", "WAITING_REVIEW", "agent:rules", "looks overdue")
    assert created.detail == {"proposal": {"id": 7}, "action": "jobs.noop"}
    assert store.claim_next("w1") is None

    store.resume("studio", "k1", reason="approved", actor="reviewer")
    assert store.claim_next("w1").key == "k1"


def test_enqueue_without_review_is_ready_and_a_repeat_changes_nothing(store):
    first = store.enqueue("studio", "k2", reason="first")
    again = store.enqueue("studio", "k2", reason="second", review="would wait")
    assert first.pk == again.pk
    assert Job.objects.get(pk=first.pk).state == "READY"
    assert list(first.events.values_list("reason", flat=True)) == ["first"]
