"""The enqueue rows beside pgqueuer, run for real on PostgreSQL when
pgqueuer (the optional `peers` extra) is installed: both sides enqueue the
same number of jobs in turns, and the bench leaves neither its jobs nor
pgqueuer's scratch database behind."""

import psycopg
import pytest
from django.db import connection

from jobs.models import Job, JobEvent
from proving.bench.common import TENANT_ENQUEUE
from proving.bench.peers import enqueue_vs_pgqueuer

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_the_peer_rows_run_both_sides_in_turns_and_leave_nothing_behind():
    pytest.importorskip("pgqueuer")
    progress = []
    rows = enqueue_vs_pgqueuer([40, 60], 2, progress.append)
    assert [(row.peer, row.jobs) for row in rows] == [
        ("pgqueuer, a dedupe key per job", 40), ("pgqueuer, no keys", 40),
        ("pgqueuer, a dedupe key per job", 60), ("pgqueuer, no keys", 60)]
    for row in rows:
        assert len(row.ours) == len(row.theirs) == 2 and len(row.ratios) == 2
    assert progress[-1] == "enqueue vs pgqueuer: 60 jobs (round 2 of 2)"
    assert not Job.objects.filter(tenant=TENANT_ENQUEUE).exists()
    assert not JobEvent.objects.filter(job__tenant=TENANT_ENQUEUE).exists()
    params = connection.get_connection_params()
    with psycopg.connect(dbname=params["dbname"], user=params.get("user"), host=params.get("host"),
                         port=params.get("port")) as check:
        names = [name for (name,) in check.execute("SELECT datname FROM pg_database")]
    assert f"{params['dbname']}_pgqueuer" not in names
