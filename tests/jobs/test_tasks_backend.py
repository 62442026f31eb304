"""The Django tasks API on the durable engine: `@task` functions enqueued
through the framework's public API, run by a real `run_worker` process."""

import sys
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from django_tasks import TaskResultStatus, default_task_backend
from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist

from jobs.tasks_backend import ACTION
from tests.engineapp.tasks import attempt_number, explode, record

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


def test_queues_are_checked_and_arguments_must_be_json(tmp_path):
    with pytest.raises(InvalidTaskError, match="Queue"):
        record.using(queue_name="not-configured")
    with pytest.raises(InvalidTaskError, match="JSON"):
        record.enqueue(str(tmp_path / "x"), object())


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
    forged = store.enqueue(default_task_backend.tenant_for("default"), "task-forged", action=ACTION,
                           payload={"task": "tests.engineapp.import_alarm.not_a_task", "queue_name": "default",
                                    "backend": "default", "args": [], "kwargs": {}}, max_attempts=1)

    manage.run("run_worker", "--until-idle", "--poll-interval", "0.2")

    assert not alarm.exists(), "the worker imported the module the payload named"
    forged.refresh_from_db()
    assert forged.state == "NEEDS_ATTENTION" and "no registered @task" in forged.last_error
    # Reading its result refuses it the same way, here too without importing it.
    with pytest.raises(InvalidTaskError, match="no registered @task"):
        default_task_backend.get_result("default:forged")
    assert "tests.engineapp.import_alarm" not in sys.modules


def test_a_registered_task_in_a_module_the_worker_never_imported_still_runs(manage, tmp_path):
    # The worker process imports no test module itself: it finds `record` in
    # the installed app's `tasks` module when a job first names it.
    out = tmp_path / "calls.txt"
    result = record.enqueue(str(out), "found")
    manage.run("run_worker", "--until-idle", "--poll-interval", "0.2")
    assert record.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
