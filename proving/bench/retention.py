"""`manage.py bench_retention`: what retention costs while workers run.

1. Loads `jobs` DONE jobs of tenant `bench-retention`, finished 400 days ago,
   each with its search row and `events` history rows (server-side
   INSERT … SELECT on PostgreSQL). On PostgreSQL their history lands in day partitions created
   for that day (`--history default` puts it in the default partition
   instead: the row-delete path, as on SQLite).
   With `kept`, as many jobs finished yesterday (tenant
   `bench-retention-kept`, their history too) are loaded first: the prune
   works in a table that large, and must leave them alone.
2. Runs `work` no-op jobs through `processes` real workers alone
   (throughput before), then the same again while a real
   `manage.py prune --days 399` process deletes the loaded jobs (throughput
   during); the prune's own JSON report gives jobs/s deleted.

It refuses to start when jobs of other tenants are finished more than 399
days ago (the sweep would delete them too): it only ever deletes what it
loaded, its bench jobs (`jobs.bench_noop`, via `proving.bench`) and their
history.
"""

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction

from jobs.models import Job
from jobs.partitions import history_partitioned, history_partitions_ensure
from jobs.store import JobSpec, Store

from .common import BENCH_ACTION, ROOT, SEARCH_ROWS_OF_INSERTED, BenchError, delete_tenants
from .fleet import WorkerFleet, database_url, wait_done

TENANT = "bench-retention"
TENANT_WORK = "bench-retention-work"
# Jobs finished yesterday that the prune must leave alone (`--kept`): the
# table the prune works in holds them too.
TENANT_KEPT = "bench-retention-kept"
AGE_DAYS = 400
KEPT_AGE_DAYS = 1


def _others_expired() -> int:
    cutoff = datetime.now(UTC) - timedelta(days=AGE_DAYS - 1)
    return Job.objects.filter(finished_at__lt=cutoff).exclude(tenant=TENANT).count()


def load(jobs: int, events: int, *, partitioned_history: bool, tenant: str = TENANT, age_days: int = AGE_DAYS) -> None:
    """`jobs` jobs of `tenant` finished `age_days` ago, and their history."""
    finished = datetime.now(UTC).replace(hour=6, minute=0, second=0, microsecond=0) - timedelta(days=age_days)
    if partitioned_history:
        history_partitions_ensure(now=finished, ahead=1)
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            raise BenchError("bench_retention loads its rows with generate_series: PostgreSQL only")
        # Each job with its search row, as the Store writes them.
        cursor.execute(
            f"""
            WITH inserted AS (
            INSERT INTO jobs_job (tenant, key, action, subject_type, subject_id, payload, state, priority,
                                  attempts, max_attempts, first_attempt_at, recoveries, lease_epoch, worker_id,
                                  wait_reason, last_error, created_at, updated_at, finished_at, search_text)
            SELECT %(tenant)s, 'ret-' || g, 'jobs.noop', '', '', '{{"to": "someone@example.com"}}'::jsonb, 'DONE',
                   0, 1, 5, %(at)s, 0, 1, 'w', '', '', %(at)s, %(at)s, %(at)s + g * interval '1 ms', 'ret-' || g
            FROM generate_series(1, %(jobs)s) AS g
            RETURNING id, tenant, key, search_text)
            {SEARCH_ROWS_OF_INSERTED}
            """, {"tenant": tenant, "at": finished, "jobs": jobs})
        cursor.execute(
            """
            INSERT INTO jobs_jobevent (job_id, kind, from_state, to_state, epoch, worker_id, actor, reason,
                                       detail, created_at)
            SELECT j.id, 'bench', '', 'DONE', 1, 'w', '', '', '{}'::jsonb, j.finished_at
            FROM jobs_job j CROSS JOIN generate_series(1, %(events)s) AS n
            WHERE j.tenant = %(tenant)s
            """, {"tenant": tenant, "events": events})


def _settle() -> None:
    """After the loads: the table vacuumed and analysed once, as autovacuum
    would have it before a sweep."""
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) jobs_job")
        cursor.execute("ANALYZE jobs_jobevent")


