"""The queues' text search is served by the trigram index on PostgreSQL
(DESIGN §16: index-served; `manage.py bench` measures it at size)."""

import pytest
from django.db import connection

from jobs.models import Job
from jobs.search import jobs_matching

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def test_a_text_search_is_planned_on_the_trigram_index():
    query = jobs_matching(Job.objects.all(), "Dave@Example")
    with connection.cursor() as cursor:
        # An empty test table: forbid the scans the planner would rightly
        # prefer there, to see which index can serve the match at all.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        sql, params = query.query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "job_search_trgm" in plan, plan
    assert "%dave@example%" in str(params)
