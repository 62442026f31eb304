"""One `manage.py bench` run: every section in turn on the configured
database, cleaned up before and after (`bench_cleanup`), also when a
section fails."""

import os
import platform
from collections.abc import Callable

from django.db import connection
from django.utils import timezone

from .changelist import changelist_bench
from .claims import BACKLOG_CLAIMS, claim_vs_backlog, claim_vs_size, claim_vs_tenants
from .common import BENCH_TENANTS, REFERENCE_TABLE, BenchError, delete_tenants
from .figures import BenchConfig, Results
from .latency import latency_rows
from .queues import queues_bench
from .peers import enqueue_vs_pgqueuer, pgqueuer_missing
from .recovery import recovery_rows
from .throughput import enqueue_rates, throughput_all


def bench_run(config: BenchConfig, *, progress: Callable[[str], None] = lambda message: None) -> Results:
    """Run every section on the configured database and return the figures.
    Cleans up its tenants and its reference table before and after, also when
    a section fails (the error is raised after the cleanup)."""
    if connection.vendor not in ("postgresql", "sqlite"):
        raise BenchError(f"the benchmark supports PostgreSQL and SQLite, not {connection.vendor}")
    results = Results(header=_header(config))
    progress("removing leftovers of an earlier bench run")
    bench_cleanup()
    try:
        queue_rows = config.rows if config.queue_rows is None else config.queue_rows
        if config.queues_only:
            results.queues, results.bulk = queues_bench(queue_rows, progress=progress)
            return results
        progress("enqueue rate")
        results.enqueue = enqueue_rates(config)
        if config.peer_jobs:
            if missing := pgqueuer_missing():
                results.notes.append(missing)
            else:
                results.enqueue_peers = enqueue_vs_pgqueuer(config.peer_jobs, config.repeat, progress)
        throughput_all(config, results, progress)
        progress(f"insert→start latency: {config.latency_jobs} jobs, {config.latency_workers} idle workers")
        results.latency = latency_rows(config, results)
        results.latency_workers = config.latency_workers
        results.latency_interval_ms = config.latency_interval_ms
        progress("recovery after kill -9 of a worker mid-handler")
        results.recovery = recovery_rows(config.repeat)
        results.claim_count = config.claims
        progress(f"claim time: one tenant vs {config.claim_tenants:,} tenants")
        results.tenant_claims = claim_vs_tenants(config)
        if config.backlog:
            results.backlog_claims = claim_vs_backlog(config, progress)
            results.backlog_claim_count = min(config.claims, BACKLOG_CLAIMS)
        progress("claim time vs table size")
        results.claims = claim_vs_size(config, progress)
        if not config.skip_bulk:
            results.changelist = changelist_bench(config.rows, progress=progress)
        if queue_rows:
            results.queues, results.bulk = queues_bench(queue_rows, progress=progress)
    finally:
        progress("cleaning up the bench's rows and reference table")
        bench_cleanup()
    return results


def bench_cleanup() -> None:
    """Delete every row of the bench's tenants (and their history) and drop
    the reference table. Exact tenant names only: a user's data is never
    matched by accident. Bench jobs are `jobs.noop`, so they own no timers,
    operations or inbound events; should one ever exist, the foreign key
    refuses the delete instead of leaving orphans."""
    delete_tenants(BENCH_TENANTS)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {REFERENCE_TABLE}")


def _header(config: BenchConfig) -> list[str]:
    s = connection.settings_dict
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
            version = f"PostgreSQL {cursor.fetchone()[0]}"
            cursor.execute("SHOW autovacuum")
            version += f" (autovacuum {cursor.fetchone()[0]}; each end-to-end row starts after a plain VACUUM)"
            where = f"{s.get('HOST') or 'local socket'}:{s.get('PORT') or 5432}/{s['NAME']}"
        else:
            cursor.execute("SELECT sqlite_version()")
            version = f"SQLite {cursor.fetchone()[0]}"
            where = str(s["NAME"])
    cpus = os.cpu_count() or 1
    lines = [
        f"durable-workers bench — {version} at {where}",
        f"host: {cpus} CPU(s) (os.cpu_count()), Python {platform.python_version()}, "
        f"{timezone.now():%Y-%m-%d %H:%M} UTC",
        f"sizes: --jobs {config.jobs}  --rows {config.rows}{' (skipped)' if config.skip_bulk else ''}  "
        f"--processes {','.join(map(str, config.processes))}  --latency-jobs {config.latency_jobs}  "
        f"--claims {config.claims}  --tenants {','.join(map(str, config.tenants)) or 'none'}  "
        f"--batches {','.join(map(str, config.batches)) or 'none'}  --batch-jobs {config.batch_jobs}  "
        f"--claim-tenants {config.claim_tenants}  --peer-jobs {','.join(map(str, config.peer_jobs)) or 'none'}",
    ]
    lines.append(
        f"connections: CONN_MAX_AGE={s.get('CONN_MAX_AGE', 0)!r}, "
        f"CONN_HEALTH_CHECKS={s.get('CONN_HEALTH_CHECKS', False)!r} (passed on to the workers)"
    )
    if max(config.processes) > cpus:
        lines.append(
            f"note: only {cpus} CPU(s), shared by the workers and the database server: rows with more "
            "processes than CPUs measure contention, not scaling."
        )
    return lines
