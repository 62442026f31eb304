"""The console queues' part of `manage.py bench`: how long the review queue,
its text search and filters, the attention queue, the job list's search and
a bulk preview take with `rows` jobs in the table (target: under 300 ms
with 1,000,000 jobs on PostgreSQL, DESIGN §16) — and one bulk approve of
`BULK_ITEMS` items through the single-decision path: its time and number of
queries.

The table holds `rows` jobs over the bulk tenants: 90 % DONE, 8 % waiting
for review, 2 % needing attention, each with a search text shaped like an
email action's (recipient, subject, proposer), waiting since up to ten days.
Deletes its rows (and its user) after."""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection, transaction
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from .common import (BULK_TENANTS, SEARCH_ROWS_OF_INSERTED, delete_tenants, search_rows_add, search_rows_mark,
                           table, tidy, verdict)

TARGET_QUEUE_MS = 300.0
REQUESTS = 9
BULK_ITEMS = 500
BENCH_USER = "bench-console-queues"


@dataclass
class QueueCase:
    label: str
    rows: int
    median_ms: float
    max_ms: float
    queries: int
    matched: int | None = None


@dataclass
class BulkCase:
    items: int
    decided: int
    preview_ms: float
    seconds: float
    queries: int


def _state_sql(g: str) -> str:
    return (f"CASE WHEN {g} %% 50 = 0 THEN 'NEEDS_ATTENTION' WHEN {g} %% 50 < 5 THEN 'WAITING_REVIEW' "
            f"ELSE 'DONE' END")


