"""The job history partitioned by day on PostgreSQL (`jobs.partitions`):
partitions are made ahead, rows that landed in the default partition move
into their day's, and a day partition is dropped only once no remaining job
has history in it. SQLite keeps the plain table and deletes rows."""

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from jobs.models import Job, JobEvent
from jobs.partitions import (
    DEFAULT,
    history_partitioned,
    history_partitions,
    history_partitions_ensure,
    partition_name,
)
from jobs.retention import retention_sweep
from tests.factories import TimerFactory
from tests.jobs.test_retention import DAY, finished

pytestmark = pytest.mark.django_db
postgres_only = pytest.mark.skipif(connection.vendor != "postgresql",
                                   reason="native partitioning is PostgreSQL's; SQLite keeps the plain table")


def where(event: JobEvent) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM jobs_jobevent WHERE id = %s", [event.pk])
        return cursor.fetchone()[0]


def test_sqlite_keeps_the_plain_table_and_deletes_the_history_with_its_job(store):
    job = finished(store, "old", days_ago=40)
    events = job.events.count()
    report = retention_sweep(retention_days=30, redact_after_days=7)
    if connection.vendor == "postgresql":
        assert history_partitioned()
    else:
        assert not history_partitioned() and report.deleted["jobs.JobEvent"] == events
        assert not report.partitions_created
    # History in the default partition (no day partition that far back)
    # goes row by row on PostgreSQL too.
    assert not JobEvent.objects.filter(job_id=job.pk).exists()


@postgres_only
def test_the_sweep_creates_the_day_partitions_ahead_and_new_history_lands_in_its_day():
    day = datetime(2031, 3, 1, 12, tzinfo=UTC)
    created = history_partitions_ensure(now=day, ahead=3)
    assert created == [partition_name(day.date() + timedelta(days=n), day.date() + timedelta(days=n + 1))
                       for n in range(4)]
    assert history_partitions_ensure(now=day, ahead=3) == []  # idempotent
    job = Job.objects.create(tenant="studio", key="future", action="jobs.noop")
    event = JobEvent.objects.create(job=job, kind="x", created_at=day + timedelta(days=2))
    assert where(event) == "jobs_jobevent_p20310303_20310304"
    late = JobEvent.objects.create(job=job, kind="x", created_at=day + timedelta(days=30))
    assert where(late) == DEFAULT


@postgres_only
def test_rows_in_the_default_partition_move_into_their_day_when_it_is_created():
    day = datetime(2032, 5, 10, 8, tzinfo=UTC)
    job = Job.objects.create(tenant="studio", key="early", action="jobs.noop")
    event = JobEvent.objects.create(job=job, kind="x", created_at=day)
    other = JobEvent.objects.create(job=job, kind="x", created_at=day + timedelta(days=5))
    assert where(event) == DEFAULT
    history_partitions_ensure(now=day, ahead=0)
    assert where(event) == "jobs_jobevent_p20320510_20320511" and where(other) == DEFAULT
    assert list(job.events.order_by("id")) == [event, other]


@postgres_only
def test_a_day_partition_is_dropped_only_once_no_remaining_job_has_history_in_it(store):
    # Day partitions 60 and 59 days ago; every job below writes its history
    # into them.
    old = datetime.fromtimestamp(time.time() - 60 * DAY, UTC).replace(hour=12)
    history_partitions_ensure(now=old, ahead=1)
    first, second = (partition_name(old.date() + timedelta(days=n), old.date() + timedelta(days=n + 1))
                     for n in range(2))
    at = old.timestamp()
    gone = finished(store, "gone", days_ago=(time.time() - at) / DAY)
    kept = finished(store, "kept-by-a-timer", days_ago=(time.time() - at) / DAY)
    timer = TimerFactory(job=kept, reason="remind")
    store.enqueue("studio", "unfinished", now=at + DAY)
    assert {where(event) for event in JobEvent.objects.all()} == {first, second}

    report = retention_sweep(retention_days=30, redact_after_days=7)

    # The finished job went; its history waits in the partition the kept job
    # still has history in, and the unfinished job keeps the second one.
    assert not Job.objects.filter(key="gone").exists()
    assert report.deleted["jobs.Job"] == 1 and report.deleted["jobs.JobEvent"] == 0
    assert report.partitions_kept == {first: 1, second: 1} and report.partitions_dropped == []
    assert JobEvent.objects.filter(job_id=gone.pk).exists()
    assert set(history_partitions()) >= {first, second}
    assert kept.events.exists()

    timer.state = "FIRED"
    timer.save()
    report = retention_sweep(retention_days=30, redact_after_days=7)

    assert report.deleted["jobs.Job"] == 1 and report.partitions_dropped == [first]
    assert report.partitions_kept == {second: 1}
    assert first not in history_partitions() and second in history_partitions()
    assert not JobEvent.objects.filter(job_id__in=[gone.pk, kept.pk]).exists()
    assert Job.objects.get(key="unfinished").events.exists()
    assert "1 dropped" in report.summary()


@postgres_only
def test_the_growing_tables_carry_their_own_autovacuum_and_fillfactor():
    day = datetime(2033, 7, 1, tzinfo=UTC)
    (made,) = history_partitions_ensure(now=day, ahead=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s)",
                       [["jobs_outboxevent", "operations_operation", "operations_receipt", made, DEFAULT, "jobs_job",
                         "jobs_readytenant"]])
        options = {name: set(opts or ()) for name, opts in cursor.fetchall()}
    assert {"fillfactor=90", "autovacuum_vacuum_scale_factor=0.02"} <= options["jobs_outboxevent"]
    assert "fillfactor=90" in options["operations_operation"]
    for insert_only in ("operations_receipt", made, DEFAULT):
        assert "autovacuum_vacuum_insert_scale_factor=0.05" in options[insert_only], insert_only
    # The job table (two dead versions per job, retention's deletes) and the tenant sample.
    for churning in ("jobs_job", "jobs_readytenant"):
        assert "autovacuum_vacuum_scale_factor=0.02" in options[churning], churning
