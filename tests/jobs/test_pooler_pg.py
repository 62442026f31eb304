"""Workers behind a real PgBouncer in transaction mode (DESIGN §17).

Each test starts its own PgBouncer (fixture `pgbouncer`) in front of the test
database, which pytest-django created directly. What a transaction-mode pooler
breaks, and what DATABASE_POOL_MODE=transaction must keep working:
- every job runs once, with no prepared-statement errors, through fewer server
  connections than the workers have clients;
- NOTIFY still wakes idle workers (their LISTEN has its own direct connection,
  DATABASE_LISTEN_URL) long before their poll;
- the default configuration there refuses to start, naming the setting;
- transaction mode without DATABASE_LISTEN_URL says that wake-ups poll.
"""

import signal

import pytest

from jobs.models import Job, JobEvent
from jobs.store import JobSpec
from tests.support import ProcessOutput, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.pooler, pytest.mark.django_db(transaction=True)]


def pooled(bouncer, direct_url, *, listen: bool = True) -> dict:
    env = {"DATABASE_URL": bouncer.url, "DATABASE_POOL_MODE": "transaction"}
    if listen:
        env["DATABASE_LISTEN_URL"] = direct_url
    return env


def _stop(output: ProcessOutput) -> str:
    output.process.send_signal(signal.SIGTERM)
    out = output.finish(timeout=60)
    assert output.process.returncode == 0, out
    return out


def test_workers_behind_a_transaction_pooler_run_every_job_once_and_wake_on_notify(
        store, manage, pgbouncer, test_database_url):
    bouncer = pgbouncer(pool_size=2)  # 3 workers × (2 slots + 1) clients share 2 server connections
    env = pooled(bouncer, test_database_url)
    outputs = [ProcessOutput(manage.start("run_worker", "--worker-id", f"pooled-{n}", "--concurrency", "2",
                                          "--poll-interval", "60", env=env)) for n in range(3)]
    try:
        for output in outputs:
            output.wait_for("worker.listening")
        store.enqueue_many(JobSpec("pooled", f"job-{n:03d}") for n in range(150))
        wait_for(lambda: Job.objects.filter(tenant="pooled", state="DONE").count() == 150, timeout=120,
                 what="150 jobs through the pooler")
        # All idle now; a poll is 30 s away at the soonest: only a NOTIFY,
        # through the pooler's server connection to the workers' direct
        # LISTEN, wakes one in time.
        store.enqueue("pooled", "wake-me")
        wait_for(lambda: Job.objects.get(key="wake-me").state == "DONE", timeout=20,
                 what="the NOTIFY to wake a worker behind the pooler")
    finally:
        texts = [_stop(output) for output in outputs]
    # One attempt each: one row ending it, with its claim, at epoch 1.
    attempts = JobEvent.objects.filter(job__tenant="pooled").exclude(claimed_at=None)
    assert attempts.count() == attempts.filter(epoch=1, kind="finish").count() == 151, \
        "every job was claimed exactly once"
    for text in texts:
        assert "prepared statement" not in text, text
        assert "worker.db_error" not in text, text
        assert "via=DATABASE_LISTEN_URL" in text, text
    assert sum(text.count(" job.claim ") for text in texts) == 151


def test_the_default_configuration_behind_a_transaction_pooler_refuses_to_start(
        store, manage, pgbouncer, test_database_url):
    bouncer = pgbouncer(pool_size=1)
    store.enqueue("pooled", "untouched")
    result = manage.run("run_worker", "--until-idle", check=False, timeout=60,
                        env={"DATABASE_URL": bouncer.url})
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "worker.misconfigured" in out and "DATABASE_POOL_MODE=transaction" in out, out
    # It refused before claiming anything.
    assert Job.objects.get(key="untouched").state == "READY"


def test_transaction_mode_without_a_listen_url_warns_that_wake_ups_poll(store, manage, pgbouncer,
                                                                          test_database_url):
    bouncer = pgbouncer(pool_size=2)
    store.enqueue("pooled", "polled")
    result = manage.run("run_worker", "--until-idle", "--poll-interval", "0.2", timeout=60,
                        env=pooled(bouncer, test_database_url, listen=False))
    out = result.stdout + result.stderr
    assert "worker.polling_only" in out and "DATABASE_LISTEN_URL" in out, out
    assert "worker.listening" not in out, out
    assert Job.objects.get(key="polled").state == "DONE"


def test_the_outbox_relay_in_the_default_configuration_behind_a_transaction_pooler_refuses_to_start(
        manage, pgbouncer, test_database_url):
    bouncer = pgbouncer(pool_size=1)
    result = manage.run("relay_outbox", "--once", check=False, timeout=60, env={"DATABASE_URL": bouncer.url})
    out = result.stdout + result.stderr
    assert result.returncode != 0 and "DATABASE_POOL_MODE=transaction" in out, out
    assert "handled" not in result.stdout, out
    # Configured for the pooler, it runs.
    assert manage.run("relay_outbox", "--once", timeout=60, env=pooled(bouncer, test_database_url)).returncode == 0
