"""A worker's server connections (DESIGN §17) and how it says what goes
wrong with them.

- At most `--concurrency` + 1 server connections per worker process, idle or
  busy: one per slot, one for the main thread (lease renewals, housekeeping
  and the LISTEN together). Counted in pg_stat_activity by the worker's
  application_name, while it idles and while every slot runs a job whose
  lease is being renewed.
- A database call that waits longer than `db_wait_warning` is logged while it
  waits, and again when it is over.
- The first prepared statement that a transaction-mode pooler moved stops the
  worker (exit code 2) with a message naming DATABASE_POOL_MODE.
"""

import logging
import signal
import threading
import time

import pytest
from django.db import connection, transaction

from jobs.actions import action
from jobs.models import Job
from jobs.worker import Worker, WorkerConfig
from tests.support import ProcessOutput, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def backends(application_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name])
        return cursor.fetchone()[0]


def most_backends(application_name: str, samples: int = 15) -> int:
    """The most connections seen over a few samples (the heartbeat's and the
    housekeeping's moments included)."""
    seen = 0
    for _ in range(samples):
        seen = max(seen, backends(application_name))
        time.sleep(0.1)
    return seen


@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_worker_holds_at_most_concurrency_plus_one_connections_idle_or_busy(store, manage, concurrency):
    worker_id = f"budget-{concurrency}"
    name = f"durable-worker {worker_id}"
    output = ProcessOutput(manage.start("run_worker", "--worker-id", worker_id, "--concurrency", str(concurrency),
                                        "--lease-ttl", "6", "--poll-interval", "0.2", "--grace", "0"))
    try:
        output.wait_for("worker.listening")
        store.enqueue("budget", "warm-up")
        wait_for(lambda: Job.objects.get(key="warm-up").state == "DONE", what="a first job")
        # Idle: every slot has claimed (and found nothing) since.
        idle = most_backends(name)
        assert 2 <= idle <= concurrency + 1, idle
        for n in range(concurrency):
            store.enqueue("budget", f"busy-{n}", action="test.sleep", payload={"seconds": 60})
        wait_for(lambda: Job.objects.filter(tenant="budget", key__startswith="busy-", state="LEASED").count()
                 == concurrency, what="every slot running a job")
        # Busy, while each lease is renewed (ttl 6 s, renewed every 2 s; long enough that a loaded machine loses none).
        leased = dict(Job.objects.filter(tenant="budget", state="LEASED").values_list("key", "lease_until"))
        busy = most_backends(name)
        wait_for(lambda: all(Job.objects.get(tenant="budget", key=key).lease_until > until
                             for key, until in leased.items()), what="the leases to be renewed")
        busy = max(busy, most_backends(name))
        assert concurrency + 1 >= busy >= concurrency, busy
    finally:
        output.process.send_signal(signal.SIGTERM)
        out = output.finish(timeout=60)
    assert "job.renew_failed" not in out and "fence_lost" not in out, out


def test_a_database_call_waiting_long_is_logged_while_it_waits_and_when_it_ends(store, caplog):
    store.enqueue("waits", "blocked")
    worker = Worker(WorkerConfig(worker_id="waiter", poll_interval=0.1, db_wait_warning=0.5))
    caplog.set_level(logging.INFO, logger="jobs")
    thread = threading.Thread(target=worker.run)
    try:
        with transaction.atomic():
            # What a worker meets when every server connection is taken or a
            # lock is held: its claim does not return.
            with connection.cursor() as cursor:
                cursor.execute("LOCK TABLE jobs_job IN ACCESS EXCLUSIVE MODE")
            thread.start()
            wait_for(lambda: any(r.getMessage() == "worker.db_wait" for r in caplog.records), timeout=30,
                     what="the worker to say it waits for the database")
        wait_for(lambda: Job.objects.get(key="blocked").state == "DONE", what="the claim to go through")
        wait_for(lambda: any(r.getMessage() == "worker.db_wait_over" for r in caplog.records),
                 what="the worker to say the wait is over")
    finally:
        worker.request_stop("test over")
        thread.join(timeout=30)
    waits = [r for r in caplog.records if r.getMessage() == "worker.db_wait"]
    assert waits[0].levelno == logging.WARNING
    assert waits[0].fields["waited"] >= 0.5 and "connection" in waits[0].fields["hint"]


@action("test.moved_statement")
def moved_statement(ctx):
    # What psycopg meets when a transaction-mode pooler hands its next
    # transaction a server connection that never prepared the statement.
    with connection.cursor() as cursor:
        cursor.execute("EXECUTE _pg3_4242")


def test_a_prepared_statement_moved_by_a_pooler_stops_the_worker_naming_the_setting(store, caplog):
    store.enqueue("moved", "one", action="test.moved_statement")
    store.enqueue("moved", "two", action="test.moved_statement")
    caplog.set_level(logging.INFO, logger="jobs")
    code = Worker(WorkerConfig(worker_id="moved", poll_interval=0.1)).run()
    assert code == 2
    refusal = [r for r in caplog.records if r.getMessage() == "worker.misconfigured"]
    assert len(refusal) == 1 and refusal[0].levelno == logging.ERROR
    assert "DATABASE_POOL_MODE=transaction" in refusal[0].fields["reason"]
    assert '"_pg3_4242" does not exist' in refusal[0].fields["reason"]
    # It stopped at the first: the second job was never claimed.
    assert Job.objects.get(key="two").state == "READY"
