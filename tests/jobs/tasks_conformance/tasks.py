"""The `@task` functions the conformance suite runs, named and behaving as django-tasks' `tests/tasks.py`
(see the package docstring). Instead of sleeping for a fixed time, the long-running tasks wait for a
file the test creates, so a test synchronises on what a task did rather than on a clock."""

import sys
import time
from pathlib import Path

from django_tasks import TaskContext, task


@task()
def noop_task(*args, **kwargs) -> None:
    return None


@task
def noop_task_from_bare_decorator(*args, **kwargs) -> None:
    return None


@task()
async def noop_task_async(*args, **kwargs) -> None:
    return None


@task()
async def async_meaning_of_life() -> int:
    return 42


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task()
def failing_task_system_exit() -> None:
    raise SystemExit("This task failed due to SystemExit")


@task()
def failing_task_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("This task failed due to KeyboardInterrupt")


@task()
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value():
    # Neither JSON nor picklable.
    return lambda: True


@task()
def bytes_return_value() -> bytes:
    return b"meaning of life"


@task()
def tuple_return_value() -> tuple:
    return (42, (b"meaning", "of life"))


@task()
def exit_task() -> None:
    sys.exit(1)


@task()
def count_and_return_set(path: str):
    """Leave a line per run, then return a value JSON cannot hold: a run that is repeated shows."""
    with open(path, "a") as file:
        file.write("ran\n")
    return {1, 2}


@task()
def run_until_released(started: str, release: str) -> str:
    """Say it started (a file), then run until the test creates `release` (at most five minutes)."""
    Path(started).write_text("started")
    deadline = time.monotonic() + 300
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # a task's own work, not a test's synchronisation
    return "released"


@task(takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return context.task_result.id


@task(takes_context=True)
def test_context(context: TaskContext, attempt: int) -> None:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt


@task()
def record_label(path: str, label: str) -> None:
    with open(path, "a") as file:
        file.write(label + "\n")
