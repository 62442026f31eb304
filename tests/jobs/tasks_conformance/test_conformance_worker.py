"""django-tasks-db 0.12's `DatabaseBackendWorkerTestCase` and `DatabaseWorkerProcessTestCase` on
`DurableBackend`, each task run by a real `manage.py run_worker` process (upstream runs its `db_worker`
command): what a run records (times, attempts, return value, errors with class and traceback), which
queue and backend a worker serves, the `django_tasks` log lines, bad task paths, and the process
(signals, kill, several workers). Upstream's `--batch` is `--until-idle`; its `--queue-name` is
`--tenant tasks:<queue>`; a worker serves every queue unless told otherwise."""

import os
import signal
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone
from django_tasks import TaskResultStatus, default_task_backend, task_backends

from jobs.models import Job
from jobs.store import Store
from jobs.tasks_backend import ACTION
from tests.support import ProcessOutput, wait_for

from . import tasks as test_tasks

pytestmark = pytest.mark.django_db(transaction=True)


def run_worker(manage, *args) -> str:
    """Run a worker until nothing is eligible; return what it printed."""
    done = manage.run("run_worker", "--until-idle", "--poll-interval", "0.2", *args)
    return done.stdout + done.stderr


def start_worker(manage, *args):
    process = manage.start("run_worker", "--poll-interval", "0.2", *args)
    return process, ProcessOutput(process)


def ready_count() -> int:
    return Job.objects.filter(action=ACTION, state="READY").count()


def job_of(result) -> Job:
    return Job.objects.get(action=ACTION, key=f"task-{uuid.UUID(result.id.rpartition(':')[2]).hex}")


def enqueue_path(task_path: str, args=()) -> Job:
    """A job naming `task_path` as its task, as a payload written by an older release or by hand would."""
    return Store().enqueue(default_task_backend.tenant_for("default"), f"task-{os.urandom(16).hex()}",
                           action=ACTION, max_attempts=1,
                           payload={"task": task_path, "backend": "default", "queue_name": "default",
                                    "takes_context": False, "args": list(args), "kwargs": {}})


def assert_ran_once(result) -> None:
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at
    assert result.attempts == 1


