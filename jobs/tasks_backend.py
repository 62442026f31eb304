"""The Django tasks API on the durable engine (DESIGN §13).

    TASKS = {"default": {"BACKEND": "jobs.tasks_backend.DurableBackend", "QUEUES": ["default"]}}

    from django_tasks import task          # `django.tasks` in Django 6

    @task(priority=10, queue_name="default")
    def send_digest(user_id): ...

    result = send_digest.enqueue(42)       # inside the caller's transaction
    send_digest.get_result(result.id).status

Every enqueued `@task` call is a job of action `django_tasks.run` that
`run_worker` runs with leases, fencing and retries like any other:

- `enqueue` validates the task (module-level function, priority, aware
  `run_after`, a configured queue, JSON arguments) and creates the job inside
  the caller's transaction: a rolled-back enqueue leaves nothing to run.
- The queue is the job's tenant, `tasks:<queue_name>` (OPTIONS `TENANT_PREFIX`
  changes `tasks:`), so queues are served fairly against each other and
  `run_worker --tenant tasks:emails` dedicates workers to one queue.
- `priority` (-100…100) is the job's priority; `run_after` its first eligible
  time. OPTIONS `MAX_ATTEMPTS` (default 3) bounds the attempts of one call.
- The result id is `<queue_name>:<uuid>`; the job is `tasks:<queue_name>` /
  `task-<uuid>` (never reused, unlike a primary key a rolled-back insert
  gave away). Job states map onto task statuses:

  | job state                                  | task status  |
  | ------------------------------------------ | ------------ |
  | READY (new, or waiting for its retry)      | READY        |
  | LEASED, WAITING_EXTERNAL                   | RUNNING      |
  | DONE                                       | SUCCESSFUL   |
  | NEEDS_ATTENTION, WAITING_REVIEW, CANCELLED | FAILED       |

  A FAILED task that an operator retries in the admin becomes READY again.
  `errors` lists each failed attempt (exception class and traceback),
  `worker_ids` the worker of each attempt.

A job's payload names its task by dotted path, and a payload is data anyone
who can enqueue a job may write: the name is looked up among the `@task`
functions declared on this backend (each registers itself when its module
is imported) and nothing it names is ever imported. A worker that has not
seen the task yet imports the `tasks` module of every installed app once
(as Celery's autodiscovery does), then looks again; a name still unknown is
refused (`InvalidTaskError`). So a `@task` lives in an installed app's
`tasks` module, or in a module that app imports when it loads.
"""

import copy
import json
import threading
import traceback
import uuid

from django.db import transaction
from django.utils.module_loading import autodiscover_modules
from django_tasks.backends.base import BaseTaskBackend
from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
from django_tasks.utils import get_module_path, normalize_json

from .actions import action
from .errors import TransientError
from .models import Job, JobEvent
from .states import State
from .store import Store

ACTION = "django_tasks.run"

STATUS_OF_STATE = {
    State.READY: TaskResultStatus.READY,
    State.LEASED: TaskResultStatus.RUNNING,
    State.WAITING_EXTERNAL: TaskResultStatus.RUNNING,
    State.DONE: TaskResultStatus.SUCCESSFUL,
    State.NEEDS_ATTENTION: TaskResultStatus.FAILED,
    State.WAITING_REVIEW: TaskResultStatus.FAILED,
    State.CANCELLED: TaskResultStatus.FAILED,
}


class TaskRaised(TransientError):
    """A task function raised: retried by the engine's policy; the original
    exception's class and traceback travel in the failure's history detail."""

    def __init__(self, exc: BaseException):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.detail = {
            "exception_class_path": get_module_path(type(exc)),
            "traceback": "".join(traceback.format_exception(exc))[-8000:],
        }


# module path → the `@task` declared there, filled as task modules are
# imported (`DurableBackend.validate_task`); the only tasks a job may run.
_declared: dict[str, Task] = {}
_discovery = threading.Lock()
_discovered = False


def _declared_task(name: str) -> Task | None:
    """The `@task` declared under `name`, or None — never importing `name`
    itself: first the tasks already declared, then, once per process, those
    of the installed apps' `tasks` modules."""
    global _discovered
    if name not in _declared and not _discovered:
        with _discovery:
            if not _discovered:
                autodiscover_modules("tasks")
                _discovered = True
    return _declared.get(name)


class DurableBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = False
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        self.tenant_prefix = self.options.get("TENANT_PREFIX", "tasks:")
        self.max_attempts = int(self.options.get("MAX_ATTEMPTS", 3))

    def validate_task(self, task: Task) -> None:
        """django-tasks' checks; a valid task declared on this backend is
        registered as one a job may run (the first declaration of a path is
        kept: `using()` copies are variants of it)."""
        super().validate_task(task)
        _declared.setdefault(task.module_path, task)

    def enqueue(self, task: Task, args, kwargs) -> TaskResult:
        """Store the call as a durable job, joining the caller's transaction.
        Raises `InvalidTaskError` for a task this backend cannot run or
        arguments that are not JSON."""
        self.validate_task(task)
        try:
            call = json.loads(json.dumps({"args": list(args), "kwargs": dict(kwargs)}))
        except (TypeError, ValueError) as exc:
            raise InvalidTaskError(f"task arguments must be JSON-serialisable: {exc}") from exc
        payload = {
            "task": task.module_path,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "takes_context": task.takes_context,
            **call,
        }
        # `atomic` joins an enclosing transaction: the job commits or rolls
        # back with the caller's business change.
        with transaction.atomic():
            job = Store().enqueue(
                self.tenant_for(task.queue_name),
                f"task-{uuid.uuid4().hex}",
                action=ACTION,
                payload=payload,
                priority=task.priority,
                run_at=task.run_after,
                max_attempts=self.max_attempts,
                actor=f"django_tasks:{self.alias}",
            )
        return self._result(job, task)

    def get_result(self, result_id: str) -> TaskResult:
        queue_name, _, ref = str(result_id).rpartition(":")
        # Served by the unique index on (tenant, key).
        job = Job.objects.filter(tenant=self.tenant_for(queue_name), key=f"task-{ref}", action=ACTION).first()
        if job is None or not queue_name:
            raise TaskResultDoesNotExist(result_id)
        return self._result(job, _task_of(job))

    def tenant_for(self, queue_name: str) -> str:
        return f"{self.tenant_prefix}{queue_name}"

    def _result(self, job: Job, task: Task) -> TaskResult:
        events = list(JobEvent.objects.filter(job_id=job.pk, kind__in=["claim", "takeover", "fail", "recover"])
                      .order_by("id")[:200])
        attempts = [e for e in events if e.kind in ("claim", "takeover")]
        errors = [
            TaskError(exception_class_path=e.detail.get("exception_class_path", "builtins.Exception"),
                      traceback=e.detail.get("traceback", e.reason))
            for e in events if e.kind in ("fail", "recover")
        ]
        status = STATUS_OF_STATE[State(job.state)]
        finished_at = job.finished_at if status == TaskResultStatus.SUCCESSFUL else (
            job.finished_at or (job.updated_at if status == TaskResultStatus.FAILED else None))
        result = TaskResult(
            task=task,
            id=f"{job.payload.get('queue_name', '')}:{job.key.removeprefix('task-')}",
            status=status,
            enqueued_at=job.created_at,
            started_at=job.first_attempt_at,
            finished_at=finished_at,
            last_attempted_at=attempts[-1].created_at if attempts else None,
            args=job.payload.get("args", []),
            kwargs=job.payload.get("kwargs", {}),
            backend=self.alias,
            errors=errors,
            worker_ids=[e.worker_id for e in attempts],
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", job.result)
        return result


def _task_of(job: Job) -> Task:
    """The `Task` a job runs, as declared by its module (its defaults are
    replaced by what the call was enqueued with). `InvalidTaskError` when
    the payload names no registered `@task` (nothing it names is imported)."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    name = payload.get("task")
    declared = _declared_task(name) if isinstance(name, str) else None
    if declared is None:
        raise InvalidTaskError(f"job {job.pk} names no registered @task: {str(name)[:200]!r}")
    # Not `using()`: that validates again against this process's settings,
    # and a job accepted at enqueue stays an obligation even if a queue was
    # since removed from the configuration.
    task = copy.copy(declared)
    object.__setattr__(task, "priority", job.priority)
    object.__setattr__(task, "queue_name", payload.get("queue_name", declared.queue_name))
    return task


@action(ACTION)
def run_task(ctx):
    """Run one enqueued `@task` call; its return value becomes the result."""
    from django_tasks import task_backends

    job = ctx.job
    task = _task_of(job)
    args, kwargs = job.payload.get("args", []), job.payload.get("kwargs", {})
    try:
        if job.payload.get("takes_context"):
            backend = task_backends[job.payload.get("backend", task.backend)]
            context = TaskContext(task_result=backend._result(job, task))
            value = task.call(context, *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - every failure is retried by the engine's policy
        raise TaskRaised(exc) from exc
    return normalize_json(value)
