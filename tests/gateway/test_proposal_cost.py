"""What a new proposal costs the database: its statements, counted, so a
read that is not needed cannot come back unnoticed (`manage.py
bench_gateway` measures the time beside a minimal POST)."""

from django.db import connection
from django.test.utils import CaptureQueriesContext

from gateway.models import AgentProposal
from jobs.models import Job

# Per database: PostgreSQL draws the job's id from its sequence first.
NEW_PROPOSAL_STATEMENTS = {"postgresql": 25, "sqlite": 23}


def test_a_new_proposal_costs_its_known_statements_and_no_more(api):
    assert api.propose("warm-up").status_code == 201  # the key's last use is recorded once a minute
    with CaptureQueriesContext(connection) as queries:
        response = api.propose("send-1")
    assert response.status_code == 201 and response.json()["decision"] is None
    assert Job.objects.filter(key="send-1").exists() and AgentProposal.objects.filter(job_key="send-1").exists()
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) == NEW_PROPOSAL_STATEMENTS[connection.vendor], "\n".join(s[:120] for s in statements)
