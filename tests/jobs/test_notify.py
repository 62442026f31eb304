"""Idle workers wake on NOTIFY (PostgreSQL) instead of waiting for the next poll.

A worker counts as ready once it has run a first job (its slots are claiming)
and, on PostgreSQL, it has logged its LISTEN (`worker.listening`) — readiness
signals, not a fixed sleep."""

import signal

import pytest
from django.db import connection

from jobs.models import Job
from tests.support import ProcessOutput, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _done(key: str):
    return lambda: Job.objects.get(key=key).state == "DONE"


def _serve(store, manage, poll_interval: str) -> ProcessOutput:
    output = ProcessOutput(manage.start("run_worker", "--worker-id", "idle", "--poll-interval", poll_interval))
    output.wait_for("worker.start")
    store.enqueue("studio", "first")
    wait_for(_done("first"), what="the worker to run a first job")
    if connection.vendor == "postgresql":
        output.wait_for("worker.listening")
    return output


def _stop(output: ProcessOutput) -> str:
    output.process.send_signal(signal.SIGTERM)
    out = output.finish()
    assert output.process.returncode == 0, out
    return out


@pytest.mark.postgres
def test_an_idle_worker_wakes_on_notify_long_before_its_poll(store, manage):
    output = _serve(store, manage, poll_interval="60")
    try:
        store.enqueue("studio", "wake-me")
        # Well within the shortest poll (half of 60 s, with jitter).
        wait_for(_done("wake-me"), timeout=20, what="the NOTIFY to wake the worker")
    finally:
        _stop(output)


def test_polling_still_finds_work_without_notifications(store, manage):
    output = _serve(store, manage, poll_interval="0.3")
    try:
        # A row made eligible behind the engine's back sends no NOTIFY.
        store.enqueue("studio", "silent", run_at=4_000_000_000)
        Job.objects.filter(key="silent").update(next_attempt_at=None)
        wait_for(_done("silent"), timeout=20, what="the poll to find the job")
    finally:
        _stop(output)


@pytest.mark.postgres
def test_a_worker_survives_its_database_connections_being_killed(store, manage):
    output = _serve(store, manage, poll_interval="0.5")
    try:
        # What a database restart or a failover does to every open connection.
        # The first job's row is DONE once its finish commits, a moment before
        # the worker reads that it did: often the kill lands in between, and
        # the worker, not knowing, sends the finish again after reconnecting
        # and learns that it went in (job.write_in_doubt, then job.done).
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] >= 2  # the worker's slot and its main connection (which LISTENs)
        store.enqueue("studio", "after")
        wait_for(_done("after"), timeout=30, what="the worker to reconnect and run the job")
    finally:
        out = _stop(output)
    assert "done=2" in out, out
