"""The Django tasks API on the durable engine: `@task` functions enqueued
through the framework's public API, run by a real `run_worker` process."""

import logging
import sys
import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from django_tasks import TaskResultStatus, default_task_backend, task_backends
from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
from django_tasks.signals import task_enqueued, task_finished, task_started

from jobs.models import Job
from jobs.retention import retention_sweep
from jobs.retry import RetryPolicy
from jobs.tasks_backend import ACTION, DurableBackend
from jobs.worker import Worker, WorkerConfig
from tests.engineapp.tasks import attempt_number, explode, record, record_async

pytestmark = pytest.mark.django_db(transaction=True)


def lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_task_enqueued_in_a_rolled_back_transaction_never_runs_and_a_committed_one_runs_once(manage, tmp_path):
    out = tmp_path / "calls.txt"
    with pytest.raises(RuntimeError), transaction.atomic():
        ghost = record.enqueue(str(out), "rolled back")
        raise RuntimeError("the business change failed")
    with transaction.atomic():
        kept = record.enqueue(str(out), "committed")
    assert kept.status == TaskResultStatus.READY

    manage.run("run_worker", "--until-idle", "--poll-interval", "0.2")

    assert lines(out) == ["committed"]
    with pytest.raises(TaskResultDoesNotExist):
        record.get_result(ghost.id)
    result = record.get_result(kept.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "COMMITTED"
    assert result.args == [str(out), "committed"]
    assert len(result.worker_ids) == 1 and result.finished_at is not None
    kept.refresh()
    assert kept.is_finished and kept.return_value == "COMMITTED"


def test_run_after_defers_a_task_and_priority_orders_the_queue(manage, tmp_path):
    out = tmp_path / "calls.txt"
    later = record.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(str(out), "later")
    record.using(priority=-10).enqueue(str(out), "low")
    record.using(priority=50).enqueue(str(out), "high")

    manage.run("run_worker", "--until-idle", "--poll-interval", "0.2")

    assert lines(out) == ["high", "low"]
    assert record.get_result(later.id).status == TaskResultStatus.READY


def test_queues_are_checked_and_arguments_must_be_json_as_django_tasks_says(tmp_path):
    with pytest.raises(InvalidTaskError, match="Queue"):
        record.using(queue_name="not-configured")
    # django-tasks' contract (`normalize_json`): TypeError for a type JSON cannot hold, ValueError for a value.
    with pytest.raises(TypeError, match="Unsupported type: <class 'object'>"):
        record.enqueue(str(tmp_path / "x"), object())
    for value in (float("nan"), float("inf"), -float("inf"), "a\x00b"):
        with pytest.raises(ValueError, match=r"^Unsupported value: args\[1\]"):
            record.enqueue(str(tmp_path / "x"), value)
    with pytest.raises(ValueError, match=r"^Unsupported value: kwargs.text is nan"):
        record.enqueue(str(tmp_path / "x"), text=float("nan"))
    assert not Job.objects.filter(action=ACTION).exists()


@override_settings(TASKS={"default": {"BACKEND": "jobs.tasks_backend.DurableBackend",
                                      "QUEUES": ["default", "emails"], "OPTIONS": {"MAX_ATTEMPTS": 1}}})
def test_a_failing_task_reports_failed_with_its_exception_and_a_queue_is_served_as_its_own_tenant(manage, tmp_path):
    out = tmp_path / "calls.txt"
    failing = explode.enqueue(str(out))
    in_emails = record.using(queue_name="emails").enqueue(str(out), "emails")

    # A worker dedicated to the `emails` queue runs only that queue.
    manage.run("run_worker", "--until-idle", "--poll-interval", "0.2", "--tenant",
               default_task_backend.tenant_for("emails"))
    assert lines(out) == ["emails"]
    assert explode.get_result(failing.id).status == TaskResultStatus.READY

    manage.run("run_worker", "--until-idle", "--poll-interval", "0.2")
    result = explode.get_result(failing.id)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"]
    assert "the task failed on purpose" in result.errors[0].traceback
    assert record.get_result(in_emails.id).return_value == "EMAILS"


def test_a_task_that_takes_context_sees_its_attempt(manage, tmp_path):
    out = tmp_path / "calls.txt"
    result = attempt_number.enqueue(str(out))
    manage.run("run_worker", "--until-idle", "--poll-interval", "0.2")
    assert attempt_number.get_result(result.id).return_value == 1
    assert lines(out) == ["attempt 1"]


def test_a_payload_naming_no_registered_task_is_refused_before_anything_is_imported(manage, tmp_path, store):
    alarm = tmp_path / "imported.txt"
    manage.env = {**manage.env, "IMPORT_ALARM": str(alarm)}
    ref = uuid.uuid4()  # result ids are UUIDs (the job key is task-<hex>)
    forged = store.enqueue(default_task_backend.tenant_for("default"), f"task-{ref.hex}", action=ACTION,
                           payload={"task": "tests.engineapp.import_alarm.not_a_task", "queue_name": "default",
                                    "backend": "default", "args": [], "kwargs": {}}, max_attempts=1)

    manage.run("run_worker", "--until-idle", "--poll-interval", "0.2")

    assert not alarm.exists(), "the worker imported the module the payload named"
    forged.refresh_from_db()
    assert forged.state == "NEEDS_ATTENTION" and "no registered @task" in forged.last_error
    # Reading its result refuses it the same way, here too without importing it.
    with pytest.raises(InvalidTaskError, match="no registered @task"):
        default_task_backend.get_result(str(ref))
    assert "tests.engineapp.import_alarm" not in sys.modules


def test_a_registered_task_in_a_module_the_worker_never_imported_still_runs(manage, tmp_path):
    # The worker process imports no test module itself: it finds `record` in
    # the installed app's `tasks` module when a job first names it.
    out = tmp_path / "calls.txt"
    result = record.enqueue(str(out), "found")
    manage.run("run_worker", "--until-idle", "--poll-interval", "0.2")
    assert record.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def run_in_process() -> None:
    Worker(WorkerConfig(until_idle=True, poll_interval=0.05)).run()


def job_of(result) -> Job:
    return Job.objects.get(action=ACTION, key=f"task-{uuid.UUID(result.id.rpartition(':')[2]).hex}")


@override_settings(TASKS={"default": {"BACKEND": "jobs.tasks_backend.DurableBackend", "QUEUES": ["default"],
                                      "OPTIONS": {"MAX_ATTEMPTS": 2}}})
def test_the_signals_are_sent_with_the_status_recorded_and_a_failure_is_logged_with_the_task_s_traceback(
        tmp_path, caplog, monkeypatch):
    # The retry a minute away: a full-jitter backoff of a few milliseconds
    # fell due before the first run went idle, which then ran both attempts.
    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, attempt, rng=None: 60.0)
    received = []

    def receiver(signal_name):
        def receive(sender, task_result, **kwargs):
            received.append((signal_name, sender, task_result.task.name, task_result.status))
        return receive

    receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
    for name, signal in (("enqueued", task_enqueued), ("started", task_started), ("finished", task_finished)):
        signal.connect(receivers[name], weak=False)
    try:
        out = tmp_path / "calls.txt"
        record.enqueue(str(out), "ok")
        failing = explode.using(priority=-1).enqueue(str(out))
        with caplog.at_level(logging.INFO, logger="django_tasks"):
            run_in_process()
            # The first of two attempts failed: READY again, its retry due later.
            assert explode.get_result(failing.id).status == TaskResultStatus.READY
            Job.objects.filter(pk=job_of(failing).pk).update(next_attempt_at=timezone.now())
            run_in_process()
    finally:
        for name, signal in (("enqueued", task_enqueued), ("started", task_started), ("finished", task_finished)):
            signal.disconnect(receivers[name])

    assert received == [
        ("enqueued", DurableBackend, "record", TaskResultStatus.READY),
        ("enqueued", DurableBackend, "explode", TaskResultStatus.READY),
        ("started", DurableBackend, "record", TaskResultStatus.RUNNING),
        ("finished", DurableBackend, "record", TaskResultStatus.SUCCESSFUL),
        ("started", DurableBackend, "explode", TaskResultStatus.RUNNING),
        ("finished", DurableBackend, "explode", TaskResultStatus.READY),
        ("started", DurableBackend, "explode", TaskResultStatus.RUNNING),
        ("finished", DurableBackend, "explode", TaskResultStatus.FAILED),
    ]
    # django-tasks' own receivers wrote its lines; the failure's `logger.exception` carries the task's
    # exception (what error monitoring reports), not the engine's wrapper.
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "django_tasks"]
    assert ("INFO", f"Task id={failing.id} path={explode.module_path} state=RUNNING") in lines
    assert ("INFO", f"Task id={failing.id} path={explode.module_path} state=READY") in lines
    failed = [r for r in caplog.records if r.name == "django_tasks" and r.getMessage().endswith("state=FAILED")]
    assert len(failed) == 1 and failed[0].levelname == "ERROR"
    exc_type, exc, _ = failed[0].exc_info
    assert exc_type is ValueError and str(exc) == "the task failed on purpose"


