"""The task API (django-tasks 0.12 `tests/tests/test_tasks.py`) on `DurableBackend`: enqueue, results and
the `Task` object, in the test process (no worker runs here). Upstream runs these on its dummy backend and
reads its in-memory list of results; here each enqueue is a durable job, read back with `get_result`."""

import dataclasses
from datetime import datetime

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings
from django.utils import timezone
from django.utils.module_loading import import_string
from django_tasks import DEFAULT_TASK_QUEUE_NAME, TaskResultStatus, default_task_backend, task, task_backends
from django_tasks.backends.immediate import ImmediateBackend
from django_tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task
from django_tasks.exceptions import (
    InvalidTaskBackendError,
    InvalidTaskError,
    TaskResultDoesNotExist,
    TaskResultMismatch,
)

from jobs.tasks_backend import DurableBackend

from . import tasks as test_tasks

pytestmark = pytest.mark.django_db

PRIORITY_RANGE = f"priority must be a whole number between {TASK_MIN_PRIORITY} and {TASK_MAX_PRIORITY}"


def test_using_correct_backend():
    assert default_task_backend == task_backends["default"]
    assert isinstance(task_backends["default"], DurableBackend)


def test_task_decorator():
    assert isinstance(test_tasks.noop_task, Task)
    assert isinstance(test_tasks.noop_task_async, Task)
    assert isinstance(test_tasks.noop_task_from_bare_decorator, Task)


def test_enqueue_task():
    result = test_tasks.noop_task.enqueue()

    assert result.status == TaskResultStatus.READY
    assert result.task == test_tasks.noop_task
    assert result.args == []
    assert result.kwargs == {}
    assert default_task_backend.get_result(result.id) == result


def test_enqueue_task_async():
    result = async_to_sync(test_tasks.noop_task.aenqueue)()

    assert result.status == TaskResultStatus.READY
    assert result.task == test_tasks.noop_task
    assert result.args == []
    assert result.kwargs == {}
    assert default_task_backend.get_result(result.id) == result


def test_enqueue_with_invalid_argument():
    with pytest.raises(TypeError, match="Unsupported type: <class 'datetime.datetime'>"):
        test_tasks.noop_task.enqueue(datetime.now())


def test_aenqueue_with_invalid_argument():
    with pytest.raises(TypeError, match="Unsupported type: <class 'datetime.datetime'>"):
        async_to_sync(test_tasks.noop_task.aenqueue)(datetime.now())


def test_using_priority():
    assert test_tasks.noop_task.priority == 0
    assert test_tasks.noop_task.using(priority=1).priority == 1
    assert test_tasks.noop_task.priority == 0


def test_using_queue_name():
    assert test_tasks.noop_task.queue_name == DEFAULT_TASK_QUEUE_NAME
    assert test_tasks.noop_task.using(queue_name="queue-1").queue_name == "queue-1"
    assert test_tasks.noop_task.queue_name == DEFAULT_TASK_QUEUE_NAME


def test_using_run_after():
    now = timezone.now()
    assert test_tasks.noop_task.run_after is None
    assert test_tasks.noop_task.using(run_after=now).run_after == now
    assert test_tasks.noop_task.run_after is None


def test_using_unknown_backend():
    assert test_tasks.noop_task.backend == "default"
    with pytest.raises(InvalidTaskBackendError, match="The connection 'unknown' doesn't exist."):
        test_tasks.noop_task.using(backend="unknown")


def test_using_missing_backend():
    assert test_tasks.noop_task.backend == "default"
    with pytest.raises(InvalidTaskBackendError,
                       match="Could not find backend 'does.not.exist': No module named 'does'"):
        test_tasks.noop_task.using(backend="missing")


def test_using_creates_new_instance():
    new_task = test_tasks.noop_task.using()
    assert new_task == test_tasks.noop_task
    assert new_task is not test_tasks.noop_task


def test_chained_using():
    now = timezone.now()
    run_after_task = test_tasks.noop_task.using(run_after=now)
    assert run_after_task.run_after == now

    priority_task = run_after_task.using(priority=10)
    assert priority_task.priority == 10
    assert priority_task.run_after == now
    assert run_after_task.priority == 0


