"""The console's part of `manage.py bench`: how long the jobs changelist takes
to answer with `--rows` jobs in the table (target: under 300 ms with
1,000,000 jobs on PostgreSQL) — no full COUNT(*), no DISTINCT, index-served
search.

Kept apart from the engine's sections; the run (`run.py`) calls it. It
shares their bulk loader, clean-up and table (`common.py`)."""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from .common import BULK_TENANTS, bulk_load, delete_tenants, table, tidy, verdict

TARGET_CHANGELIST_MS = 300.0
REQUESTS = 15


@dataclass
class ChangelistCase:
    label: str
    rows: int
    median_ms: float
    max_ms: float
    queries: int


def changelist_bench(rows: int, *, progress: Callable[[str], None]) -> list[ChangelistCase]:
    """Load `rows` DONE jobs over the bulk tenants, then time the jobs
    changelist as a superuser (every tenant in scope): plain, filtered by
    state, by tenant, and searched by a key prefix. Deletes its rows."""
    from django.contrib import admin
    from django.contrib.auth import get_user_model

    from jobs.models import Job

    progress(f"changelist: loading {rows:,} DONE rows")
    bulk_load("DONE", rows)
    tidy()
    try:
        total = Job.objects.count() if connection.vendor == "sqlite" else rows
        model_admin = admin.site._registry[Job]
        # An unsaved superuser: sees every tenant, writes nothing.
        user = get_user_model()(username="bench-console", is_superuser=True, is_staff=True, is_active=True)
        factory = RequestFactory()
        cases = []
        for label, query in [("all jobs, newest first", {}),
                             ("state = DONE", {"state__exact": "DONE"}),
                             ("one tenant", {"tenant": BULK_TENANTS[7]}),
                             ("key search (prefix)", {"q": "bulk-done-4242"})]:
            progress(f"changelist: {REQUESTS} requests, {label}")
            timings, queries = [], 0
            for _ in range(REQUESTS + 2):  # two warm-ups
                request = factory.get("/admin/jobs/job/", query)
                request.user = user
                with CaptureQueriesContext(connection) as captured:
                    started = time.perf_counter()
                    response = model_admin.changelist_view(request)
                    response.render()
                    elapsed = (time.perf_counter() - started) * 1000
                if response.status_code != 200:
                    raise RuntimeError(f"changelist {query} answered {response.status_code}")
                timings.append(elapsed)
                queries = len(captured)
            timings = timings[2:]
            cases.append(ChangelistCase(label, total, statistics.median(timings), max(timings), queries))
        return cases
    finally:
        delete_tenants(BULK_TENANTS)


def render_changelist(cases: list[ChangelistCase]) -> list[str]:
    """The section's lines for the bench table."""
    if not cases:
        return []
    lines = [f"JOBS CHANGELIST (admin, as a superuser): median of {REQUESTS} requests with "
             f"{cases[0].rows:,} jobs in the table"]
    lines += table(["", "median ms", "max ms", "queries", f"< {TARGET_CHANGELIST_MS:.0f} ms"],
                   [[c.label, f"{c.median_ms:.1f}", f"{c.max_ms:.1f}", str(c.queries),
                     verdict(c.median_ms < TARGET_CHANGELIST_MS)] for c in cases])
    return [*lines, ""]