def queue_load(rows: int) -> None:
    """`rows` jobs over the bulk tenants (see the module's docstring), each
    with its search row as the Store writes it: one INSERT … SELECT on
    PostgreSQL, chunked executemany on SQLite."""
    table_name = "jobs_job"
    columns = ("tenant, key, action, subject_type, subject_id, payload, state, priority, attempts, max_attempts, "
               "recoveries, lease_epoch, worker_id, wait_reason, wait_provider, last_error, created_at, updated_at, "
               "finished_at, proposed_by, search_text")
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            state = _state_sql("g")
            cursor.execute(f"""
                WITH inserted AS (
                INSERT INTO {table_name} ({columns})
                SELECT 'bench-bulk-' || lpad(((g / 7) %% {len(BULK_TENANTS)})::text, 2, '0'), 'bench-queue-' || g,
                       'jobs.noop', 'company.invoice', g::text, '{{}}'::jsonb, {state}, 0, 1, 5, 0, 1, '',
                       'bench: check the reminder', '', '', now() - (g %% 240) * interval '1 hour',
                       now() - (g %% 240) * interval '1 hour',
                       CASE WHEN {state} = 'DONE' THEN now() END, 'agent:bench-' || (g %% 20),
                       'bench-queue-' || g || E'\\ncompany.invoice:' || g || E'\\nagent:bench-' || (g %% 20)
                       || E'\\ncustomer-' || g || '@example.com' || E'\\nreminder: invoice inv-' || g
                FROM generate_series(1, %s) AS g
                RETURNING id, tenant, key, search_text)
                {SEARCH_ROWS_OF_INSERTED}""", [rows])
            return
        from datetime import timedelta

        from django.utils import timezone

        now = timezone.now()
        insert = f"INSERT INTO {table_name} ({columns}) VALUES ({', '.join(['%s'] * 21)})"
        loaded_after = search_rows_mark(cursor)
        for start in range(0, rows, 10_000):
            batch = []
            for g in range(start + 1, min(rows, start + 10_000) + 1):
                state = "NEEDS_ATTENTION" if g % 50 == 0 else "WAITING_REVIEW" if g % 50 < 5 else "DONE"
                at = connection.ops.adapt_datetimefield_value(now - timedelta(hours=g % 240))
                batch.append((BULK_TENANTS[(g // 7) % len(BULK_TENANTS)], f"bench-queue-{g}", "jobs.noop",
                              "company.invoice", str(g), "{}", state, 0, 1, 5, 0, 1, "", "bench: check the reminder",
                              "", "", at, at, at if state == "DONE" else None, f"agent:bench-{g % 20}",
                              f"bench-queue-{g}\ncompany.invoice:{g}\nagent:bench-{g % 20}\n"
                              f"customer-{g}@example.com\nreminder: invoice inv-{g}"))
            cursor.executemany(insert, batch)
        search_rows_add(cursor, loaded_after)


def _timed(view, path: str, query: dict, user) -> tuple[float, int, object]:
    request = RequestFactory().get(path, query)
    request.user = user
    with CaptureQueriesContext(connection) as captured:
        started = time.perf_counter()
        response = view(request)
        if hasattr(response, "render"):
            response.render()
        elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"{path} {query} answered {response.status_code}")
    return elapsed, len(captured), response


def queues_bench(rows: int, *, progress: Callable[[str], None]) -> tuple[list[QueueCase], BulkCase | None]:
    """Load `rows` jobs, time the queue pages as a superuser, then one bulk
    approve of `BULK_ITEMS` items; delete everything it made."""
    from django.contrib import admin
    from django.contrib.auth import get_user_model
    from django.urls import resolve

    from jobs.models import DecisionBatch, Job

    user_model = get_user_model()
    user_model.objects.filter(username=BENCH_USER).delete()
    user = user_model.objects.create(username=BENCH_USER, is_superuser=True, is_staff=True, is_active=True)
    progress(f"queues: loading {rows:,} jobs (8 % waiting for review, 2 % needing attention)")
    queue_load(rows)
    tidy()
    try:
        total = Job.objects.count() if connection.vendor == "sqlite" else rows
        picked = rows // 2 - (rows // 2) % 50 + 3  # a waiting-for-review row in the middle of the table
        job_list = admin.site._registry[Job].changelist_view
        # The console's pages through the URLconf (this app names no module
        # of the console; the pages are what a person opens).
        review, attention = resolve("/admin/console/review/").func, resolve("/admin/console/attention/").func
        cases = []
        for label, view, path, query in [
            ("review queue, first page", review, "/admin/console/review/", {}),
            ("review: q = one recipient (1 match)", review, "/admin/console/review/",
             {"q": f"CUSTOMER-{picked}@example.com"}),
            ("review: q = a proposer (1 in 20)", review, "/admin/console/review/",
             {"q": "agent:bench-13"}),
            ("review: proposer filter", review, "/admin/console/review/",
             {"proposer": "agent:bench-3"}),
            ("review: waiting longer than 7 days", review, "/admin/console/review/", {"age": "7d"}),
            ("review: assigned to me", review, "/admin/console/review/", {"assignee": "me"}),
            ("review: tenant + age, page 3", review, "/admin/console/review/",
             {"tenant": BULK_TENANTS[3], "age": "1d", "page": "3"}),
            ("attention queue, first page", attention, "/admin/console/attention/", {}),
            ("job list: q = one recipient", job_list, "/admin/jobs/job/", {"q": f"customer-{picked}@example"}),
            # A finished job's: the one above waits for review, where the
            # queues' own index can answer.
            ("job list: q = a finished job's recipient", job_list, "/admin/jobs/job/",
             {"q": f"customer-{picked + 4}@example"}),
            ("job list: q = a proposer (1 in 20)", job_list, "/admin/jobs/job/", {"q": "agent:bench-13"}),
        ]:
            progress(f"queues: {REQUESTS} requests, {label}")
            timings, count, matched = [], 0, None
            for _ in range(REQUESTS + 2):  # two warm-ups
                elapsed, count, response = _timed(view, path, query, user)
                timings.append(elapsed)
            context = response.context_data if hasattr(response, "context_data") else {}
            page, changelist = context.get("page"), context.get("cl")
            matched = (page.paginator.count if page is not None
                       else changelist.result_count if changelist is not None else None)
            timings = timings[2:]
            cases.append(QueueCase(label, total, statistics.median(timings), max(timings), count, matched))
        return cases, _bulk_case(user, progress)
    finally:
        DecisionBatch.objects.filter(user=user).delete()
        delete_tenants(BULK_TENANTS)
        user.delete()


def _bulk_case(user, progress) -> BulkCase:
    """`BULK_ITEMS` proposals (enqueued as an agent's are), previewed by a
    search and approved in one bulk decision through the single path."""
    from django.urls import resolve

    from jobs.store import Store
    from review import bulk

    progress(f"queues: {BULK_ITEMS} proposals for one bulk approve")
    store = Store()
    for n in range(BULK_ITEMS):
        store.enqueue_once(BULK_TENANTS[n % len(BULK_TENANTS)], f"bench-bulk500-{n}", actor="agent:bench-bulk",
                           reason="bench: approve in bulk", review="bench: approve in bulk")
    started = time.perf_counter()
    _, _, response = _timed(resolve("/admin/console/review/bulk/").func, "/admin/console/review/bulk/",
                            {"q": "bench-bulk500-"}, user)
    batch = response.context_data["batch"]
    preview_ms = (time.perf_counter() - started) * 1000
    progress(f"queues: bulk approve of {len(batch.items)} items")
    with CaptureQueriesContext(connection) as captured:
        started = time.perf_counter()
        taken = bulk.batch_take(token=batch.token, user=user, decision="approve", note="bench: bulk approve")
        seconds = time.perf_counter() - started
    return BulkCase(len(batch.items), taken.decided, preview_ms, seconds, len(captured))


def render_queues(cases: list[QueueCase], bulk_case: BulkCase | None) -> list[str]:
    """The section's lines for the bench table."""
    if not cases:
        return []
    lines = [f"CONSOLE QUEUES (as a superuser): median of {REQUESTS} requests with {cases[0].rows:,} jobs in "
             f"the table ({cases[0].rows * 8 // 100:,} waiting for review)"]
    lines += table(["", "matched", "median ms", "max ms", "queries", f"< {TARGET_QUEUE_MS:.0f} ms"],
                   [[c.label, f"{c.matched:,}" if c.matched is not None else "—", f"{c.median_ms:.1f}",
                     f"{c.max_ms:.1f}", str(c.queries), verdict(c.median_ms < TARGET_QUEUE_MS)] for c in cases])
    if bulk_case:
        lines.append(f"  bulk approve of {bulk_case.items} items through the single-decision path: "
                     f"{bulk_case.decided} decided in {bulk_case.seconds:.2f} s "
                     f"({bulk_case.seconds * 1000 / max(1, bulk_case.items):.1f} ms/item), "
                     f"{bulk_case.queries} queries ({bulk_case.queries / max(1, bulk_case.items):.1f}/item); "
                     f"preview {bulk_case.preview_ms:.0f} ms")
    return [*lines, ""]
