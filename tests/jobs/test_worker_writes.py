"""What a worker does when recording a handler's outcome fails: the fence
moved before the heartbeat noticed (the result is discarded), or the
database refused the write (recorded once as NEEDS_ATTENTION), or the
connection broke during the write (the finish is in doubt: sent again until
the database settles it, or given up after a lease's length and the job is
recovered). In-process workers on the real database; a failing write is
refused by the database itself (a trigger), and a reply lost after the commit
is a real commit followed by a connection error."""

import threading
import time
from collections import Counter
from contextlib import contextmanager
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from jobs.actions import Wait, action
from jobs.errors import TransientError
from jobs.models import Job
from jobs.states import State
from jobs.store import Store
from jobs.worker import Worker, WorkerConfig
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@action("test.taken_over_while_running")
def taken_over_while_running(ctx):
    """While this handler runs, its lease expires and another slot of the same
    worker process (same worker id) takes the job over — faster than any
    heartbeat could notice (the lease ttl here is long)."""
    Job.objects.filter(pk=ctx.job.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert Store().claim(ctx.tenant, ctx.key, ctx.worker_id, ttl=300) == ctx.epoch + 1
    return {"sent": True}


RUNS: Counter = Counter()


@action("test.counted")
def counted(ctx):
    """Counts how often each job's handler ran."""
    RUNS[ctx.key] += 1
    return {"run": RUNS[ctx.key]}


@action("test.counted_wait")
def counted_wait(ctx):
    RUNS[ctx.key] += 1
    return Wait(State.WAITING_EXTERNAL, reason="the customer's reply")


@action("test.counted_failure")
def counted_failure(ctx):
    RUNS[ctx.key] += 1
    # Transient: retried, not before the test is over.
    raise TransientError("the provider timed out", retry_after=600)


def run_until_idle(worker_id="w1", *, lease_ttl=60.0, store: Store | None = None, batch: int = 1) -> Worker:
    worker = Worker(WorkerConfig(worker_id=worker_id, until_idle=True, poll_interval=0.05, lease_ttl=lease_ttl,
                                 batch=batch), store=store)
    worker.run()
    return worker


def events(caplog, name: str) -> list[dict]:
    return [r.fields for r in caplog.records if getattr(r, "fields", {}).get("event") == name]


def test_a_result_whose_fence_moved_before_the_heartbeat_noticed_is_discarded(store, caplog):
    store.enqueue("studio", "q-1", action="test.taken_over_while_running")

    worker = run_until_idle()

    job = Job.objects.get(key="q-1")
    assert (job.state, job.lease_epoch, job.worker_id, job.result) == ("LEASED", 2, "w1", None)
    assert not job.events.filter(kind="finish").exists()
    assert (worker.stats["lost"], worker.stats["done"]) == (1, 0)
    assert any(getattr(r, "fields", {}).get("event") == "job.fence_lost" for r in caplog.records)


@contextmanager
def database_refuses_done(errcode: str = "", *, when: str = "TRUE", state: str = "DONE"):
    """A trigger that makes the database refuse to move any job to `state`;
    on PostgreSQL `errcode` picks the SQLSTATE (08006: the connection
    failed) and `when` narrows the refusal (SQL on NEW)."""
    using = f" USING ERRCODE = '{errcode}'" if errcode else ""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION test_refuse_done() RETURNS trigger AS $$ BEGIN "
                f"IF NEW.state = '{state}' AND ({when}) THEN RAISE EXCEPTION 'refused by the test trigger'{using}; "
                "END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            cursor.execute("CREATE TRIGGER test_refuse_done BEFORE UPDATE ON jobs_job "
                           "FOR EACH ROW EXECUTE FUNCTION test_refuse_done()")
        else:
            cursor.execute(f"CREATE TRIGGER test_refuse_done BEFORE UPDATE ON jobs_job WHEN NEW.state = '{state}' "
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


OUTCOMES = [  # action, the state its outcome writes, its history event, its counter
    ("test.counted", "DONE", "finish", "done"),
    ("test.counted_wait", "WAITING_EXTERNAL", "wait", "waiting"),
    ("test.counted_failure", "READY", "fail", "retried"),
]


@pytest.mark.postgres
@pytest.mark.parametrize("name, state, kind, counter", OUTCOMES)
def test_an_outcome_whose_write_the_connection_broke_is_sent_again_and_the_handler_runs_once(
        store, caplog, name, state, kind, counter):
    RUNS.clear()
    store.enqueue("studio", "q-1", action=name)

    # The first write of the outcome fails as a broken connection does
    # (nothing committed); a sequence is not rolled back with it.
    with connection.cursor() as cursor:
        cursor.execute("CREATE SEQUENCE test_refuse_once")
    try:
        with database_refuses_done(errcode="08006", state=state, when="nextval('test_refuse_once') = 1"):
            worker = run_until_idle()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP SEQUENCE test_refuse_once")

    job = Job.objects.get(key="q-1")
    assert (job.state, job.lease_epoch, job.attempts) == (state, 1, 1)
    assert RUNS["q-1"] == 1
    assert job.events.filter(kind=kind).count() == 1
    assert (worker.stats[counter], worker.stats["unrecorded"], worker.stats["lost"]) == (1, 0, 0)
    doubt = events(caplog, "job.write_in_doubt")
    assert doubt and "refused by the test trigger" in doubt[0]["error"]
    assert not events(caplog, "job.write_failed")


@pytest.mark.postgres
@pytest.mark.parametrize("name, state, kind, counter", OUTCOMES[:2])  # recovery itself writes READY
def test_an_outcome_that_cannot_be_written_within_a_lease_is_given_up_and_the_job_runs_again(
        store, caplog, name, state, kind, counter):
    RUNS.clear()
    store.enqueue("studio", "q-1", action=name)

    # Every write of the first attempt's outcome breaks. The worker sends it
    # again until, a lease's length after the first failure, it gives up —
    # unless its own housekeeping recovers the expired lease first, and the
    # next try finds the fence moved. Either way that outcome is discarded.
    with database_refuses_done(errcode="08006", state=state, when="NEW.lease_epoch = 1"):
        worker = run_until_idle(lease_ttl=1.0)
        doubt = events(caplog, "job.write_in_doubt")
        assert doubt and "refused by the test trigger" in doubt[0]["error"]
        given_up, lost = events(caplog, "job.write_failed"), events(caplog, "job.fence_lost")
        assert (worker.stats["unrecorded"], worker.stats["lost"]) in {(1, 0), (0, 1)}
        assert (len(given_up), len(lost)) == (worker.stats["unrecorded"], worker.stats["lost"])
        assert not Job.objects.get(key="q-1").events.filter(kind=kind, epoch=1).exists()

        # Its lease runs out (the worker may already have recovered and
        # rerun it); recovery hands the job back and it runs to the end.
        job = Job.objects.get(key="q-1")
        if job.state == "LEASED":
            recovered = store.recover_expired(now=job.lease_until + timedelta(seconds=1))
            assert [(r.key, r.to_state) for r in recovered] == [("q-1", "READY")]
            run_until_idle("w2")

    job = Job.objects.get(key="q-1")
    assert (job.state, job.lease_epoch) == (state, 2)
    assert RUNS["q-1"] == 2
    assert list(job.events.filter(kind=kind).values_list("epoch", flat=True)) == [2]


class LosesAReply(Store):
    """The database is real; what is lost is the reply. The first write of an
    outcome (finishes, a wait, a failure) either commits and then reports a
    broken connection (`committed=True`: the reply was lost) or, before
    anything is written, lets `before` run (another process acting
    meanwhile) and reports it. A lost finish reply here commits only the
    finishes, not the claim they travel with: jobs a lost reply had claimed
    were never handed to the worker, so their leases expire and recovery
    hands them on, as after a crash."""

    def __init__(self, *, committed: bool, before=lambda: None):
        super().__init__()
        self.committed, self.before, self.broken = committed, before, 0

    def _break(self, commit) -> None:
        self.broken += 1
        if self.committed:
            commit()
        else:
            self.before()
        raise OperationalError("server closed the connection unexpectedly")

    def finish_and_claim(self, worker_id, done, **kwargs):
        if done and not self.broken:
            self._break(lambda: self.finish_many(worker_id, done))
        return super().finish_and_claim(worker_id, done, **kwargs)

    def wait(self, *args, **kwargs):
        if not self.broken:
            self._break(lambda: super(LosesAReply, self).wait(*args, **kwargs))
        return super().wait(*args, **kwargs)

    def fail(self, *args, **kwargs):
        if not self.broken:
            self._break(lambda: super(LosesAReply, self).fail(*args, **kwargs))
        return super().fail(*args, **kwargs)


@pytest.mark.parametrize("name, state, kind, counter", OUTCOMES[1:])
def test_a_wait_or_failure_whose_reply_was_lost_after_the_commit_is_recorded_once(
        store, caplog, name, state, kind, counter):
    RUNS.clear()
    store.enqueue("studio", "q-1", action=name)
    flaky = LosesAReply(committed=True)

    worker = run_until_idle(store=flaky)

    assert flaky.broken == 1
    job = Job.objects.get(key="q-1")
    assert (job.state, job.lease_epoch, job.attempts) == (state, 1, 1)
    assert RUNS["q-1"] == 1 and job.events.filter(kind=kind).count() == 1
    # Sent again, refused by the fence — and found to be its own write.
    assert (worker.stats[counter], worker.stats["lost"], worker.stats["unrecorded"]) == (1, 0, 0)
    assert events(caplog, "job.write_in_doubt") and not events(caplog, "job.fence_lost")


@pytest.mark.parametrize("batch", [1, 5])
def test_finishes_whose_reply_was_lost_after_the_commit_count_as_done_once(store, caplog, batch):
    RUNS.clear()
    keys = [f"q-{i}" for i in range(3)]
    for key in keys:
        store.enqueue("studio", key, action="test.counted")
    flaky = LosesAReply(committed=True)

    worker = run_until_idle(store=flaky, batch=batch)

    assert flaky.broken == 1
    for job in Job.objects.filter(key__in=keys):
        assert (job.state, job.lease_epoch, job.result) == ("DONE", 1, {"run": 1})
        assert job.events.filter(kind="finish").count() == 1
    assert RUNS == Counter(dict.fromkeys(keys, 1))
    # Sent again, refused by the fence — and found to be its own write.
    assert (worker.stats["done"], worker.stats["lost"], worker.stats["unrecorded"]) == (3, 0, 0)
    assert not events(caplog, "job.fence_lost") and not events(caplog, "job.write_failed")


@pytest.mark.parametrize("name, state, kind, counter", OUTCOMES)
def test_an_outcome_in_doubt_whose_job_was_taken_over_meanwhile_is_lost(store, caplog, name, state, kind, counter):
    RUNS.clear()
    store.enqueue("studio", "q-1", action=name)

    def taken_over():
        # The worker seemed dead: its lease expired and another worker took
        # the job over (epoch 2) — straight from the expired lease, or after
        # the first worker's own housekeeping recovered it.
        Job.objects.filter(key="q-1").update(lease_until=timezone.now() - timedelta(seconds=1))
        assert store.claim("studio", "q-1", "w2") == 2

    worker = run_until_idle(store=LosesAReply(committed=False, before=taken_over))

    job = Job.objects.get(key="q-1")
    assert (job.state, job.lease_epoch, job.worker_id) == ("LEASED", 2, "w2")
    assert not job.events.filter(kind=kind).exists()
    assert (worker.stats[counter], worker.stats["lost"], worker.stats["unrecorded"]) == (0, 1, 0)
    assert events(caplog, "job.fence_lost")


def test_an_attempt_found_lost_by_both_the_renewal_and_its_slot_counts_once(store, caplog):
    # The main thread's renewal and the slot retrying a write in doubt can
    # both find the same moved fence: one attempt is lost once; the next
    # attempt of the same job (another epoch) is another.
    store.enqueue("studio", "q-1", action="test.counted")
    store.claim("studio", "q-1", "w1")
    job = Job.objects.get(key="q-1")
    worker = Worker(WorkerConfig(worker_id="w1", until_idle=True), store=store)
    worker._lost(job, "found by the renewal")
    worker._lost(job, "found by the slot")
    assert worker.stats["lost"] == 1 and len(events(caplog, "job.fence_lost")) == 1
    job.lease_epoch += 1
    worker._lost(job, "the next attempt")
    assert worker.stats["lost"] == 2


def test_a_handler_abandoned_at_shutdown_is_reported_abandoned_not_lost(store, caplog):
    store.enqueue("studio", "q-1", action="test.counted")
    store.claim("studio", "q-1", "w1")
    job = Job.objects.get(key="q-1")
    worker = Worker(WorkerConfig(worker_id="w1", until_idle=True, grace=0), store=store)
    ctx = SimpleNamespace(job=job, cancelled=threading.Event())
    worker._running[job.pk] = SimpleNamespace(ctx=ctx)
    worker._drain([])
    assert ctx.cancelled.is_set() and len(events(caplog, "job.abandoned")) == 1
    # Its handler returns to the cancelled context afterwards: no lost lease.
    worker._lost(job, "the lease was lost while the handler ran; its result is discarded")
    assert worker.stats["lost"] == 0 and not events(caplog, "job.fence_lost")


@action("test.slow_counted")
def slow_counted(ctx):
    time.sleep(0.4)  # the handler's own work: long enough for the batch's early write to come due
    return counted(ctx)


class BreaksAFlush(Store):
    """A batch's first early write of its finishes reports a broken
    connection before anything is written."""

    broken = 0

    def finish_many(self, worker_id, done, **kwargs):
        if not self.broken:
            self.broken += 1
            raise OperationalError("server closed the connection unexpectedly")
        return super().finish_many(worker_id, done, **kwargs)


def test_a_batch_keeps_finishes_an_early_write_left_in_doubt_and_writes_them_with_the_rest(store, caplog):
    RUNS.clear()
    keys = [f"q-{i}" for i in range(3)]
    for key in keys:
        store.enqueue("studio", key, action="test.slow_counted")
    flaky = BreaksAFlush()

    # A third of the renewal interval (1 s) after its oldest unwritten
    # success, a batch writes its successes early — and that write breaks.
    worker = run_until_idle(store=flaky, batch=3, lease_ttl=3.0)

    assert flaky.broken == 1
    assert events(caplog, "job.write_in_doubt")[0]["jobs"] == 2
    for job in Job.objects.filter(key__in=keys):
        assert (job.state, job.lease_epoch, job.result) == ("DONE", 1, {"run": 1})
    assert RUNS == Counter(dict.fromkeys(keys, 1))
    assert (worker.stats["done"], worker.stats["lost"], worker.stats["unrecorded"]) == (3, 0, 0)


def test_recorded_by_names_only_that_worker_s_outcomes_of_that_kind_under_that_epoch(store):
    for key in ("q-1", "q-2", "q-3"):
        store.enqueue("studio", key)
        assert store.claim("studio", key, "w1") == 1
    store.finish("studio", "q-1", "w1", 1)
    store.wait("studio", "q-3", "w1", 1, reason="the customer's reply")
    q1, q2, q3 = (Job.objects.get(key=key) for key in ("q-1", "q-2", "q-3"))

    assert store.recorded_by("w1", [q1, q2, q3], "finish") == {q1.id: "DONE"}  # q-2 is still running
    assert store.recorded_by("w1", [q1, q2, q3], "wait") == {q3.id: "WAITING_EXTERNAL"}
    assert store.recorded_by("w2", [q1], "finish") == {}  # another worker's id
    q1.lease_epoch = 2
    assert store.recorded_by("w1", [q1], "finish") == {}  # another claim of the job
    assert store.recorded_by("w1", [], "finish") == {}


class RenewsAfterItsOwnOutcome(Store):
    """The heartbeat race made certain: a renewal whose copy of the running
    jobs was taken while the handler ran goes to the database only once the
    handler's own outcome (`state`) has committed."""

    def __init__(self, state: str):
        super().__init__()
        self.state, self.renewing, self.renewals = state, threading.Event(), 0

    def renew_many(self, worker_id, jobs, **kwargs):
        self.renewals += 1
        self.renewing.set()
        for job in jobs:
            wait_for(lambda: Job.objects.filter(id=job.id, state=self.state).exists(),
                     what=f"{job.key}'s own outcome ({self.state})")
        return super().renew_many(worker_id, jobs, **kwargs)


@action("test.outcome_while_renewed")
def outcome_while_renewed(ctx):
    """Returns (or fails) once the heartbeat has started renewing this job."""
    assert ctx.store.renewing.wait(20), "the heartbeat never renewed the running job"
    RUNS[ctx.key] += 1
    if ctx.payload.get("outcome") == "wait":
        return Wait(State.WAITING_EXTERNAL, reason="the customer's reply")
    if ctx.payload.get("outcome") == "fail":
        raise TransientError("the provider timed out", retry_after=600)
    return {"ok": True}


@pytest.mark.parametrize("outcome, state, counter", [("finish", "DONE", "done"), ("wait", "WAITING_EXTERNAL",
                                                                                  "waiting"),
                                                     ("fail", "READY", "retried")])
def test_a_renewal_that_finds_the_jobs_own_outcome_is_not_a_lost_lease(store, caplog, outcome, state, counter):
    # The heartbeat copies the running jobs, then renews
    # each; the slot's own finish committing in between makes that renewal
    # hit Conflict — which is the worker's own outcome, not a lost lease.
    RUNS.clear()
    store.enqueue("studio", "q-1", action="test.outcome_while_renewed", payload={"outcome": outcome})
    racing = RenewsAfterItsOwnOutcome(state)

    worker = run_until_idle(store=racing, lease_ttl=0.3)

    assert racing.renewals >= 1
    job = Job.objects.get(key="q-1")
    assert (job.state, job.lease_epoch, RUNS["q-1"]) == (state, 1, 1)
    assert (worker.stats[counter], worker.stats["lost"]) == (1, 0)
    assert not events(caplog, "job.fence_lost")


# ---------------------------------------------------------------- writes in doubt outlive no lease


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("lease", [0.3, 1.0, 5.0, 30.0])
def test_the_resend_backoff_never_outlasts_the_lease_whatever_the_outage(lease):
    # Whatever the jitter draws (its worst case here) and however long the
    # database stays down, the first try after it is back lands before the
    # lease runs out — for every moment the outage may end.
    from jobs.worker import RESEND_MIN_DELAY, db_retry_delay

    for back_at in [lease * k / 40 for k in range(40)]:
        t, failures = 0.0, 0
        while t < back_at:  # each try before the database is back fails
            failures += 1
            delay = db_retry_delay(failures, jitter=0.999999, lease_left=lease - t)
            assert delay <= max(RESEND_MIN_DELAY, (lease - t) / 2)
            t += delay
        assert t < lease or lease - back_at < 2 * RESEND_MIN_DELAY, (lease, back_at, t)
    # Without a write in doubt the backoff is the plain one, up to 30 s.
    assert db_retry_delay(10, jitter=0.999999) > 29


OUTAGE_SECONDS = 3.5
RUNS_AFTER_OUTAGE: Counter = Counter()


@action("test.finishes_into_an_outage")
def finishes_into_an_outage(ctx):
    """The first run finishes just as the database starts refusing every
    write of a finished job for a while (see `outage_of_finishes`)."""
    RUNS_AFTER_OUTAGE[ctx.key] += 1
    if RUNS_AFTER_OUTAGE[ctx.key] == 1:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE test_outage SET until = clock_timestamp() + make_interval(secs => %s)",
                           [OUTAGE_SECONDS])
    return {"run": RUNS_AFTER_OUTAGE[ctx.key]}