def throughput(jobs: int, processes: int) -> float:
    """No-op jobs/s through `processes` real workers."""
    delete_tenants([TENANT_WORK])
    with WorkerFleet(processes, label="retention", poll_interval=0.5) as fleet:
        specs = [JobSpec(TENANT_WORK, f"work-{i:07d}", action=BENCH_ACTION) for i in range(jobs)]
        with transaction.atomic():
            Store().enqueue_many(specs)
        started = time.monotonic()
        wait_done(jobs, fleet)
        seconds = time.monotonic() - started
    delete_tenants([TENANT_WORK])
    return jobs / seconds


def start_prune(extra: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        # --redact-after-days as --days: no redaction, so other tenants' jobs
        # finished 7-399 days ago keep their payloads (JOBS_REDACT_AFTER_DAYS).
        [sys.executable, str(ROOT / "manage.py"), "prune", "--days", str(AGE_DAYS - 1),
         "--redact-after-days", str(AGE_DAYS - 1), "--json", *extra],
        cwd=ROOT, env={**os.environ, "DATABASE_URL": database_url()},
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def run(*, jobs: int, events: int, work: int, processes: int, history: str, prune_args: list[str],
        progress, kept: int = 0) -> list[str]:
    if connection.vendor != "postgresql":
        raise BenchError("bench_retention measures PostgreSQL (its rows are loaded with generate_series)")
    if others := _others_expired():
        raise BenchError(f"{others} job(s) of other tenants finished more than {AGE_DAYS - 1} days ago: "
                         f"the sweep would delete them too; not starting")
    partitioned = history_partitioned() and history == "partitions"
    delete_tenants([TENANT, TENANT_WORK, TENANT_KEPT])
    began = time.monotonic()
    if kept:
        progress(f"loading {kept:,} jobs finished {KEPT_AGE_DAYS} day(s) ago × {events} history rows, to keep …")
        load(kept, events, partitioned_history=partitioned, tenant=TENANT_KEPT, age_days=KEPT_AGE_DAYS)
    progress(f"loading {jobs:,} finished jobs × {events} history rows "
             f"({'day partitions' if partitioned else 'default partition / plain table'}) …")
    load(jobs, events, partitioned_history=partitioned)
    _settle()
    progress(f"loaded in {time.monotonic() - began:.0f} s; throughput before …")
    before = throughput(work, processes)
    progress(f"{before:.0f} jobs/s before; starting prune {' '.join(prune_args)} and the same work …")
    prune = start_prune(prune_args)
    during = throughput(work, processes)
    overlapped = prune.poll() is None
    out, _ = prune.communicate(timeout=3600)
    report = json.loads(out.strip().splitlines()[-1])
    deleted = report["deleted"].get("jobs.Job", 0)
    left = Job.objects.filter(tenant=TENANT).count()
    still_kept = Job.objects.filter(tenant=TENANT_KEPT).count()
    rate = deleted / report["seconds"] if report["seconds"] else 0.0
    lines = [
        f"Retention while {processes} worker process(es) run no-op jobs (PostgreSQL, "
        f"{jobs:,} jobs × {events} history rows to delete"
        + (f" in a table of {jobs + kept:,} jobs ({still_kept:,} of {kept:,} jobs finished yesterday kept)"
           if kept else "")
        + ", history in "
        f"{'day partitions: dropped whole' if partitioned else 'rows: deleted one by one'}):",
        f"  prune deleted {deleted:,} jobs and {report['deleted'].get('jobs.JobEvent', 0):,} history rows "
        f"in {report['seconds']:.1f} s: {rate:,.0f} jobs/s; partitions dropped "
        f"{len(report['partitions_dropped'])}; {left:,} left; ended: {report['stopped_by']}",
        f"  workers: {before:,.0f} jobs/s before, {during:,.0f} jobs/s during "
        f"({during / before:.0%} of before){'' if overlapped else ' — the prune ended before the workers did'}",
    ]
    if kept:
        # (Deleting them row by row takes a while: the figures first.)
        progress("\n".join(lines))
        progress(f"deleting the {kept:,} kept jobs (the figures above are final) …")
    delete_tenants([TENANT, TENANT_KEPT])
    return lines
