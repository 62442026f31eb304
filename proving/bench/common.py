"""What the benchmark's sections share: the names of its own tenants, action
and reference table, loading, deleting and tidying their rows, and the
plain-text table the figures are printed in."""

import json
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from jobs.models import Job, JobEvent, JobSearch, ReadyTenant, ReviewDeadline

# Bulk rows are spread over many tenants, as a production table's are.
BULK_TENANTS = [f"bench-bulk-{i:02d}" for i in range(50)]
TENANT_ENQUEUE = "bench-enqueue"
TENANT_E2E = "bench-e2e"
TENANT_LATENCY = "bench-latency"
TENANT_CLAIM = "bench-claim"
TENANT_RECOVERY = "bench-recovery"
# The many-tenant rows (end to end and claim time) use the first N of these.
MANY_TENANTS = [f"bench-many-{i:05d}" for i in range(10_000)]
BENCH_TENANTS = [TENANT_ENQUEUE, TENANT_E2E, TENANT_LATENCY, TENANT_CLAIM, TENANT_RECOVERY, *BULK_TENANTS,
                 *MANY_TENANTS]
BENCH_ACTION = "jobs.bench_noop"
REFERENCE_TABLE = "bench_reference_jobs"

ROOT = Path(settings.BASE_DIR)


class BenchError(Exception):
    """The benchmark could not complete a measurement (a worker died, jobs
    did not finish in time, an unsupported database)."""


# ---------------------------------------------------------------- the bench's rows


def delete_tenants(tenants: list[str]) -> None:
    """Delete the jobs of exactly these tenants, their history, search rows,
    review clocks and ready-tenant rows, a thousand tenants per transaction."""
    for start in range(0, len(tenants), 1000):
        chunk = tenants[start : start + 1000]
        with transaction.atomic(), connection.cursor() as cursor:
            tenants_sql, params = in_list(chunk)
            ids = f"SELECT id FROM {Job._meta.db_table} WHERE tenant IN ({tenants_sql})"
            jobs, job_params = f"IN ({ids})", params
            if connection.vendor == "postgresql":
                # The ids as one array constant, not a subquery or a set to
                # join: the bench vacuums between rows, so the statistics of
                # a table it just filled can say it is empty, and a join is
                # then planned as a nested loop that goes through every id
                # for each of the table's rows. `= ANY` of a constant is a
                # filter or an index condition, hashed once, whatever the
                # estimates.
                cursor.execute(ids, params)
                jobs, job_params = "= ANY(%s::bigint[])", [[row[0] for row in cursor.fetchall()]]
            for table in (JobEvent._meta.db_table, JobSearch._meta.db_table, ReviewDeadline._meta.db_table):
                cursor.execute(f"DELETE FROM {table} WHERE job_id {jobs}", job_params)
            cursor.execute(f"DELETE FROM {Job._meta.db_table} WHERE tenant IN ({tenants_sql})", params)
            cursor.execute(f"DELETE FROM {ReadyTenant._meta.db_table} WHERE tenant IN ({tenants_sql})", params)


def in_list(values: list[str]) -> tuple[str, list[str]]:
    """Placeholders and parameters for `IN (…)` over `values`."""
    return ", ".join(["%s"] * len(values)), list(values)


def bulk_load(state: str, rows: int) -> None:
    """`rows` jobs in `state`, spread over the bulk tenants, each with its
    search row as the Store writes it (the key is its whole search text):
    one server-side INSERT … SELECT on PostgreSQL, chunked executemany on
    SQLite. Half of the WAITING rows have a wake-up time a month away (timers
    that have not come due)."""
    waiting = state.startswith("WAITING")
    reason = "bench: waiting for a reply" if waiting else ""
    table = Job._meta.db_table
    columns = (
        "tenant, key, action, subject_type, subject_id, payload, state, priority, attempts, max_attempts, "
        "first_attempt_at, recoveries, lease_epoch, worker_id, wait_reason, wake_at, last_error, "
        "created_at, updated_at, finished_at, search_text"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"""
                WITH inserted AS (
                INSERT INTO {table} ({columns})
                SELECT 'bench-bulk-' || lpad((g %% {len(BULK_TENANTS)})::text, 2, '0'), %(prefix)s || g,
                       'jobs.noop', '', '', '{{}}'::jsonb, %(state)s, 0, 1, 5,
                       now() - interval '1 hour', 0, 1, '', %(reason)s,
                       CASE WHEN %(waiting)s AND g %% 2 = 0 THEN now() + interval '30 days' END, '',
                       now() - interval '1 hour', now(), CASE WHEN %(done)s THEN now() END, %(prefix)s || g
                FROM generate_series(1, %(rows)s) AS g
                RETURNING id, tenant, key, search_text)
                {SEARCH_ROWS_OF_INSERTED}
                """,
                {"prefix": f"bulk-{state.lower()}-", "state": state, "reason": reason, "waiting": waiting,
                 "done": state == "DONE", "rows": rows},
            )
            return
        now = timezone.now()
        hour_ago = connection.ops.adapt_datetimefield_value(now - timedelta(hours=1))
        wake = connection.ops.adapt_datetimefield_value(now + timedelta(days=30))
        stamp = connection.ops.adapt_datetimefield_value(now)
        insert = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * 21)})"
        chunk = 10_000
        loaded_after = search_rows_mark(cursor)
        for start in range(0, rows, chunk):
            cursor.executemany(insert, [
                (BULK_TENANTS[g % len(BULK_TENANTS)], f"bulk-{state.lower()}-{g}", "jobs.noop", "", "", "{}",
                 state, 0, 1, 5, hour_ago, 0, 1, "", reason, wake if waiting and g % 2 == 0 else None, "",
                 hour_ago, stamp, stamp if state == "DONE" else None, f"bulk-{state.lower()}-{g}")
                for g in range(start + 1, min(rows, start + chunk) + 1)
            ])
        search_rows_add(cursor, loaded_after)


