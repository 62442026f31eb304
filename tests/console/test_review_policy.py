"""The tenant's review policy in the single decision path:
four eyes, the proposer never approving their own proposal, due times whose
durable timers mark an item overdue and then reject it, with the clock
advanced — and every decision ending the review's timers."""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group

from company.models import Tenant
from company.review_policy import review_policy_set
from jobs.models import Job, ReviewDeadline, Timer
from jobs.store import Store
from jobs.timers import timer_fire_due
from review.decisions import job_approve, job_correct_and_approve, job_reject
from review.due import SUBJECT
from tests.company.support import run_one
from tests.factories import MembershipFactory

from .conftest import newest_event

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
EMAIL = {"to": "ada@example.com", "subject": "Your quote", "body": "Hello"}
HOUR = timedelta(hours=1)


@pytest.fixture
def rosa(tenants):
    return MembershipFactory(user__username="rosa", user__email="rosa@example.com",
                             user__groups=[Group.objects.get(name="reviewers")], tenant=tenants[0]).user


def proposed(key="q-1", *, by="agent:rules", action="connectors.send_email", at=T0) -> Job:
    """A proposal waiting for review since `at` (as `company.proposal_submit` creates one)."""
    job, _ = Store().enqueue_once("studio", key, action=action, payload=dict(EMAIL), actor=by, review=f"proposed by {by}",
                                  detail={"proposal": {"proposed_by": by, "rationale": "send it"}}, now=at)
    return job


def approve(job, user, note="looks right"):
    return job_approve(job_id=job.pk, user=user, note=note, seen_event=newest_event(job))


def pending(job):
    return list(Timer.objects.filter(subject_type=SUBJECT, subject_id=str(job.pk), state="PENDING")
                .order_by("scheduled_for"))


def run_escalations(at: datetime) -> list:
    """Fire the timers due at `at` and run the escalation jobs they enqueue, as a worker does."""
    timer_fire_due(now=at)
    store, outcomes = Store(), []
    while (claimed := store.claim_next("test-worker", actions=["jobs.review_escalate"], ttl=60)) is not None:
        outcomes.append(run_one(store, claimed))
    return outcomes


def test_four_eyes_needs_two_different_reviewers_and_refuses_the_same_one_twice(people, rosa):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), action="connectors.send_email", approvals=2)
    job = proposed()

    first = approve(job, people["reviewer"])
    assert first.state == "WAITING_REVIEW", "one approval of two does not release the effect"
    assert first.events.last().kind == "approval" and first.events.last().actor == "rita"

    with pytest.raises(job_approve.__globals__["DecisionRefused"], match="you approved this item already"):
        approve(first, people["reviewer"], note="again")
    first.refresh_from_db()
    assert first.state == "WAITING_REVIEW"

    second = approve(first, rosa)
    assert second.state == "READY"
    assert second.events.last().detail["approvals"] == ["rita", "rosa"]


def test_a_single_approval_policy_releases_at_the_first_approval(people):
    job = proposed()
    assert approve(job, people["reviewer"]).state == "READY"


def test_the_proposer_never_approves_their_own_proposal_even_corrected(people, rosa):
    job = proposed(by="rita")
    with pytest.raises(Exception, match="you proposed this item"):
        approve(job, people["reviewer"])
    with pytest.raises(Exception, match="you proposed this item"):
        job_correct_and_approve(job_id=job.pk, user=people["reviewer"], note="fixed", seen_event=newest_event(job),
                                data={"correct-to": "b@example.com", "correct-subject": "S", "correct-body": "B"})
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"
    # They may still withdraw it, and another reviewer may approve it.
    assert approve(job, rosa).state == "READY"


def test_a_first_correction_is_the_first_approval_and_waits_for_a_second_person(people, rosa):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), approvals=2, due_after=HOUR)
    job = proposed()
    due_before = pending(job)[0].scheduled_for

    corrected = job_correct_and_approve(
        job_id=job.pk, user=people["reviewer"], note="right address", seen_event=newest_event(job),
        data={"correct-to": "right@example.com", "correct-subject": "Your quote", "correct-body": "Hello"})
    assert corrected.state == "WAITING_REVIEW" and corrected.payload["to"] == "right@example.com"
    assert [t.scheduled_for for t in pending(job)] == [due_before], "a correction does not reset the clock"
    with pytest.raises(Exception, match="you approved this item already"):
        approve(corrected, people["reviewer"])

    done = approve(corrected, rosa)
    assert done.state == "READY" and done.payload["to"] == "right@example.com"
    assert pending(job) == [] and ReviewDeadline.objects.get(job=job).due_at is None