@contextmanager
def outage_of_finishes():
    """Every write that finishes a job fails as a broken connection does
    (SQLSTATE 08006) until `test_outage.until` — set by the handler."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE test_outage (until timestamptz)")
        cursor.execute("INSERT INTO test_outage VALUES (NULL)")
        cursor.execute(
            "CREATE FUNCTION test_refuse_during_outage() RETURNS trigger AS $$ BEGIN "
            "IF NEW.state = 'DONE' AND clock_timestamp() < (SELECT until FROM test_outage) THEN "
            "RAISE EXCEPTION 'the database is restarting (test outage)' USING ERRCODE = '08006'; "
            "END IF; RETURN NEW; END $$ LANGUAGE plpgsql")
        cursor.execute("CREATE TRIGGER test_refuse_during_outage BEFORE UPDATE ON jobs_job "
                       "FOR EACH ROW EXECUTE FUNCTION test_refuse_during_outage()")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_refuse_during_outage ON jobs_job")
            cursor.execute("DROP FUNCTION test_refuse_during_outage()")
            cursor.execute("DROP TABLE test_outage")


@pytest.mark.postgres
def test_a_finish_in_doubt_through_an_outage_is_resent_before_its_lease_expires(store, caplog, monkeypatch):
    # The outage starts as the handler finishes and lasts 3.5 s of a 5 s
    # lease; another worker recovers the lease the moment it expires. With
    # the backoff's jitter at its worst, an unbounded backoff resends the
    # finish after 7 s — the job recovered and its handler run twice.
    from jobs import chance

    RUNS_AFTER_OUTAGE.clear()
    monkeypatch.setattr(chance.rng, "random", lambda: 0.999)
    store.enqueue("studio", "q-1", action="test.finishes_into_an_outage")
    worker = Worker(WorkerConfig(worker_id="w1", until_idle=True, poll_interval=0.05, lease_ttl=5.0))
    with outage_of_finishes():
        running = threading.Thread(target=worker.run)
        running.start()
        recovered = []
        try:
            while running.is_alive():  # the other worker's recovery sweep
                recovered += Store().recover_expired(actor="w2")
                running.join(timeout=0.02)
        finally:
            connection.close()

    job = Job.objects.get(key="q-1")
    assert (job.state, job.lease_epoch, job.result) == ("DONE", 1, {"run": 1})
    assert RUNS_AFTER_OUTAGE["q-1"] == 1 and recovered == []
    assert (worker.stats["done"], worker.stats["lost"], worker.stats["unrecorded"]) == (1, 0, 0)
    assert events(caplog, "job.write_in_doubt")
