"""Waiting costs a row, not a process (DESIGN §1, §3): 10,000 jobs waiting on
timers or replies hold no worker, and an idle worker costs nothing.

"Costs nothing" is measured in what does not depend on the machine's load:
- it does not spin: between two claims an idle slot waits at least half its
  poll interval (the jitter's floor). Load can only make the wait longer, so
  this bound fails for a busy loop and never for a loaded machine;
- what it asks of the database while idle does not grow with what waits: the
  database work of an idle window that holds several claims and several
  housekeeping passes (recovery, wake-ups, timers, outbox) — SQLite's
  virtual-machine instructions (a progress handler on the worker's own
  connections), PostgreSQL's tuples read from the job and timer tables (its
  statistics) — stays far below a single pass over the 10,000 waiting rows;
- it writes nothing and leases nothing while idle.
"""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.db.backends.signals import connection_created
from django.utils import timezone

from jobs.models import Job, Timer
from jobs.outbox import outbox_relay
from jobs.store import JobSpec
from jobs.timers import timer_fire_due
from jobs.worker import Worker, WorkerConfig
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

WAITING = 10_000
WITH_TIMERS = 5_000
POLL = 0.4  # seconds: an idle slot waits between half of this and all of it
LEASE_TTL = 3.0  # housekeeping runs every third of it
IDLE_CLAIMS = 6  # claims observed while idle...
IDLE_PASSES = 2  # ...and housekeeping passes


class ObservedWorker(Worker):
    """The real worker, telling the test when a slot claims and when the main
    thread's housekeeping runs — nothing about what it does is changed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.claims: list[float] = []
        self.passes: list[float] = []
        self.observed = threading.Condition()

    def _note(self, times: list[float]) -> None:
        with self.observed:
            times.append(time.monotonic())
            self.observed.notify_all()

    def _finish_and_claim(self, number):
        jobs = super()._finish_and_claim(number)
        self._note(self.claims)
        return jobs

    def _maintain(self, **kwargs):
        last = self._last_maintenance
        moved = super()._maintain(**kwargs)
        if self._last_maintenance != last:
            self._note(self.passes)
        return moved


class DatabaseWork:
    """What the worker's own connections ask of the database: on SQLite,
    virtual-machine instructions, counted by a progress handler installed on
    each connection the worker opens; on PostgreSQL, tuples read from the job
    and timer tables (statistics)."""

    def __init__(self):
        self.instructions = 0
        self._lock = threading.Lock()

    def on_connection(self, sender, connection, **kwargs):
        if connection.vendor == "sqlite":
            connection.connection.set_progress_handler(self._tick, 1)

    def _tick(self) -> int:
        with self._lock:
            self.instructions += 1
        return 0  # go on

    @staticmethod
    def tuples_read() -> int:
        with connection.cursor() as cursor:
            # This backend's own counts (the set-up's 10,000-row update, say)
            # reach the statistics at most once a second unless forced: sent
            # now, when the statement ends, they are not counted in the idle
            # window that a late flush would put them in.
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0) "
                           "FROM pg_stat_user_tables WHERE relname IN ('jobs_job', 'jobs_timer')")
            return int(cursor.fetchone()[0])


def other_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


def test_ten_thousand_waiting_jobs_hold_no_worker_and_an_idle_worker_costs_nothing(store):
    store.enqueue_many(JobSpec("scale", f"reply-or-reminder-{n:05d}") for n in range(WAITING))
    # Test set-up: persist the waits in bulk, as 10,000 handlers returning
    # Wait.external would have (the fenced path is covered elsewhere).
    Job.objects.filter(tenant="scale").update(state="WAITING_EXTERNAL", wait_reason="customer reply or reminder")
    later = timezone.now() + timedelta(days=30)
    job_ids = list(Job.objects.filter(tenant="scale").order_by("id").values_list("id", flat=True)[:WITH_TIMERS])
    Timer.objects.bulk_create(
        [Timer(tenant="scale", job_id=job_id, scheduled_for=later, reason="payment reminder", created_at=timezone.now())
         for job_id in job_ids],
        batch_size=1000,
    )
    postgres = connection.vendor == "postgresql"
    if postgres:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE jobs_job")
            cursor.execute("ANALYZE jobs_timer")
    # Nothing is due: the sweeps find nothing, whatever is waiting.
    assert timer_fire_due() == 0
    assert outbox_relay() == 0

    work = DatabaseWork()
    connection_created.connect(work.on_connection, dispatch_uid="test_waiting_scale")
    worker = ObservedWorker(WorkerConfig(worker_id="idle", poll_interval=POLL, lease_ttl=LEASE_TTL))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        # Past start-up work: the worker has run a first job and found nothing more.
        store.enqueue("other", "first")
        wait_for(lambda: Job.objects.get(key="first").state == "DONE", timeout=60, what="a first job to run")
        with worker.observed:
            claims, passes = len(worker.claims), len(worker.passes)
        instructions = work.instructions
        tuples = DatabaseWork.tuples_read() if postgres else 0
        with worker.observed:
            # (The claim under way when the window opened may be the one that wrote the first job's finish.)
            assert worker.observed.wait_for(lambda: len(worker.claims) >= claims + 1 + IDLE_CLAIMS
                                            and len(worker.passes) >= passes + IDLE_PASSES, timeout=120)
            idle = worker.claims[claims + 1:]
        instructions = work.instructions - instructions
    finally:
        worker.request_stop("test over")
        thread.join(timeout=60)
        connection_created.disconnect(dispatch_uid="test_waiting_scale")
    assert not thread.is_alive()

    # No spinning: each idle claim came at least the poll interval's jitter floor after the one before.
    gaps = [b - a for a, b in zip(idle, idle[1:])]
    assert min(gaps) >= POLL / 2 * 0.95, gaps
    # The database work of the idle window is far below one pass over what waits.
    if postgres:
        # The worker's backends report their statistics as they exit.
        wait_for(lambda: other_backends() == 0, timeout=30, what="the worker's connections to close")
        tuples = DatabaseWork.tuples_read() - tuples
        assert tuples < WAITING / 10, f"{tuples} tuples of jobs and timers read while idle"
    else:
        assert instructions < WAITING, f"{instructions} SQLite instructions while idle"
    assert Job.objects.filter(tenant="scale", state="WAITING_EXTERNAL").count() == WAITING
    assert Job.objects.filter(state="LEASED").count() == 0
    assert Job.objects.filter(tenant="scale").exclude(state="WAITING_EXTERNAL").count() == 0
    assert worker.stats["claimed"] == 1

    # A handful of timers come due: a worker wakes those jobs and runs them, leaving the rest waiting.
    due = job_ids[:20]
    Timer.objects.filter(job_id__in=due).update(scheduled_for=timezone.now() - timedelta(seconds=1))
    Worker(WorkerConfig(worker_id="waker", until_idle=True, poll_interval=0.05)).run()
    assert Job.objects.filter(pk__in=due, state="DONE").count() == 20
    assert Timer.objects.filter(state="FIRED").count() == 20
    assert Job.objects.filter(tenant="scale", state="WAITING_EXTERNAL").count() == WAITING - 20
