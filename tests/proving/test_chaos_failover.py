"""`manage.py chaos` and the database it reads: a failover (the connection
breaks, a call fails with OperationalError) is survived by reconnecting, and
however the command ends — a clean run, an error — no worker it started
outlives it."""

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection

from proving.management.commands.chaos import Command

pytestmark = [pytest.mark.acceptance]


@pytest.fixture
def fleet(monkeypatch, test_database_url):
    """The worker processes chaos starts (pointed at the test database)."""
    monkeypatch.setenv("DATABASE_URL", test_database_url)
    started = []
    start = Command._start_worker

    def recorded(self, *extra):
        process = start(self, *extra)
        started.append(process)
        return process

    monkeypatch.setattr(Command, "_start_worker", recorded)
    yield started
    for process in started:  # what a failed test left running
        if process.poll() is None:
            process.kill()
            process.wait()


def test_chaos_survives_its_database_going_away_once(fleet, capsys):
    failed = []

    def away_once(execute, sql, params, many, context):
        # The first read of the jobs once the fleet runs (`_anything_started`).
        if fleet and not failed and sql.lstrip().upper().startswith("SELECT") and "jobs_job" in sql:
            failed.append(sql)
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(away_once):
        call_command("chaos", "--jobs", "5", "--kills", "1", "--workers", "2", "--seed", "3")
    out, err = capsys.readouterr()
    assert failed and "the database is away" in err
    assert "duplicates: 0  lost: 0  stray messages: 0" in out, out
    assert fleet and all(process.poll() is not None for process in fleet)


def test_chaos_failing_leaves_no_worker_running(fleet, monkeypatch):
    def broken(self):
        raise RuntimeError("the command failed while its workers ran")

    monkeypatch.setattr(Command, "_unsettled", broken)
    with pytest.raises(RuntimeError):
        call_command("chaos", "--jobs", "5", "--kills", "1", "--workers", "2", "--seed", "3")
    assert fleet and all(process.poll() is not None for process in fleet)
