"""A worker starved of server connections by a session-mode pooler (its
pool taken by another client): it says so while it waits, again every 30 s,
and a SIGTERM stops it once its grace period is over, where the pooler would
keep its query queued for minutes (PgBouncer's query_wait_timeout, 120 s;
a cancel request does not reach a query still in its queue)."""

import signal

import psycopg
import pytest

from tests.support import ProcessOutput, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.pooler, pytest.mark.django_db(transaction=True)]


def test_a_starved_worker_says_so_every_30_s_and_stops_within_its_grace_period(manage, pgbouncer):
    bouncer = pgbouncer(pool_size=1, pool_mode="session")
    with psycopg.connect(bouncer.url, autocommit=True) as holder:
        holder.execute("SELECT 1")  # the pool's one server connection, held for good
        output = ProcessOutput(manage.start("run_worker", "--worker-id", "starved", "--concurrency", "1",
                                            "--poll-interval", "0.2", "--grace", "3",
                                            env={"DATABASE_URL": bouncer.url}))
        try:
            wait_for(lambda: output.text().count("worker.db_wait ") >= 2, timeout=90,
                     what="the starved worker to say so twice")
        finally:
            output.process.send_signal(signal.SIGTERM)
        # Well before the pooler's query_wait_timeout ends the queued query.
        out = output.finish(timeout=60)
    assert output.process.returncode == 0, out
    assert "worker.db_wait_cut" in out and "the grace period of the stop is over" in out, out
    assert "query_wait_timeout" not in out, out
    assert "worker.stop " in out
