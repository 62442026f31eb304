"""Behind a transaction pooler with the direct configuration, the web app and
the calendar (django-q2) do not stop as a worker does, but the first request
or task that meets a moved prepared statement is logged naming the setting."""

import logging

import psycopg.errors
import pytest
from django.core.signals import got_request_exception
from django.db.utils import OperationalError
from django_q.signals import post_execute_in_worker

MOVED = 'prepared statement "_pg3_0" does not exist'


def _raised(error):
    try:
        raise error
    except Exception:
        got_request_exception.send(sender=None, request=None)


def test_a_request_that_met_a_moved_prepared_statement_names_the_setting(caplog):
    driver = psycopg.errors.InvalidSqlStatementName(MOVED)
    wrapped = OperationalError(MOVED)
    wrapped.__cause__ = driver
    with caplog.at_level(logging.ERROR, logger="jobs.pooling"):
        _raised(wrapped)
    assert "web.misconfigured" in caplog.text and "DATABASE_POOL_MODE=transaction" in caplog.text


def test_other_request_errors_say_nothing(caplog):
    with caplog.at_level(logging.ERROR, logger="jobs.pooling"):
        _raised(ValueError(MOVED))  # the text alone, not the database's refusal
        _raised(psycopg.errors.UndefinedTable('relation "x" does not exist'))
    assert "misconfigured" not in caplog.text


@pytest.mark.parametrize("result, reported", [
    (f"{MOVED} : Traceback (most recent call last): …", True),
    ('prepared statement "_pg3_4" already exists : Traceback …', True),
    ("division by zero : Traceback …", False),
])
def test_a_calendar_task_that_failed_on_a_moved_prepared_statement_names_the_setting(caplog, result, reported):
    with caplog.at_level(logging.ERROR, logger="jobs.pooling"):
        post_execute_in_worker.send(sender="django_q", func=None,
                                    task={"name": "retention", "success": False, "result": result})
        post_execute_in_worker.send(sender="django_q", func=None,
                                    task={"name": "ok", "success": True, "result": MOVED})
    assert ("qcluster.misconfigured task=retention" in caplog.text) is reported
    assert "task=ok" not in caplog.text
    if reported:
        assert "DATABASE_POOL_MODE=transaction" in caplog.text