def test_an_async_task_runs_and_the_other_tasks_of_its_module_too(manage, tmp_path):
    out = tmp_path / "calls.txt"
    coroutine = record_async.enqueue(str(out), "async")
    plain = record.enqueue(str(out), "sync")

    manage.run("run_worker", "--until-idle", "--poll-interval", "0.2")

    assert sorted(lines(out)) == ["async", "sync"]
    assert record_async.get_result(coroutine.id).return_value == "cnysa"
    assert record.get_result(plain.id).return_value == "SYNC"


def test_a_result_stays_readable_after_retention_redacted_its_arguments(tmp_path):
    later = timezone.now() + timedelta(minutes=5)
    result = record.using(priority=7, run_after=later).enqueue(str(tmp_path / "x"), "secret")
    run_in_process()  # not yet due: stays READY
    Job.objects.filter(pk=job_of(result).pk).update(next_attempt_at=None)
    run_in_process()
    Job.objects.filter(pk=job_of(result).pk).update(finished_at=timezone.now() - timedelta(days=10))

    assert retention_sweep(retention_days=30, redact_after_days=7).redacted["jobs.Job.payload"] == 1
    assert "secret" not in str(job_of(result).payload)

    read = record.get_result(result.id)
    assert read.status == TaskResultStatus.SUCCESSFUL
    assert read.return_value == "SECRET"
    assert (read.args, read.kwargs) == ([], {})
    assert (read.task.priority, read.task.run_after, read.task.backend) == (7, later, "default")
    read.refresh()
    assert read.attempts == 1