def test_refresh_result():
    result = async_to_sync(test_tasks.noop_task.aenqueue)()
    original = dataclasses.asdict(result)

    result.refresh()
    assert dataclasses.asdict(result) == original

    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == original


def test_naive_datetime():
    with pytest.raises(InvalidTaskError, match="run_after must be an aware datetime"):
        test_tasks.noop_task.using(run_after=datetime.now())


def test_invalid_priority():
    for priority in (-101, 101, 3.1):
        with pytest.raises(InvalidTaskError, match=PRIORITY_RANGE):
            test_tasks.noop_task.using(priority=priority)
    for priority in (100, -100, 0):
        test_tasks.noop_task.using(priority=priority)


def test_unknown_queue_name():
    with pytest.raises(InvalidTaskError, match="Queue 'queue-2' is not valid for backend"):
        test_tasks.noop_task.using(queue_name="queue-2")
    # Validation is bypassed when the backend's QUEUES is an empty list.
    assert test_tasks.noop_task.using(queue_name="queue-2", backend="second").queue_name == "queue-2"


def test_call_task():
    assert test_tasks.calculate_meaning_of_life.call() == 42


def test_call_task_async():
    assert async_to_sync(test_tasks.calculate_meaning_of_life.acall)() == 42


def test_call_async_task():
    assert async_to_sync(test_tasks.noop_task_async.acall)() is None


def test_call_async_task_sync():
    assert test_tasks.noop_task_async.call() is None


def test_get_result():
    result = default_task_backend.enqueue(test_tasks.noop_task, (), {})
    assert test_tasks.noop_task.get_result(result.id) == result


def test_get_result_async():
    result = async_to_sync(default_task_backend.aenqueue)(test_tasks.noop_task, (), {})
    assert async_to_sync(test_tasks.noop_task.aget_result)(result.id) == result


def test_get_missing_result():
    with pytest.raises(TaskResultDoesNotExist):
        test_tasks.noop_task.get_result("123")
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(test_tasks.noop_task.aget_result)("123")


def test_get_incorrect_result():
    result = default_task_backend.enqueue(test_tasks.noop_task_async, (), {})
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        test_tasks.noop_task.get_result(result.id)


def test_get_incorrect_result_async():
    result = async_to_sync(default_task_backend.aenqueue)(test_tasks.noop_task_async, (), {})
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        async_to_sync(test_tasks.noop_task.aget_result)(result.id)


def _defined_in_a_function():
    def inner():
        return None
    return inner


def test_invalid_function():
    for invalid_function in (any, _defined_in_a_function()):
        with pytest.raises(InvalidTaskError, match="Task function must be defined at a module level"):
            task()(invalid_function)


def test_get_backend():
    assert test_tasks.noop_task.backend == "default"
    assert isinstance(test_tasks.noop_task.get_backend(), DurableBackend)

    immediate_task = test_tasks.noop_task.using(backend="immediate")
    assert immediate_task.backend == "immediate"
    assert isinstance(immediate_task.get_backend(), ImmediateBackend)


def test_name():
    assert test_tasks.noop_task.name == "noop_task"
    assert test_tasks.noop_task_async.name == "noop_task_async"


def test_module_path():
    module = test_tasks.__name__
    assert test_tasks.noop_task.module_path == f"{module}.noop_task"
    assert test_tasks.noop_task_async.module_path == f"{module}.noop_task_async"
    assert import_string(test_tasks.noop_task.module_path) is test_tasks.noop_task
    assert import_string(test_tasks.noop_task_async.module_path) is test_tasks.noop_task_async


@override_settings(TASKS={})
def test_no_backends():
    with pytest.raises(InvalidTaskBackendError):
        test_tasks.noop_task.enqueue()


def test_takes_context_without_taking_context():
    with pytest.raises(InvalidTaskError,
                       match="Task takes context but does not have a first argument of 'context'"):
        task(takes_context=True)(test_tasks.calculate_meaning_of_life.func)
