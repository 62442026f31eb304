"""The text search is served by the trigram index on PostgreSQL (DESIGN
§16: index-served; `manage.py bench` measures it at size): the queues'
search, and the job list's, whose READY and LEASED rows (left out of that
index) are found by the key-prefix index instead."""

import pytest
from django.db import connection

from jobs.models import Job
from jobs.search import jobs_matching

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]



STATES = ["WAITING_REVIEW", "NEEDS_ATTENTION", "DONE", "READY", "LEASED", "WAITING_EXTERNAL"]


@pytest.fixture
def table_with_rows(db):
    """A few thousand rows, each state, with statistics: the planner then
    chooses by cost, as it does on a large table."""
    Job.objects.bulk_create([
        Job(tenant="studio", key=f"job-{n}", state=STATES[n % len(STATES)],
            search_text=f"job-{n}\ncustomer-{n}@example.com\nagent:{n % 20}") for n in range(6000)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")


def plan_of(query) -> str:
    with connection.cursor() as cursor:
        # A few thousand rows are read faster whole, or through the state
        # indexes: forbid the table scan and set those indexes aside (DDL is
        # transactional: the test's rollback brings them back) to see what
        # serves the match itself. `manage.py bench` plans it at 1M rows.
        cursor.execute("SET LOCAL enable_seqscan = off")
        for competitor in ("job_state_tenant", "job_proposer", "job_queue_order", "job_waiting_wake"):
            cursor.execute(f"DROP INDEX {competitor}")
        sql, params = query.query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_a_queue_search_is_planned_on_the_trigram_index(table_with_rows):
    plan = plan_of(jobs_matching(Job.objects.filter(state="WAITING_REVIEW"), "Customer-4242@"))
    assert "job_search_queue_trgm" in plan and "Seq Scan" not in plan, plan


def test_the_job_lists_search_is_planned_on_the_trigram_and_key_prefix_indexes(table_with_rows):
    plan = plan_of(jobs_matching(Job.objects.all(), "Customer-4242@", every_state=True))
    assert {"job_search_queue_trgm", "job_search_rest_trgm", "job_key_prefix"} <= set(plan.split()), plan
    assert "Seq Scan" not in plan, plan
