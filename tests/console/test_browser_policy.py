"""The review policy in a real Chromium: four eyes — the first
approval is recorded and shown, the same person's second approval is refused
with a clear message, another reviewer's releases it — and an overdue
escalation with the clock advanced, seen in the queue and on the page.

Set CONSOLE_SCREENSHOTS=<dir> to keep screenshots."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from company.models import Tenant
from company.review_policy import review_policy_set
from jobs.models import Job
from jobs.store import Store
from tests.factories import MembershipFactory

from .conftest import CHROMIUM, decide_in_form, shot
from .test_review_policy import run_escalations

pytestmark = [pytest.mark.browser, pytest.mark.skipif(not __import__("pathlib").Path(CHROMIUM).exists(),
                                                      reason="needs Debian's chromium")]
HOUR = timedelta(hours=1)


def proposal(key, *, at=None):
    job, _ = Store().enqueue_once("studio", key, action="jobs.noop", actor="agent:rules",
                                  review="proposed by agent:rules: send it",
                                  detail={"proposal": {"proposed_by": "agent:rules", "rationale": "send it"}}, now=at)
    return job


@pytest.mark.django_db(transaction=True)
def test_four_eyes_the_same_reviewer_cannot_approve_twice_another_releases_it(sign_in, people, tenants):
    rosa = MembershipFactory(user__username="rosa", user__groups=[Group.objects.get(name="reviewers")],
                             tenant=tenants[0]).user
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), action="jobs.noop", approvals=2)
    job = proposal("four-eyes-1")

    page = sign_in(people["reviewer"])
    page.get_by_role("link", name="1 waiting for your review").click()
    page.get_by_role("link", name="four-eyes-1").click()
    page.get_by_text("This action needs 2 approvals by different people; none yet.").wait_for()
    decide_in_form(page, "Approve", "amount matches the order")
    page.get_by_text("your approval of studio/four-eyes-1 is recorded; it waits for a second reviewer's").wait_for()

    page.get_by_role("link", name="four-eyes-1").click()
    page.locator("#four-eyes").get_by_text("rita").wait_for()
    assert "approved first" in page.locator("#four-eyes").inner_text()
    shot(page, "four-eyes-first-approval")
    decide_in_form(page, "Approve", "approving again")
    page.get_by_text("Approve refused: you approved this item already").wait_for()
    job.refresh_from_db()
    assert job.state == "WAITING_REVIEW"

    other = sign_in(rosa)
    other.goto(page.url.split("/admin/")[0] + f"/admin/console/jobs/{job.pk}/")
    other.locator("#four-eyes").get_by_text("rita").wait_for()
    decide_in_form(other, "Approve", "second pair of eyes")
    other.get_by_text("Approve: studio/four-eyes-1 is now READY").wait_for()
    job.refresh_from_db()
    assert job.state == "READY"
    assert job.events.last().detail["approvals"] == ["rita", "rosa"]


@pytest.mark.django_db(transaction=True)
def test_an_overdue_item_is_marked_in_the_queue_and_then_rejected_by_the_policy(sign_in, people, live_server):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), due_after=HOUR, reject_after=HOUR)
    entered = timezone.now()
    job = proposal("late-1", at=entered)

    page = sign_in(people["reviewer"])
    page.goto(f"{live_server.url}/admin/console/review/")
    row = page.get_by_role("row", name="late-1")
    assert "Overdue" not in row.inner_text()
    page.get_by_role("link", name="late-1").click()
    page.locator("#due").wait_for()

    # The clock advanced past the due time: the engine's timer fires and the escalation runs.
    [outcome] = run_escalations(entered + HOUR + timedelta(seconds=1))
    assert outcome["overdue"] == "late-1"
    page.goto(f"{live_server.url}/admin/console/review/")
    page.get_by_role("row", name="late-1").get_by_text("Overdue").wait_for()
    page.get_by_role("link", name="late-1").click()
    overdue = page.locator("#overdue")
    overdue.wait_for()
    assert "the review policy rejects it at" in overdue.inner_text()
    shot(page, "review-overdue")

    [outcome] = run_escalations(entered + 2 * HOUR + timedelta(seconds=2))
    assert outcome == {"rejected": "late-1"}
    page.reload()
    page.get_by_text("rejected by the review policy: not decided in time").first.wait_for()
    job.refresh_from_db()
    assert job.state == "CANCELLED" and job.events.last().actor == "review policy"
    assert not Job.objects.filter(state="WAITING_REVIEW").exists()
