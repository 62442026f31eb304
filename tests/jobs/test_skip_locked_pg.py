"""Row locks across connections (PostgreSQL only): a claimer steps over a row
another transaction holds instead of queueing behind it (SKIP LOCKED)."""

import threading

import pytest
from django.db import connection, connections, transaction

from jobs.models import Job

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("tenants", [None, ["studio"]], ids=["fair-claim", "listed-tenant"])
def test_claim_next_steps_over_a_row_another_transaction_holds(store, tenants):
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
        job = store.claim_next("w1", tenants=tenants)
        assert job is not None and job.key == "second"
    finally:
        release.set()
        holder.join(30)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert store.claim_next("w1", tenants=tenants).key == "first"
