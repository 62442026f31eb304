"""A bulk decision cut by a real database error on PostgreSQL: another
transaction holds the second of three items' row past the bulk's lock
timeout. The item is recorded interrupted, the third is still decided on the
same connection, and the batch taken again decides the second."""

import threading

import pytest
from django.db import connection, transaction

from jobs.models import DecisionBatch, Job
from review import bulk

from .conftest import make_job

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_lock_timeout_on_the_second_item_interrupts_it_and_taking_the_batch_again_decides_it(people):
    jobs = [make_job(f"bulk-{n}", "WAITING_REVIEW") for n in range(3)]
    batch, _ = bulk.batch_preview(user=people["reviewer"], queue="WAITING_REVIEW",
                                  jobs=Job.objects.filter(tenant="studio", state="WAITING_REVIEW"), query={})
    locked, release = threading.Event(), threading.Event()

    def hold_second():
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=jobs[1].pk)
                locked.set()
                release.wait(timeout=60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_second)
    holder.start()
    try:
        assert locked.wait(timeout=30)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        taken = bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="all checked")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
        release.set()
        holder.join(timeout=60)

    assert [Job.objects.get(pk=j.pk).state for j in jobs] == ["READY", "WAITING_REVIEW", "READY"]
    assert (taken.status, taken.decided, taken.unfinished) == (DecisionBatch.Status.INTERRUPTED, 2, 1)
    assert taken.outcome[str(jobs[1].pk)].startswith("interrupted: ")

    again = bulk.batch_take(token=batch.token, user=people["reviewer"], decision="approve", note="all checked")
    assert (again.status, again.decided, again.skipped, again.refused) == (DecisionBatch.Status.DONE, 3, 0, 0)
    assert [Job.objects.get(pk=j.pk).state for j in jobs] == ["READY"] * 3
