"""The text search is served by trigram indexes on PostgreSQL (DESIGN §16:
index-served; `manage.py bench` measures it at size): the queues' search by
the queues' own index on jobs_job, the job list's by the search rows'
(`jobs.JobSearch`, every state), and the key lookups that know no tenant by
the search rows' key index. A worker's claim and finish write nothing into
the search rows (jobs.search says why)."""

import uuid
from collections import Counter

import pytest
from django.contrib import admin
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from jobs.models import Job, JobSearch
from jobs.search import jobs_matching
from jobs.store import JobSpec, Store
from jobs.tasks_backend import _job_of
from jobs.worker import Worker, WorkerConfig

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]



STATES = ["WAITING_REVIEW", "NEEDS_ATTENTION", "DONE", "READY", "LEASED", "WAITING_EXTERNAL"]


@pytest.fixture
def table_with_rows(db):
    """A few thousand rows, each state, each with its search row, with
    statistics: the planner then chooses by cost, as it does on a large table."""
    jobs = Job.objects.bulk_create([
        Job(tenant="studio", key=f"job-{n}", state=STATES[n % len(STATES)],
            search_text=f"job-{n}\ncustomer-{n}@example.com\nagent:{n % 20}") for n in range(6000)])
    JobSearch.objects.bulk_create([JobSearch(job=job, tenant=job.tenant, key=job.key, search_text=job.search_text)
                                   for job in jobs])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
        cursor.execute("ANALYZE jobs_jobsearch")


def explain(sql: str, params=()) -> str:
    with connection.cursor() as cursor:
        # A few thousand rows are read faster whole — by the table, or by
        # walking a primary key in order with a filter — or through the state
        # indexes: forbid the table scan and plain index scans (bitmap scans,
        # the only ones a trigram index offers, remain) and set those indexes
        # aside (DDL is transactional: the test's rollback brings them back)
        # to see what serves the match itself. `manage.py bench` plans it at 1M rows.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        for competitor in ("job_state_tenant", "job_proposer", "job_queue_order", "job_waiting_wake"):
            cursor.execute(f"DROP INDEX IF EXISTS {competitor}")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def plan_of(query) -> str:
    return explain(*query.query.sql_with_params())


def test_a_queue_search_is_planned_on_the_trigram_index(table_with_rows):
    plan = plan_of(jobs_matching(Job.objects.filter(state="WAITING_REVIEW"), "Customer-4242@"))
    assert "job_search_queue_trgm" in plan and "Seq Scan" not in plan, plan


def test_the_job_lists_search_is_planned_on_the_search_rows_trigram_index(table_with_rows):
    plan = plan_of(jobs_matching(Job.objects.all(), "Customer-4242@", every_state=True))
    # The search rows' matches, then their jobs by primary key.
    assert {"jobsearch_text_trgm", "jobs_job_pkey"} <= set(plan.split()), plan
    assert "Seq Scan" not in plan, plan


def test_the_key_lookups_without_a_tenant_are_planned_on_the_search_rows_key_index(table_with_rows, admin_user):
    Store().enqueue("acme", "xy-1")
    request = RequestFactory().get("/admin/jobs/job/", {"q": "xy"})
    request.user = admin_user
    short_term, _ = admin.site._registry[Job].get_search_results(request, Job.objects.all(), "xy")
    assert "jobsearch_key_prefix" in plan_of(short_term)
    with CaptureQueriesContext(connection) as captured:
        assert _job_of(str(uuid.uuid4())) is None
    plan = explain(captured[-1]["sql"])
    assert "jobsearch_key_prefix" in plan and "Seq Scan" not in plan, plan


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("batch", [1, 10])
def test_a_workers_claims_and_finishes_write_nothing_into_the_search_rows(batch):
    """Behaviour, not timing: every row written into jobs_jobsearch while the
    jobs are created and then run is counted by a trigger (an index entry
    is only ever added with a row version)."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE test_search_writes (op text)")
        cursor.execute("CREATE FUNCTION test_search_write() RETURNS trigger LANGUAGE plpgsql AS $$ "
                       "BEGIN INSERT INTO test_search_writes VALUES (TG_OP); RETURN NULL; END $$")
        cursor.execute("CREATE TRIGGER test_search_write AFTER INSERT OR UPDATE OR DELETE ON jobs_jobsearch "
                       "FOR EACH ROW EXECUTE FUNCTION test_search_write()")

    def writes() -> Counter:
        with connection.cursor() as cursor:
            cursor.execute("SELECT op FROM test_search_writes")
            return Counter(op for (op,) in cursor.fetchall())

    try:
        Store().enqueue_many(JobSpec("studio", f"noop-{n}") for n in range(30))
        Store().enqueue("studio", "noop-one")
        assert writes() == {"INSERT": 31}
        Worker(WorkerConfig(worker_id="w1", until_idle=True, poll_interval=0.05, concurrency=2, batch=batch)).run()
        assert Job.objects.filter(tenant="studio", state="DONE").count() == 31
        assert writes() == {"INSERT": 31}
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS test_search_write ON jobs_jobsearch")
            cursor.execute("DROP FUNCTION IF EXISTS test_search_write()")
            cursor.execute("DROP TABLE IF EXISTS test_search_writes")