def test_run_enqueued_task(manage):
    result = test_tasks.noop_task.enqueue()
    assert ready_count() == 1
    assert result.status == TaskResultStatus.READY

    run_worker(manage)

    assert result.status == TaskResultStatus.READY
    assert result.attempts == 0
    result.refresh()
    assert_ran_once(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert ready_count() == 0


def test_run_enqueued_async_task(manage):
    result = test_tasks.async_meaning_of_life.enqueue()
    run_worker(manage)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


def test_refresh_result(manage):
    result = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, (), {})
    run_worker(manage)

    assert result.status == TaskResultStatus.READY
    assert not result.is_finished
    result.refresh()
    assert_ran_once(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 42


def test_batch_processes_all_tasks(manage):
    results = [test_tasks.noop_task.enqueue() for _ in range(3)]
    failing = test_tasks.failing_task_value_error.enqueue()
    assert ready_count() == 4

    run_worker(manage)

    assert ready_count() == 0
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    failing.refresh()
    assert failing.status == TaskResultStatus.FAILED


def test_no_tasks(manage):
    assert "worker.idle" in run_worker(manage)


def test_doesnt_process_different_queue(manage):
    result = test_tasks.noop_task.using(queue_name="queue-1").enqueue()
    assert ready_count() == 1

    run_worker(manage, "--tenant", default_task_backend.tenant_for("default"))
    assert ready_count() == 1

    run_worker(manage, "--tenant", default_task_backend.tenant_for(result.task.queue_name))
    assert ready_count() == 0


def test_process_all_queues(manage):
    test_tasks.noop_task.using(queue_name="queue-1").enqueue()
    run_worker(manage, "--tenant", default_task_backend.tenant_for("default"))
    assert ready_count() == 1

    run_worker(manage)
    assert ready_count() == 0


def test_failing_task(manage):
    result = test_tasks.failing_task_value_error.enqueue()
    run_worker(manage)

    assert result.status == TaskResultStatus.READY
    result.refresh()
    assert_ran_once(result)
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.errors[0].exception_class is ValueError
    assert result.errors[0].traceback.endswith("ValueError: This task failed due to ValueError\n")
    assert ready_count() == 0


def test_complex_exception(manage):
    result = test_tasks.complex_exception.enqueue()
    run_worker(manage)

    result.refresh()
    assert_ran_once(result)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback


def test_complex_return_value(manage):
    result = test_tasks.complex_return_value.enqueue()
    run_worker(manage)

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert_ran_once(result)
    assert result._return_value is None
    assert result.errors[0].exception_class is TypeError
    assert "Unsupported type: <class 'function'>" in result.errors[0].traceback


@pytest.mark.parametrize(("task", "stored"), [
    (test_tasks.bytes_return_value, "meaning of life"),
    (test_tasks.tuple_return_value, [42, ["meaning", "of life"]]),
])
def test_a_return_value_is_normalized_as_django_tasks_does(manage, task, stored):
    result = task.enqueue()
    run_worker(manage)

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert_ran_once(result)
    assert result.return_value == stored


def test_doesnt_process_different_backend(manage):
    result = test_tasks.failing_task_value_error.using(backend="second").enqueue()
    second = task_backends["second"]

    run_worker(manage, "--tenant", default_task_backend.tenant_for("default"))
    assert ready_count() == 1

    run_worker(manage, "--tenant", second.tenant_for(result.task.queue_name))
    assert ready_count() == 0


def test_run_after(manage):
    result = test_tasks.noop_task.using(run_after=timezone.now() + timedelta(hours=10)).enqueue()

    run_worker(manage)
    result.refresh()
    assert result.status == TaskResultStatus.READY

    Job.objects.filter(pk=job_of(result).pk).update(next_attempt_at=timezone.now())
    run_worker(manage)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_run_after_priority(manage, tmp_path):
    out = tmp_path / "order.txt"
    now = timezone.now()
    record = test_tasks.record_label
    record.using(priority=20, run_after=now - timedelta(hours=2)).enqueue(str(out), "old")
    record.using(priority=20, run_after=now - timedelta(hours=10)).enqueue(str(out), "very_old")
    record.using(run_after=now + timedelta(hours=10)).enqueue(str(out), "far_future")
    record.using(priority=10, run_after=now + timedelta(hours=10)).enqueue(str(out), "high_priority_far_future")
    record.using(run_after=now + timedelta(hours=2)).enqueue(str(out), "future")
    record.using(priority=10).enqueue(str(out), "high_priority")
    record.using(priority=2).enqueue(str(out), "low_priority")
    record.using(priority=-2).enqueue(str(out), "lower_priority")

    run_worker(manage)

    assert out.read_text().split() == ["very_old", "old", "high_priority", "low_priority", "lower_priority"]


def test_verbose_logging(manage):
    result = test_tasks.noop_task.enqueue()
    lines = run_worker(manage).splitlines()
    path = test_tasks.noop_task.module_path
    for state in ("RUNNING", "SUCCESSFUL"):
        assert any(f"Task id={result.id} path={path} state={state}" in line for line in lines), lines


def test_failure_is_logged_with_its_traceback(manage):
    # Error monitoring hooks the `django_tasks` logger: its `logger.exception` must carry the task's own
    # exception, as django-tasks' worker sends `task_finished` while that exception is being handled.
    result = test_tasks.failing_task_value_error.enqueue()
    output = run_worker(manage)
    failed = output.split(f"Task id={result.id} path={test_tasks.failing_task_value_error.module_path} "
                          "state=FAILED", 1)
    assert len(failed) == 2, output
    assert "ValueError: This task failed due to ValueError" in failed[1]
    assert "NoneType: None" not in failed[1]


def test_invalid_task_path(manage, tmp_path):
    marker = tmp_path / "ran"
    job = enqueue_path("subprocess.check_output", args=[["touch", str(marker)]])
    run_worker(manage)
    job.refresh_from_db()
    assert job.state == "NEEDS_ATTENTION"  # the task's status: FAILED
    assert not marker.exists()


def test_missing_task_path(manage):
    job = enqueue_path("missing.func")
    run_worker(manage)
    job.refresh_from_db()
    assert job.state == "NEEDS_ATTENTION"


def test_task_import_string(manage):
    job = enqueue_path(f"{test_tasks.__name__}.some_test")
    run_worker(manage)
    job.refresh_from_db()
    assert job.state == "NEEDS_ATTENTION"
    failure = job.events.filter(kind="fail").last().detail
    # Deliberately unlike upstream (an ImportError): a payload's task name is
    # looked up among the declared @task functions and never imported.
    assert failure["exception_class_path"] == "django_tasks.exceptions.InvalidTaskError"
    assert "no registered @task" in failure["traceback"]


def test_worker_doesnt_exit(manage):
    result = test_tasks.exit_task.enqueue()
    after = test_tasks.noop_task.using(priority=-1).enqueue()
    run_worker(manage)
    result.refresh()
    after.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is SystemExit
    assert after.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.postgres
def test_worker_with_locked_rows(manage):
    result_1 = test_tasks.noop_task.enqueue()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT id FROM jobs_job WHERE key = %s FOR UPDATE", [job_of(result_1).key])
            assert len(cursor.fetchall()) == 1
        result_2 = test_tasks.noop_task.enqueue()
        run_worker(manage)
    finally:
        other.close()
    result_1.refresh()
    result_2.refresh()
    assert result_1.status == TaskResultStatus.READY
    assert result_2.status == TaskResultStatus.SUCCESSFUL


def test_takes_context(manage):
    result = test_tasks.get_task_id.enqueue()
    run_worker(manage)
    result.refresh()
    assert result.return_value == result.id


def test_context(manage):
    result = test_tasks.test_context.enqueue(1)
    run_worker(manage)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_task_error_invalid_exception(manage):
    result = test_tasks.failing_task_value_error.enqueue()
    run_worker(manage)
    result.refresh()
    assert len(result.errors) == 1
    object.__setattr__(result.errors[0], "exception_class_path", "subprocess.run")
    with pytest.raises(ValueError, match="'subprocess.run' does not reference a valid exception."):
        result.errors[0].exception_class  # noqa: B018


def test_task_error_unknown_module(manage):
    result = test_tasks.failing_task_value_error.enqueue()
    run_worker(manage)
    result.refresh()
    assert len(result.errors) == 1
    object.__setattr__(result.errors[0], "exception_class_path", "does.not.exist")
    with pytest.raises(ImportError):
        result.errors[0].exception_class  # noqa: B018


def test_a_non_json_return_value_does_not_run_the_task_again(manage, tmp_path):
    out = tmp_path / "runs.txt"
    result = test_tasks.count_and_return_set.using(backend="second").enqueue(str(out))
    # Three attempts allowed: a value that cannot be stored is not a transient failure.
    Job.objects.filter(pk=job_of(result).pk).update(max_attempts=3)
    run_worker(manage)
    result.refresh()
    assert out.read_text().split() == ["ran"]
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError


# ---------------------------------------------------------------- worker processes


def test_run_subprocess(manage):
    result = test_tasks.noop_task.enqueue()
    process, output = start_worker(manage, "--until-idle")
    output.finish(timeout=120)
    assert process.returncode == 0
    assert result.status == TaskResultStatus.READY
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_interrupt_no_tasks(manage):
    process, output = start_worker(manage)
    output.wait_for("worker.start", timeout=120)
    process.terminate()
    output.finish(timeout=60)
    assert process.returncode == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_signals(manage, tmp_path, sig):
    started, release = tmp_path / "started", tmp_path / "release"
    result = test_tasks.run_until_released.enqueue(str(started), str(release))
    assert result.worker_ids == []

    process, output = start_worker(manage)
    wait_for(started.exists, timeout=120, what="the task to start")
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    assert result.worker_ids != []

    process.send_signal(sig)
    output.wait_for("worker.stopping")
    release.write_text("go")
    output.finish(timeout=60)
    assert process.returncode == 0
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_kill(manage, tmp_path):
    started, release = tmp_path / "started", tmp_path / "release"
    result = test_tasks.run_until_released.enqueue(str(started), str(release))
    process, output = start_worker(manage)
    wait_for(started.exists, timeout=120, what="the task to start")
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING

    process.kill()
    output.finish(timeout=60)
    assert process.returncode == -signal.SIGKILL
    result.refresh()
    # Its lease has not expired yet; when it does, recovery makes it READY again (or FAILED, out of attempts).
    assert result.status == TaskResultStatus.RUNNING


@pytest.mark.parametrize("task_name, exception", [("failing_task_system_exit", SystemExit),
                                                   ("failing_task_keyboard_interrupt", KeyboardInterrupt)])
def test_system_exit_and_keyboard_interrupt_task(manage, task_name, exception):
    task = getattr(test_tasks, task_name)
    result = task.enqueue()
    process, output = start_worker(manage, "--until-idle")
    output.finish(timeout=120)
    assert process.returncode == 0
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is exception
    assert f"{exception.__name__}: This task failed due to {exception.__name__}" in result.errors[0].traceback


def test_multiple_workers(manage):
    results = [test_tasks.noop_task.enqueue() for _ in range(10)]
    workers = [start_worker(manage, "--until-idle") for _ in range(3)]
    all_output = ""
    for process, output in workers:
        all_output += output.finish(timeout=120)
        assert process.returncode == 0
        assert "worker.idle" in output.text()
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        # Running and successful.
        assert all_output.count(result.id) == 2, all_output
    assert Counter(job.state for job in Job.objects.filter(action=ACTION)) == {"DONE": 10}
