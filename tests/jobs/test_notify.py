"""Idle workers wake on NOTIFY (PostgreSQL) instead of waiting for the next poll."""

import signal
import time

import pytest

from jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def _serve(manage, poll_interval: str):
    proc = manage.start("run_worker", "--worker-id", "idle", "--poll-interval", poll_interval)
    time.sleep(1.5)  # started, found nothing, went to sleep
    return proc


def _stop(proc) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    return out


@pytest.mark.postgres
def test_an_idle_worker_wakes_on_notify_long_before_its_poll(store, manage):
    proc = _serve(manage, poll_interval="60")
    try:
        store.enqueue("studio", "wake-me")
        deadline = time.monotonic() + 20  # a third of the poll interval
        while Job.objects.get(key="wake-me").state != "DONE" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert Job.objects.get(key="wake-me").state == "DONE"
    finally:
        _stop(proc)


def test_polling_still_finds_work_without_notifications(store, manage):
    proc = _serve(manage, poll_interval="0.3")
    try:
        # A row made eligible behind the engine's back sends no NOTIFY.
        store.enqueue("studio", "silent", run_at=4_000_000_000)
        Job.objects.filter(key="silent").update(next_attempt_at=None)
        deadline = time.monotonic() + 20
        while Job.objects.get(key="silent").state != "DONE" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Job.objects.get(key="silent").state == "DONE"
    finally:
        _stop(proc)


@pytest.mark.postgres
def test_a_worker_survives_its_database_connections_being_killed(store, manage):
    from django.db import connection

    proc = _serve(manage, poll_interval="0.5")
    try:
        store.enqueue("studio", "before")
        deadline = time.monotonic() + 20
        while Job.objects.get(key="before").state != "DONE" and time.monotonic() < deadline:
            time.sleep(0.05)
        # What a database restart or a failover does to every open connection.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] >= 2  # the worker's slot and its LISTEN connection
        store.enqueue("studio", "after")
        deadline = time.monotonic() + 30
        while Job.objects.get(key="after").state != "DONE" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Job.objects.get(key="after").state == "DONE"
    finally:
        out = _stop(proc)
    assert proc.returncode == 0
    assert "done=2" in out
