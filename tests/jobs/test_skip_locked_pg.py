"""Row locks across connections (PostgreSQL only): a claimer steps over a row
another transaction holds instead of queueing behind it (SKIP LOCKED)."""

import threading

import pytest
from django.db import connection, connections, transaction

from jobs import claim as claim_sql
from jobs.models import Job

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _claim(store, tenants, limit):
    # (The fair claim, not the one-tenant claim a previous claim may have chosen.)
    claim_sql._last_seen.one_tenant = False
    jobs = store.claim_batch("w1", limit=limit, tenants=tenants)
    return jobs[0] if jobs else None


@pytest.mark.parametrize(("tenants", "limit"), [(None, 1), (None, 5), (["studio"], 1)],
                         ids=["fair-claim", "fair-batch", "listed-tenant"])
def test_claim_next_steps_over_a_row_another_transaction_holds(store, tenants, limit):
    store.enqueue("studio", "first", priority=9)
    store.enqueue("studio", "second")
    locked, release = threading.Event(), threading.Event()

    def hold_first():
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(key="first")
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_first)
    holder.start()
    try:
        assert locked.wait(30)
        with connection.cursor() as cursor:
            # Queueing behind the lock would fail here instead of hanging.
            cursor.execute("SET lock_timeout = '5s'")
        job = _claim(store, tenants, limit)
        assert job is not None and job.key == "second"
    finally:
        release.set()
        holder.join(30)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert _claim(store, tenants, limit).key == "first"