# The search rows (jobs.JobSearch) of the jobs a data-modifying CTE named
# `inserted` (RETURNING id, tenant, key, search_text) has just inserted:
# PostgreSQL's loaders write them in the same statement, as enqueue_many does.
_SEARCH_ROWS_FROM = (f"INSERT INTO {JobSearch._meta.db_table} (job_id, tenant, key, search_text) "
                     "SELECT id, tenant, key, search_text FROM {source}")
SEARCH_ROWS_OF_INSERTED = _SEARCH_ROWS_FROM.format(source="inserted")


def search_rows_mark(cursor) -> int:
    """The highest job id before a load (SQLite: `search_rows_add` then
    copies the rows after it, which the load's transaction alone wrote)."""
    cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {Job._meta.db_table}")
    return cursor.fetchone()[0]


def search_rows_add(cursor, loaded_after: int) -> None:
    """The search rows of the jobs loaded since `search_rows_mark`, in one
    INSERT … SELECT."""
    cursor.execute(_SEARCH_ROWS_FROM.format(source=f"{Job._meta.db_table} WHERE id > %s"), [loaded_after])


def tidy() -> None:
    """Bring the table to the state autovacuum keeps a production table in:
    planner statistics current (after a 1M-row load they would not be yet,
    and the figure would measure a stale plan rather than the claim) and no
    dead rows left by the bench's own deletes. Plain VACUUM takes no lock that
    blocks other sessions' reads or writes. SQLite: ANALYZE only (its VACUUM
    rewrites the whole file)."""
    with connection.cursor() as cursor:
        for name in (Job._meta.db_table, JobSearch._meta.db_table):
            cursor.execute(f"VACUUM (ANALYZE) {name}" if connection.vendor == "postgresql" else f"ANALYZE {name}")


def vacuum() -> None:
    """Plain VACUUM of the job, search and history tables (PostgreSQL): a
    bench row starts on a table without the previous row's dead rows, as it
    would with autovacuum on. It takes no lock that blocks reads or writes."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM {Job._meta.db_table}, {JobSearch._meta.db_table}, {JobEvent._meta.db_table}, "
                       f"{ReadyTenant._meta.db_table}")


def analyzed_plan(sql: str, params, *, settings: tuple[str, ...] = ()) -> dict:
    """The top node of `sql`'s plan as PostgreSQL runs it (EXPLAIN (ANALYZE,
    BUFFERS, FORMAT JSON)), in a transaction that is rolled back: what the
    statement would write is not kept. `settings` are `SET LOCAL`
    statements run first."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            for setting in settings:
                cursor.execute(setting)
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
            plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return plan[0]["Plan"]


# ---------------------------------------------------------------- the table


def verdict(ok: bool) -> str:
    """A figure against its target: `ok` or `MISS`."""
    return "ok" if ok else "MISS"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """Rows under a header, the first column left-aligned, the others right."""
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = []
    for r in [head, *rows]:
        cells = [str(c).ljust(widths[0]) if i == 0 else str(c).rjust(widths[i]) for i, c in enumerate(r)]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


# ---------------------------------------------------------------- figures


def percentile(samples: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (NaN when empty)."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def in_turns(round_number: int, sides: tuple) -> tuple:
    """The order `sides` run in, in round `round_number` (from 0) of runs
    side by side: as given, then reversed, and so on — what both the
    end-to-end pairs and the claim-time rounds follow."""
    return sides if round_number % 2 == 0 else sides[::-1]
