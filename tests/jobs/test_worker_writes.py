"""What a worker does when recording a handler's outcome fails: the fence
moved before the heartbeat noticed (the result is discarded), or the
database refused the write (recorded once as NEEDS_ATTENTION), or the
database could not be reached (the job is left to expire and be recovered).
In-process workers on the real database; the failing write is refused by the
database itself (a trigger), not by a mock."""

from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs.actions import action
from jobs.models import Job
from jobs.store import Store
from jobs.worker import Worker, WorkerConfig

pytestmark = pytest.mark.django_db(transaction=True)


@action("test.taken_over_while_running")
def taken_over_while_running(ctx):
    """While this handler runs, its lease expires and another slot of the same
    worker process (same worker id) takes the job over — faster than any
    heartbeat could notice (the lease ttl here is long)."""
    Job.objects.filter(pk=ctx.job.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert Store().claim(ctx.tenant, ctx.key, ctx.worker_id, ttl=300) == ctx.epoch + 1
    return {"sent": True}


def run_until_idle(worker_id="w1") -> Worker:
    worker = Worker(WorkerConfig(worker_id=worker_id, until_idle=True, poll_interval=0.05, lease_ttl=60))
    worker.run()
    return worker


def test_a_result_whose_fence_moved_before_the_heartbeat_noticed_is_discarded(store, caplog):
    store.enqueue("studio", "q-1", action="test.taken_over_while_running")

    worker = run_until_idle()

    job = Job.objects.get(key="q-1")
    assert (job.state, job.lease_epoch, job.worker_id, job.result) == ("LEASED", 2, "w1", None)
    assert not job.events.filter(kind="finish").exists()
    assert (worker.stats["lost"], worker.stats["done"]) == (1, 0)
    assert any(getattr(r, "fields", {}).get("event") == "job.fence_lost" for r in caplog.records)


@contextmanager
def database_refuses_done(errcode: str = ""):
    """A trigger that makes the database refuse to mark any job DONE; on
    PostgreSQL `errcode` picks the SQLSTATE (08006: the connection failed)."""
    using = f" USING ERRCODE = '{errcode}'" if errcode else ""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION test_refuse_done() RETURNS trigger AS $$ BEGIN "
                f"IF NEW.state = 'DONE' THEN RAISE EXCEPTION 'refused by the test trigger'{using}; END IF; "
                "RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            cursor.execute("CREATE TRIGGER test_refuse_done BEFORE UPDATE ON jobs_job "
                           "FOR EACH ROW EXECUTE FUNCTION test_refuse_done()")
        else:
            cursor.execute("CREATE TRIGGER test_refuse_done BEFORE UPDATE ON jobs_job WHEN NEW.state = 'DONE' "
                           "BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_refuse_done" + (" ON jobs_job" if connection.vendor == "postgresql"
                                                                else ""))
            if connection.vendor == "postgresql":
                cursor.execute("DROP FUNCTION test_refuse_done()")


def test_an_outcome_the_database_refuses_is_recorded_once_for_an_operator(store, caplog):
    store.enqueue("studio", "q-1")

    with database_refuses_done():
        worker = run_until_idle()

    # Not left to expire (that would run the handler again): recorded once,
    # with the refusal as the reason.
    job = Job.objects.get(key="q-1")
    assert (job.state, job.lease_epoch, job.attempts) == ("NEEDS_ATTENTION", 1, 1)
    assert "could not be recorded" in job.last_error and "refused by the test trigger" in job.last_error
    assert not job.events.filter(kind="finish").exists()
    assert (worker.stats["attention"], worker.stats["done"]) == (1, 0)


@pytest.mark.postgres
def test_an_outcome_lost_with_the_connection_is_left_to_expire_and_the_job_runs_again(store, caplog):
    store.enqueue("studio", "q-1")

    with database_refuses_done(errcode="08006"):
        worker = run_until_idle()

    job = Job.objects.get(key="q-1")
    assert (job.state, job.lease_epoch, job.worker_id) == ("LEASED", 1, "w1")
    assert not job.events.filter(kind="finish").exists()
    assert (worker.stats["unrecorded"], worker.stats["done"]) == (1, 0)
    failed = [r.fields for r in caplog.records if getattr(r, "fields", {}).get("event") == "job.write_failed"]
    assert failed and "refused by the test trigger" in failed[0]["error"]

    # The lease runs out; recovery hands the job back and it runs to the end.
    recovered = store.recover_expired(now=job.lease_until + timedelta(seconds=1))
    assert [(r.key, r.to_state) for r in recovered] == [("q-1", "READY")]
    run_until_idle("w2")
    job = Job.objects.get(key="q-1")
    assert (job.state, job.lease_epoch, job.worker_id) == ("DONE", 2, "w2")
