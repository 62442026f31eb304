"""Which approvals count under a two-approver policy: those of the payload
that is released (a correction restarts them, the corrector being the first
of the new payload), of the job's current stay in review (a job sent back to
review starts from none), and of people who still hold the reviewer role in
the job's tenant."""

import pytest
from django.contrib.auth.models import Group

from company.models import Membership, Tenant
from company.review_policy import review_policy_set
from jobs import interventions
from jobs.models import Job
from jobs.store import Store
from review.decisions import approvals_so_far, job_approve, job_correct_and_approve
from tests.factories import MembershipFactory

from .conftest import newest_event
from .test_review_policy import EMAIL, proposed

pytestmark = pytest.mark.django_db


def reviewer(name, tenants):
    return MembershipFactory(user__username=name, user__groups=[Group.objects.get(name="reviewers")],
                             tenant=tenants[0]).user


@pytest.fixture
def two_of(tenants):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), action="connectors.send_email", approvals=2)
    return reviewer("rosa", tenants), reviewer("ruth", tenants)


def approve(job, user, note="looks right"):
    return job_approve(job_id=job.pk, user=user, note=note, seen_event=newest_event(job))


def correct(job, user, to):
    return job_correct_and_approve(job_id=job.pk, user=user, note="right address", seen_event=newest_event(job),
                                   data={"correct-to": to, "correct-subject": EMAIL["subject"],
                                         "correct-body": EMAIL["body"]})


def released_by(job) -> list[str]:
    """Who the history says approved the release (its approve/correct row)."""
    event = job.events.filter(to_state="READY").order_by("-id").first()
    return event.detail["approvals"]


def test_the_second_approvers_correction_is_a_first_approval_of_the_new_payload(people, two_of):
    rosa, _ = two_of
    job = approve(proposed(), people["reviewer"])
    assert job.state == "WAITING_REVIEW"

    corrected = correct(job, rosa, "right@example.com")
    assert corrected.state == "WAITING_REVIEW", "nobody but the corrector saw the corrected payload"
    assert corrected.payload["to"] == "right@example.com"
    assert [e.actor for e in approvals_so_far(corrected)] == ["rosa"]
    assert corrected.events.order_by("-id").first().detail["approvals"] == ["rosa"]
    with pytest.raises(Exception, match="you approved this item already"):
        approve(corrected, rosa)

    # The first approver sees the corrected payload now and approves it: two people saw what goes out.
    done = approve(corrected, people["reviewer"], note="the new address is right")
    assert done.state == "READY" and done.payload["to"] == "right@example.com"
    assert released_by(done) == ["rosa", "rita"]


def test_a_correction_of_a_corrected_payload_restarts_again(people, two_of):
    rosa, ruth = two_of
    job = correct(proposed(), people["reviewer"], "one@example.com")
    job = correct(job, rosa, "two@example.com")
    assert job.state == "WAITING_REVIEW"
    done = approve(job, ruth)
    assert done.state == "READY" and done.payload["to"] == "two@example.com"
    assert released_by(done) == ["rosa", "ruth"]


def test_under_one_approval_a_correction_releases_at_once(people):
    done = correct(proposed(), people["reviewer"], "right@example.com")
    assert done.state == "READY" and released_by(done) == ["rita"]


def back_in_review(job) -> Job:
    """The job leaves review without a release and comes back to it: an
    operator sends it on, its attempt fails permanently (a worker's way into review)."""
    interventions.job_escalate(tenant=job.tenant, key=job.key, reason="check the account", actor="otto")
    interventions.job_retry(tenant=job.tenant, key=job.key, reason="account fixed", actor="otto")
    store = Store()
    epoch = store.claim(job.tenant, job.key, "w1")
    store.fail(job.tenant, job.key, "w1", epoch, error="the provider refused the address", failure="permanent")
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"
    return job


def test_a_first_approval_of_an_earlier_stay_does_not_count_in_the_next(people, two_of):
    rosa, _ = two_of
    job = back_in_review(approve(proposed(), people["reviewer"]))
    assert approvals_so_far(job) == []

    second_stay = approve(job, rosa)
    assert second_stay.state == "WAITING_REVIEW", "rita's approval was of the earlier stay"
    # rita may approve again in this stay: her earlier approval is not one of it.
    done = approve(second_stay, people["reviewer"])
    assert done.state == "READY" and released_by(done) == ["rosa", "rita"]


def test_a_first_approval_of_a_released_stay_does_not_count_when_the_job_returns(people, two_of):
    rosa, ruth = two_of
    job = approve(approve(proposed(), people["reviewer"]), rosa)
    assert job.state == "READY"
    store = Store()
    epoch = store.claim(job.tenant, job.key, "w1")
    store.fail(job.tenant, job.key, "w1", epoch, error="the provider refused the address", failure="permanent")
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW" and approvals_so_far(job) == []
    assert approve(job, ruth).state == "WAITING_REVIEW"


def test_a_revoked_reviewers_approval_does_not_count(people, two_of):
    rosa, ruth = two_of
    job = approve(proposed(), rosa)
    Membership.objects.filter(user=rosa).update(role=Membership.Role.VIEWER)
    assert approvals_so_far(job) == [], "rosa no longer reviews for the tenant"

    still = approve(job, people["reviewer"])
    assert still.state == "WAITING_REVIEW", "one approval that counts of two"
    assert still.events.order_by("-id").first().detail["approvals"] == ["rita"]
    done = approve(still, ruth)
    assert done.state == "READY" and released_by(done) == ["rita", "ruth"]


def test_a_deleted_or_deactivated_reviewers_approval_does_not_count(people, two_of):
    rosa, ruth = two_of
    job = approve(proposed(), rosa)
    type(rosa).objects.filter(pk=rosa.pk).update(is_active=False)
    assert approvals_so_far(job) == []
    job = approve(job, ruth)
    ruth.delete()
    assert approvals_so_far(job) == []