def test_a_correction_restarts_the_clock_when_the_policy_says_so(people):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), approvals=2, due_after=HOUR,
                      reset_due_on_correction=True)
    job = proposed(at=T0)
    first = pending(job)[0]
    job_correct_and_approve(job_id=job.pk, user=people["reviewer"], note="right address",
                            seen_event=newest_event(job),
                            data={"correct-to": "right@example.com", "correct-subject": "S", "correct-body": "B"})
    first.refresh_from_db()
    assert first.state == "CANCELLED"
    deadline = ReviewDeadline.objects.get(job=job)
    assert deadline.round == 2 and [t.scheduled_for for t in pending(job)] == [deadline.due_at]


def test_an_overdue_review_is_marked_reviewers_are_told_then_the_policy_rejects_it(people, rosa):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=HOUR, reject_after=2 * HOUR)
    job = proposed(at=T0)
    assert ReviewDeadline.objects.get(job=job).due_at == T0 + HOUR

    assert run_escalations(T0 + HOUR - timedelta(seconds=1)) == []
    assert ReviewDeadline.objects.get(job=job).overdue_at is None

    [outcome] = run_escalations(T0 + HOUR)
    deadline = ReviewDeadline.objects.get(job=job)
    assert deadline.overdue_at == T0 + HOUR and deadline.reject_at == T0 + 3 * HOUR
    assert outcome["overdue"] == "q-1"
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW" and job.events.last().kind == "overdue"
    told = set(Job.objects.filter(action="company.notify_reviewer").values_list("key", flat=True))
    assert told == {f"review-overdue-{job.pk}-r1-u{rosa.pk}"}  # rita has no email address, rosa has

    assert run_escalations(T0 + 3 * HOUR - timedelta(seconds=1)) == []
    [outcome] = run_escalations(T0 + 3 * HOUR)
    job.refresh_from_db()
    assert outcome == {"rejected": "q-1"} and job.state == "CANCELLED"
    last = job.events.last()
    assert last.kind == "reject" and last.actor == "review policy" and "not decided in time" in last.reason
    assert pending(job) == [] and ReviewDeadline.objects.get(job=job).due_at is None


def test_a_decision_cancels_the_reviews_timers_and_a_late_timer_does_nothing(people):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=HOUR, reject_after=HOUR)
    job = proposed(at=T0)
    [timer] = pending(job)
    job_reject(job_id=job.pk, user=people["reviewer"], note="not now", seen_event=newest_event(job))
    timer.refresh_from_db()
    assert timer.state == "CANCELLED" and "review ended" in timer.outcome["reason"]
    assert run_escalations(T0 + 5 * HOUR) == []
    assert job.events.order_by("-id").first().kind == "reject"


def test_a_review_that_ended_before_its_escalation_ran_is_left_alone(people):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=HOUR)
    job = proposed(at=T0)
    timer_fire_due(now=T0 + HOUR)  # the escalation job is enqueued …
    approve(job, people["reviewer"])  # … and the reviewer decides before a worker runs it
    store = Store()
    escalation = store.claim_next("test-worker", actions=["jobs.review_escalate"], ttl=60)
    assert run_one(store, escalation) == {"skipped": "the review ended or its clock restarted"}
    job.refresh_from_db()
    assert job.state == "READY" and job.events.last().kind == "approve"


def test_the_review_policy_command_sets_terms_and_refuses_bad_periods(tenants):
    from django.core.management import CommandError, call_command

    from company.models import ReviewPolicy, TenantPolicy

    call_command("review_policy", "--tenant", "studio", "--action", "connectors.send_email", "--approvals", "2",
                 "--due-after", "PT4H", "--reject-after", "1 00:00:00", "--digest-every", "off")
    policy = ReviewPolicy.objects.get(tenant__slug="studio", action="connectors.send_email")
    assert (policy.approvals, policy.due_after, policy.reject_after) == (2, 4 * HOUR, 24 * HOUR)
    assert TenantPolicy.objects.get(tenant__slug="studio").review_digest_every is None
    with pytest.raises(CommandError, match="is not a period"):
        call_command("review_policy", "--tenant", "studio", "--due-after", "soon")
    with pytest.raises(CommandError, match="no tenant"):
        call_command("review_policy", "--tenant", "nowhere")
