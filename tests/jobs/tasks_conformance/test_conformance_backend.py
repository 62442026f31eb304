"""django-tasks-db 0.12's `DatabaseBackendTestCase` on `DurableBackend`: what enqueueing writes, what
`get_result` reads back, the `task_enqueued` signal and the `django_tasks` log line, validation on
enqueue. Rows are the engine's jobs (`jobs.Job`), where upstream reads its `DBTaskResult` model."""

import logging
import uuid
from contextlib import contextmanager
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone
from django_tasks import TaskResultStatus, default_task_backend, task_backends
from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
from django_tasks.signals import task_enqueued

from jobs.models import Job
from jobs.tasks_backend import ACTION, DurableBackend

from . import tasks as test_tasks

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def captured_task_enqueued():
    received = []

    def capture(sender, task_result, **kwargs):
        received.append((sender, task_result))

    task_enqueued.connect(capture, dispatch_uid="conformance_enqueue_signal", weak=False)
    try:
        yield received
    finally:
        task_enqueued.disconnect(capture, dispatch_uid="conformance_enqueue_signal")


def jobs_seen_by_another_connection() -> int:
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM jobs_job WHERE action = %s", [ACTION])
            return cursor.fetchone()[0]
    finally:
        other.close()


def test_using_correct_backend():
    assert default_task_backend == task_backends["default"]
    assert isinstance(task_backends["default"], DurableBackend)
    assert default_task_backend.alias == "default"
    assert default_task_backend.options == {"MAX_ATTEMPTS": 1}


def _assert_ready(result, task, args, kwargs):
    assert uuid.UUID(result.id).version == 4
    assert result.status == TaskResultStatus.READY
    assert not result.is_finished
    assert result.started_at is None
    assert result.last_attempted_at is None
    assert result.finished_at is None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == task
    assert result.args == args
    assert result.kwargs == kwargs
    assert result.attempts == 0


def test_enqueue_task():
    for task in (test_tasks.noop_task, test_tasks.noop_task_async):
        with captured_task_enqueued() as received:
            result = task.enqueue(1, two=3)
        _assert_ready(result, task, [1], {"two": 3})
        assert received == [(DurableBackend, result)]


def test_enqueue_task_async():
    for task in (test_tasks.noop_task, test_tasks.noop_task_async):
        with captured_task_enqueued() as received:
            result = async_to_sync(task.aenqueue)()
        _assert_ready(result, task, [], {})
        assert received == [(DurableBackend, result)]


def test_get_result():
    result = default_task_backend.enqueue(test_tasks.noop_task, [], {})
    assert default_task_backend.get_result(result.id) == result


def test_get_result_async():
    result = async_to_sync(default_task_backend.aenqueue)(test_tasks.noop_task, [], {})
    assert async_to_sync(default_task_backend.aget_result)(result.id) == result


def test_get_missing_result():
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(uuid.uuid4()))


def test_async_get_missing_result():
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)(str(uuid.uuid4()))


def test_invalid_uuid():
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("123")


def test_async_invalid_uuid():
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)("123")


def test_check():
    assert list(default_task_backend.check()) == []


def test_doesnt_wait_until_transaction_commit():
    with transaction.atomic():
        result = test_tasks.noop_task.enqueue()
        assert result.enqueued_at is not None
        assert Job.objects.filter(action=ACTION).count() == 1
        # SQLite locks the database for the transaction: only PostgreSQL can show another connection's view.
        if connection.vendor != "sqlite":
            assert jobs_seen_by_another_connection() == 0
    if connection.vendor != "sqlite":
        assert jobs_seen_by_another_connection() == 1


def test_enqueue_logs(caplog):
    with caplog.at_level(logging.DEBUG, logger="django_tasks"):
        result = test_tasks.noop_task.enqueue()
    lines = [r.getMessage() for r in caplog.records if r.name == "django_tasks"]
    assert len(lines) == 1
    assert "enqueued" in lines[0]
    assert result.id in lines[0]


def test_run_after_tz():
    result = test_tasks.noop_task.enqueue()
    assert default_task_backend.get_result(result.id).task.run_after is None
    later = timezone.now() + timedelta(hours=1)
    deferred = test_tasks.noop_task.using(run_after=later).enqueue()
    assert default_task_backend.get_result(deferred.id).task.run_after == later


def test_validate_on_enqueue():
    with override_settings(TASKS={"default": {"BACKEND": "jobs.tasks_backend.DurableBackend",
                                              "QUEUES": ["unknown_queue"]}}):
        task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")
    with pytest.raises(InvalidTaskError, match="Queue 'unknown_queue' is not valid for backend"):
        task_with_custom_queue_name.enqueue()


def test_validate_on_aenqueue():
    with override_settings(TASKS={"default": {"BACKEND": "jobs.tasks_backend.DurableBackend",
                                              "QUEUES": ["unknown_queue"]}}):
        task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")
    with pytest.raises(InvalidTaskError, match="Queue 'unknown_queue' is not valid for backend"):
        async_to_sync(task_with_custom_queue_name.aenqueue)()


def test_refresh_on_a_second_alias():
    # Upstream's results carry their backend's alias; `refresh()` asks that backend.
    result = test_tasks.noop_task.using(backend="second").enqueue()
    assert result.backend == "second"
    fetched = task_backends["second"].get_result(result.id)
    assert fetched.backend == "second" and fetched.task.backend == "second"
    fetched.refresh()
    assert fetched == result