@override_settings(TASKS={"default": {"BACKEND": "jobs.tasks_backend.DurableBackend", "QUEUES": []}})
def test_an_empty_queue_name_is_served_and_its_results_found(manage, tmp_path):
    out = tmp_path / "calls.txt"
    result = record.using(queue_name="").enqueue(str(out), "unnamed queue")
    assert record.get_result(result.id).status == TaskResultStatus.READY

    manage.run("run_worker", "--until-idle", "--poll-interval", "0.2", "--tenant", "tasks:")

    assert lines(out) == ["unnamed queue"]
    assert record.get_result(result.id).return_value == "UNNAMED QUEUE"


@override_settings(TASKS={"default": {"BACKEND": "jobs.tasks_backend.DurableBackend", "QUEUES": []},
                          "long": {"BACKEND": "jobs.tasks_backend.DurableBackend", "QUEUES": ["q" * 59]}})
def test_a_queue_name_too_long_for_its_tenant_is_refused_where_the_task_is_declared(tmp_path):
    record.using(queue_name="q" * 58).enqueue(str(tmp_path / "x"), "fits")  # "tasks:" + 58 = 64 characters
    with pytest.raises(InvalidTaskError, match="is 59 characters long; this backend takes at most 58"):
        record.using(queue_name="q" * 59)
    assert [e.id for e in task_backends["long"].check()] == ["jobs.E001"]
    assert list(task_backends["default"].check()) == []
