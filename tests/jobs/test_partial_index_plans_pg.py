"""The sweeps an idle worker runs on every pass are served by their partial
indexes in any plan PostgreSQL may choose — also the generic plan of a
prepared statement, which psycopg uses for a query run five times and which
PostgreSQL picks when it looks no dearer (statistics of an empty table)."""

import re

import pytest
from django.db import connection
from django.utils import timezone

from jobs.selectors import eligible_ready, expired_leases, timers_due

pytestmark = [pytest.mark.django_db, pytest.mark.postgres,
              pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL (generic plans)")]


def _generic_plan(queryset) -> str:
    """The plan PostgreSQL keeps for `queryset` as a prepared statement
    (its values bound, not written in), with sequential scans priced out:
    the index it then reads is the one a plan can use at all."""
    sql, params = queryset.query.sql_with_params()
    numbered = sql
    for n in range(1, len(params) + 1):
        numbered = numbered.replace("%s", f"${n}", 1)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"PREPARE sweep AS {numbered}")
        try:
            # (EXPLAIN takes no bound parameters: the values are written in.)
            cursor.execute(connection.ops.compose_sql(f"EXPLAIN EXECUTE sweep({', '.join(['%s'] * len(params))})",
                                                      params))
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE sweep")


@pytest.mark.parametrize("sweep, indexes", [
    (lambda at: expired_leases(at=at), ("job_leased_expiry",)),
    (lambda at: timers_due(at=at), ("timer_pending_due",)),
    (lambda at: eligible_ready(at=at), ("job_claim_tenant",)),
])
def test_a_sweep_reads_its_partial_index_in_a_generic_plan(sweep, indexes):
    plan = _generic_plan(sweep(timezone.now()))
    # ("Index Scan using …", "Bitmap Index Scan on …")
    assert any(re.search(rf"(using|on) {index}\b", plan) for index in indexes), plan
