"""A bulk decision and single decisions racing over the same items, on real
parallel PostgreSQL connections: each item is decided exactly once, and the
batch reports as skipped exactly the items a single decision took first."""

import threading

import pytest
from django.db import connection

from jobs.models import Job, JobEvent
from review import bulk
from review.decisions import AlreadyDecided, job_reject
from tests.factories import MembershipFactory, UserFactory

from .conftest import make_job, newest_event

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ITEMS = 40


def test_concurrent_bulk_and_single_decisions_decide_each_item_once(people):
    jobs = [make_job(f"bulk-{n:02}", "WAITING_REVIEW") for n in range(ITEMS)]
    second = UserFactory(username="ruth", staff=True, groups=people["reviewer"].groups.all())
    MembershipFactory(user=second, tenant=people["reviewer"].memberships.get().tenant, role="reviewer")
    batch, _ = bulk.batch_preview(user=people["reviewer"], queue="WAITING_REVIEW",
                                  jobs=Job.objects.filter(tenant="studio", state="WAITING_REVIEW"), query={})
    seen = {job.pk: newest_event(job) for job in jobs}
    start = threading.Barrier(2)
    singles: dict[int, str] = {}
    taken = {}

    def run_bulk():
        try:
            start.wait(timeout=30)
            taken["batch"] = bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve",
                                             note="bulk")
        finally:
            connection.close()

    def run_singles():
        try:
            start.wait(timeout=30)
            # From the newest items backwards, towards the bulk run's front.
            for job in reversed(jobs):
                try:
                    job_reject(job_id=job.pk, user=second, note="single", seen_event=seen[job.pk])
                    singles[job.pk] = "rejected"
                except AlreadyDecided:
                    singles[job.pk] = "moved"
        finally:
            connection.close()

    threads = [threading.Thread(target=run_bulk), threading.Thread(target=run_singles)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    result = taken["batch"]
    decisions = JobEvent.objects.filter(job__in=jobs, kind__in=["approve", "reject"])
    # Exactly one decision per item, by whichever came first.
    assert sorted(decisions.values_list("job_id", flat=True)) == sorted(job.pk for job in jobs)
    for job in jobs:
        bulk_won = result.outcome[str(job.pk)] == "decided"
        single_won = singles[job.pk] == "rejected"
        assert bulk_won != single_won, (job.key, result.outcome[str(job.pk)], singles[job.pk])
        assert Job.objects.get(pk=job.pk).state == ("READY" if bulk_won else "CANCELLED")
    assert result.decided + result.skipped == ITEMS and result.refused == 0
    assert result.skipped == list(singles.values()).count("rejected")
