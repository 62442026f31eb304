"""A review's clock over a job's life: every stay in review has its own due
time and escalations, whatever path brought the job there (a proposal, a
worker's permanent error); an escalation of an earlier stay never touches a
later one; an escalation that runs again changes nothing; and an overdue
time is never earlier than the stay it belongs to."""

from datetime import UTC, datetime, timedelta

import pytest

from company.models import Tenant
from company.review_policy import review_policy_set
from jobs.actions import JobContext
from jobs.models import Job, JobEvent, ReviewDeadline, Timer
from jobs.store import Store
from jobs.timers import timer_fire_due
from review.decisions import DecisionRefused, timer_reschedule
from review.due import SUBJECT
from review.escalation import review_escalate

from .conftest import newest_event
from . import test_review_policy as policy_tests
from .test_review_policy import EMAIL, HOUR, T0, approve, pending, proposed, run_escalations

pytestmark = pytest.mark.django_db
rosa = policy_tests.rosa  # a reviewer of studio with an email address


def back_to_review(job, *, at) -> Job:
    """A worker runs the approved job and the provider refuses it for good: back in review."""
    store = Store()
    epoch = store.claim(job.tenant, job.key, "w1", now=at)
    store.fail(job.tenant, job.key, "w1", epoch, error="the provider rejected the address", failure="permanent",
               now=at)
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"
    return job


def told(job) -> list[str]:
    return sorted(Job.objects.filter(action="company.notify_reviewer", payload__job_id=job.pk)
                  .values_list("key", flat=True))


def test_a_job_a_worker_sends_to_review_is_due_and_escalated(people, rosa):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=HOUR)
    Store().enqueue("studio", "mail-1", action="connectors.send_email", payload=dict(EMAIL), now=T0)
    job = back_to_review(Job.objects.get(tenant="studio", key="mail-1"), at=T0)

    deadline = ReviewDeadline.objects.get(job=job)
    assert deadline.entered_at == T0 and deadline.due_at == T0 + HOUR
    assert [t.scheduled_for for t in pending(job)] == [T0 + HOUR]
    [outcome] = run_escalations(T0 + HOUR)
    assert outcome["overdue"] == "mail-1" and len(told(job)) == 1


def test_a_second_stay_in_review_is_marked_overdue_told_and_rejected(people, rosa):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=HOUR, reject_after=HOUR)
    job = proposed(at=T0)
    run_escalations(T0 + HOUR)  # the first stay went overdue …
    approve(job, rosa)  # … and was approved before the policy rejected it
    first_told = told(job)
    assert len(first_told) == 1

    stay = T0 + 5 * HOUR
    job = back_to_review(job, at=stay)
    deadline = ReviewDeadline.objects.get(job=job)
    assert deadline.entered_at == stay and deadline.overdue_at is None

    [outcome] = run_escalations(stay + HOUR)
    assert outcome["overdue"] == "q-1"
    assert ReviewDeadline.objects.get(job=job).overdue_at == stay + HOUR
    assert len(told(job)) == 2, "the reviewers are told about the second stay too"

    [outcome] = run_escalations(stay + 2 * HOUR)
    job.refresh_from_db()
    assert outcome == {"rejected": "q-1"} and job.state == "CANCELLED"


def test_a_stale_reject_escalation_of_an_earlier_stay_does_nothing(people, rosa):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=HOUR, reject_after=HOUR)
    job = proposed(at=T0)
    run_escalations(T0 + HOUR)
    timer_fire_due(now=T0 + 2 * HOUR)  # the reject escalation is enqueued, no worker has run it yet
    approve(job, rosa)
    job = back_to_review(job, at=T0 + 2 * HOUR)

    outcomes = run_escalations(T0 + 2 * HOUR + timedelta(minutes=1))
    assert outcomes == [{"skipped": "the review ended or its clock restarted"}]
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"
    assert ReviewDeadline.objects.get(job=job).overdue_at is None


def test_an_overdue_step_run_again_marks_and_tells_once(people, rosa):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=HOUR)
    job = proposed(at=T0)
    timer_fire_due(now=T0 + HOUR)
    store = Store()
    escalation = store.claim_next("test-worker", actions=["jobs.review_escalate"], ttl=60)
    first = review_escalate(JobContext(job=escalation, worker_id="test-worker", store=store))
    again = review_escalate(JobContext(job=escalation, worker_id="test-worker", store=store))
    assert first["overdue"] == "q-1" and again == first
    assert JobEvent.objects.filter(job=job, kind="overdue").count() == 1
    assert len(told(job)) == 1


def test_an_overdue_step_whose_telling_failed_tells_when_retried(people, rosa, monkeypatch):
    from review import escalation as module

    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=HOUR)
    job = proposed(at=T0)
    timer_fire_due(now=T0 + HOUR)
    store = Store()
    escalation = store.claim_next("test-worker", actions=["jobs.review_escalate"], ttl=60)
    def broken(**_):
        raise ConnectionError("the database went away")

    monkeypatch.setattr(module, "_notifiers", [broken, *module._notifiers])
    with pytest.raises(ConnectionError):
        review_escalate(JobContext(job=escalation, worker_id="test-worker", store=store))
    monkeypatch.setattr(module, "_notifiers", module._notifiers[1:])
    assert review_escalate(JobContext(job=escalation, worker_id="test-worker", store=store))["overdue"] == "q-1"
    assert JobEvent.objects.filter(job=job, kind="overdue").count() == 1
    assert len(told(job)) == 1


def test_a_timer_cannot_be_rescheduled_into_the_past(people):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=HOUR)
    job = proposed(at=datetime.now(UTC))
    [timer] = pending(job)
    with pytest.raises(DecisionRefused, match="passed"):
        timer_reschedule(job_id=job.pk, timer_id=timer.pk, user=people["operator"], note="sooner",
                         seen_event=newest_event(job), scheduled_for=datetime(2020, 1, 1, tzinfo=UTC))
    timer.refresh_from_db()
    assert timer.state == "PENDING" and timer.scheduled_for == ReviewDeadline.objects.get(job=job).due_at


def test_an_overdue_time_is_never_before_the_stay_began(people):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=HOUR, reject_after=HOUR)
    job = proposed(at=T0)
    # A timer moved behind the service's back (the admin, a script) still fires at its moved time.
    Timer.objects.filter(subject_type=SUBJECT, subject_id=str(job.pk)).update(
        scheduled_for=datetime(2020, 1, 1, tzinfo=UTC))
    [outcome] = run_escalations(T0)
    deadline = ReviewDeadline.objects.get(job=job)
    assert outcome["overdue"] == "q-1"
    assert deadline.overdue_at == T0 and deadline.reject_at == T0 + HOUR
