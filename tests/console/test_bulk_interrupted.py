"""A bulk decision records what really happened to each item: cut off
half-way (a database error on one item, or the request killed), its batch
says which items were decided and may be taken again for the rest; under
four eyes, a first approval is reported as such, not as "decided"."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import OperationalError
from django.utils import timezone

from company.models import Tenant
from company.review_policy import review_policy_set
from jobs.access import DecisionRefused
from jobs.models import DecisionBatch, Job, JobEvent
from review import bulk, decisions
from tests.factories import MembershipFactory

from .test_review_policy import proposed

pytestmark = pytest.mark.django_db


class Killed(BaseException):
    """The request's process dies: nothing after it runs in the request."""


def three_items(people):
    jobs = [proposed(f"bulk-{n}") for n in range(3)]
    batch, _ = bulk.batch_preview(user=people["reviewer"], queue="WAITING_REVIEW",
                                  jobs=Job.objects.filter(tenant="studio", state="WAITING_REVIEW"), query={})
    return jobs, batch


@pytest.fixture
def cut_on_second(monkeypatch):
    """The bulk approve's second item fails with `error` (once)."""

    def install(error):
        calls = []
        real = decisions.job_approve

        def flaky(**kwargs):
            calls.append(kwargs["job_id"])
            if len(calls) == 2:
                raise error
            return real(**kwargs)

        monkeypatch.setitem(bulk.BULK_DECISIONS["WAITING_REVIEW"], "approve", flaky)
        return calls

    return install


def states(jobs):
    return [Job.objects.get(pk=j.pk).state for j in jobs]


def test_a_deadlock_on_the_second_item_leaves_a_batch_that_says_so_and_is_taken_again(client, people,
                                                                                     cut_on_second):
    jobs, batch = three_items(people)
    cut_on_second(OperationalError("deadlock detected"))

    taken = bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="all checked")

    assert states(jobs) == ["READY", "WAITING_REVIEW", "READY"]
    assert taken.status == DecisionBatch.Status.INTERRUPTED
    assert (taken.decided, taken.skipped, taken.refused, taken.unfinished) == (2, 0, 0, 1)
    assert taken.outcome[str(jobs[1].pk)].startswith("interrupted: deadlock detected")

    # Its page says so, and offers its user to take it again.
    client.force_login(people["reviewer"])
    page = client.get(f"/admin/console/batches/{batch.pk}/").content.decode()
    assert "<strong>1</strong> not decided" in page and "This batch was interrupted" in page
    assert "Approve the items left" in page
    client.force_login(people["operator"])
    assert "the items left" not in client.get(f"/admin/console/batches/{batch.pk}/").content.decode()
    client.force_login(people["reviewer"])
    response = client.post("/admin/console/review/bulk/", {"token": batch.token, "decision": "approve",
                                                           "note": "all checked"})
    assert response.status_code == 302
    again = DecisionBatch.objects.get(pk=batch.pk)
    assert states(jobs) == ["READY"] * 3
    assert again.status == DecisionBatch.Status.DONE
    assert (again.decided, again.skipped, again.refused, again.unfinished) == (3, 0, 0, 0)
    assert JobEvent.objects.filter(job__in=jobs, kind="approve", detail__batch=batch.pk).count() == 3
    with pytest.raises(DecisionRefused, match="already used"):
        bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="again")


def test_a_killed_request_leaves_the_decided_items_recorded_and_the_batch_takeable_once_it_stalled(
        people, cut_on_second):
    jobs, batch = three_items(people)
    cut_on_second(Killed())
    with pytest.raises(Killed):
        bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="all checked")

    batch.refresh_from_db()
    assert batch.status == DecisionBatch.Status.TAKING
    assert batch.outcome == {str(jobs[0].pk): "decided"}
    assert (batch.decided, batch.unfinished) == (1, 2)
    # While it may still be running, a second take is refused (a double click decides nothing twice).
    with pytest.raises(DecisionRefused, match="being taken"):
        bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="all checked")
    with pytest.raises(DecisionRefused, match="approve"):
        DecisionBatch.objects.filter(pk=batch.pk).update(progress_at=timezone.now() - 2 * bulk.BULK_STALE)
        bulk.batch_take(token=batch.token, user=people["reviewer"], decision="reject", note="changed my mind")

    again = bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="all checked")
    assert states(jobs) == ["READY"] * 3
    assert (again.status, again.decided, again.skipped) == (DecisionBatch.Status.DONE, 3, 0)


def test_an_item_decided_before_the_kill_recorded_it_is_reported_decided_not_moved(people, monkeypatch):
    jobs, batch = three_items(people)
    real = decisions.job_approve

    def decide_then_die(**kwargs):
        real(**kwargs)
        raise Killed()  # committed, but the batch never heard of it

    monkeypatch.setitem(bulk.BULK_DECISIONS["WAITING_REVIEW"], "approve", decide_then_die)
    with pytest.raises(Killed):
        bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="all checked")
    monkeypatch.setitem(bulk.BULK_DECISIONS["WAITING_REVIEW"], "approve", real)
    DecisionBatch.objects.filter(pk=batch.pk).update(progress_at=timezone.now() - timedelta(hours=1))

    again = bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="all checked")
    assert again.outcome[str(jobs[0].pk)] == "decided"
    assert (again.decided, again.skipped, again.refused) == (3, 0, 0)


def test_under_four_eyes_a_bulk_approve_reports_first_approvals_apart(client, people, tenants):
    review_policy_set(tenant=Tenant.objects.get(slug="studio"), action="connectors.send_email", approvals=2)
    jobs, batch = three_items(people)

    taken = bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="first look")
    assert states(jobs) == ["WAITING_REVIEW"] * 3
    assert (taken.decided, taken.first_approvals, taken.unfinished) == (0, 3, 0)
    assert set(taken.outcome.values()) == {"first approval recorded"}

    client.force_login(people["reviewer"])
    page = client.get(f"/admin/console/batches/{batch.pk}/").content.decode()
    assert "<strong>0</strong> decided, <strong>3</strong> first approvals recorded (still waiting for a second reviewer)" in page

    rosa = MembershipFactory(user__username="rosa", user__groups=[Group.objects.get(name="reviewers")],
                             tenant=tenants[0]).user
    second, _ = bulk.batch_preview(user=rosa, queue="WAITING_REVIEW",
                                   jobs=Job.objects.filter(tenant="studio", state="WAITING_REVIEW"), query={})
    released = bulk.batch_take(token=second.token, user=rosa, decision="approve", note="second look")
    assert states(jobs) == ["READY"] * 3
    assert (released.decided, released.first_approvals) == (3, 0)
