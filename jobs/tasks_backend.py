"""The Django tasks API on the durable engine (DESIGN §13).

    TASKS = {"default": {"BACKEND": "jobs.tasks_backend.DurableBackend", "QUEUES": ["default"]}}

    from django_tasks import task          # `django.tasks` in Django 6

    @task(priority=10, queue_name="default")
    def send_digest(user_id): ...

    result = send_digest.enqueue(42)       # inside the caller's transaction
    send_digest.get_result(result.id).status

Every enqueued `@task` call is a job of action `django_tasks.run` that
`run_worker` runs with leases, fencing and retries like any other:

- `enqueue` validates the task (module-level function or coroutine function,
  priority, aware `run_after`, a configured queue whose name fits a tenant)
  and its arguments as django-tasks does (`TypeError` for a type JSON cannot
  hold, `ValueError` for a value: NaN, ±Infinity, a NUL character), then
  creates the job inside the caller's transaction: a rolled-back enqueue
  leaves nothing to run. It sends `task_enqueued`.
- The queue is the job's tenant, `tasks:<queue_name>` (OPTIONS `TENANT_PREFIX`
  changes `tasks:`), so queues are served fairly against each other and
  `run_worker --tenant tasks:emails` dedicates workers to one queue.
- `priority` (-100…100) is the job's priority; `run_after` its first eligible
  time. OPTIONS `MAX_ATTEMPTS` (default 3) bounds the attempts of one call.
- The result id is a UUID; the job is `tasks:<queue_name>` / `task-<uuid hex>`
  (never reused, unlike a primary key a rolled-back insert gave away). Job
  states map onto task statuses:

  | job state                                  | task status  |
  | ------------------------------------------ | ------------ |
  | READY (new, or waiting for its retry)      | READY        |
  | LEASED, WAITING_EXTERNAL                   | RUNNING      |
  | DONE                                       | SUCCESSFUL   |
  | NEEDS_ATTENTION, WAITING_REVIEW, CANCELLED | FAILED       |

  A FAILED task that an operator retries in the admin becomes READY again.
  `errors` lists each failed attempt (exception class and traceback),
  `worker_ids` the worker of each attempt.
- The worker sends `task_started` before each attempt and `task_finished`
  once the attempt's outcome is committed, with the status it recorded
  (SUCCESSFUL; FAILED; READY when the attempt failed and will be retried); a
  failure's `task_finished` is sent while the task's own exception is being
  handled, so the `django_tasks` logger's `logger.exception` carries its
  traceback, as django-tasks' database worker does.
- What the task is (its path, backend alias, queue, `run_after`) is kept in
  the job's first history event too, so a result stays readable after
  retention redacted the payload (its arguments then read as `[]` and `{}`).

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
import logging
import threading
import uuid
from datetime import datetime

from django.core import checks
from django.db import transaction
from django.db.models import Q
from django.utils.module_loading import autodiscover_modules
from django_tasks.backends.base import BaseTaskBackend
from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
from django_tasks.signals import task_enqueued, task_finished, task_started
from django_tasks.utils import get_exception_traceback, get_module_path, normalize_json

from .actions import action
from .errors import NeedsAttention, TransientError
from .models import Job, JobEvent, JobSearch
from .states import State
from .store import Store
from .validation import JOB_FIELD_LIMITS, json_problem, text_problem

ACTION = "django_tasks.run"

# The django-tasks logger: its own signal receivers write the task lines;
# this module adds the line for a task it cannot even name.
log = logging.getLogger("django_tasks")

STATUS_OF_STATE = {
    State.READY: TaskResultStatus.READY,
    State.LEASED: TaskResultStatus.RUNNING,
    State.WAITING_EXTERNAL: TaskResultStatus.RUNNING,
    State.DONE: TaskResultStatus.SUCCESSFUL,
    State.NEEDS_ATTENTION: TaskResultStatus.FAILED,
    State.WAITING_REVIEW: TaskResultStatus.FAILED,
    State.CANCELLED: TaskResultStatus.FAILED,
}

# The history a result is built from: the enqueue (what the task is), each
# attempt's row (the row that ended it carries its claim, `claimed_at`; a
# `claim` row, or a `takeover` row without one, is a claim recorded before
# claims were kept on the job row) and each failure (fail, recover).
_RESULT_EVENTS = ("enqueue", "claim", "takeover", "fail", "recover")
# The fields of a payload (and of the enqueue event) that say which task a job runs.
_IDENTITY = ("task", "backend", "queue_name", "takes_context", "run_after")


def _exception_detail(exc: BaseException) -> dict:
    return {"exception_class_path": get_module_path(type(exc)),
            "traceback": get_exception_traceback(exc)[-8000:]}


class TaskRaised(TransientError):
    """A task function raised (anything, `SystemExit` and `KeyboardInterrupt`
    included), or its task could not be imported: retried by the engine's
    policy. The original exception's class and traceback travel in the
    failure's history detail."""

    def __init__(self, exc: BaseException):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.original = exc
        self.detail = _exception_detail(exc)


class TaskReturnRefused(NeedsAttention):
    """A task ran to its end but returned a value JSON cannot hold: FAILED at
    once, never run again (its effects have happened). The detail is the
    serialisation error's class and traceback, as django-tasks records it."""

    def __init__(self, exc: BaseException):
        super().__init__(f"the task's return value cannot be stored: {type(exc).__name__}: {exc}")
        self.original = exc
        self.detail = _exception_detail(exc)


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
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        self.tenant_prefix = self.options.get("TENANT_PREFIX", "tasks:")
        self.max_attempts = int(self.options.get("MAX_ATTEMPTS", 3))

    def validate_task(self, task: Task) -> None:
        """django-tasks' checks, and a queue name that fits the job's tenant
        (`InvalidTaskError` when the task is declared or `using()` names it,
        not later at enqueue)."""
        super().validate_task(task)
        problem = self._queue_problem(task.queue_name)
        if problem:
            raise InvalidTaskError(problem)
        # A valid task declared on this backend is one a job may run (the
        # first declaration of a path is kept: `using()` copies are variants).
        _declared.setdefault(task.module_path, task)

    def check(self, **kwargs):
        yield from super().check(**kwargs)
        for queue_name in sorted(self.queues):
            problem = self._queue_problem(queue_name)
            if problem:
                yield checks.Error(problem, hint=f"TASKS[{self.alias!r}]['QUEUES']", id="jobs.E001")

    def _queue_problem(self, queue_name: str) -> str | None:
        limit = JOB_FIELD_LIMITS["tenant"] - len(self.tenant_prefix)
        if not isinstance(queue_name, str):
            return f"Queue name must be a string, not {type(queue_name).__name__}."
        if not self.tenant_for(queue_name):
            return "Queue name must not be empty when TENANT_PREFIX is empty."
        if len(queue_name) > limit:
            return (f"Queue name {queue_name[:20]!r}… is {len(queue_name)} characters long; this backend takes "
                    f"at most {limit} (the queue's tenant {self.tenant_prefix!r} + name has at most "
                    f"{JOB_FIELD_LIMITS['tenant']}).")
        problem = text_problem(queue_name)
        return f"Queue name {problem}." if problem else None

    def enqueue(self, task: Task, args, kwargs) -> TaskResult:
        """Store the call as a durable job, joining the caller's transaction,
        and send `task_enqueued`. Raises `InvalidTaskError` for a task this
        backend cannot run, `TypeError` for an argument of a type JSON cannot
        hold and `ValueError` for a value it cannot (django-tasks'
        `normalize_json`; NaN, ±Infinity, a NUL character); nothing is written
        then."""
        self.validate_task(task)
        # As django-tasks stores arguments: normalised, then as JSON (a tuple
        # is a list, a key is a string).
        call = json.loads(json.dumps(normalize_json({"args": args, "kwargs": kwargs})))
        problem = json_problem(call)
        if problem:
            raise ValueError(f"Unsupported value: {problem}")
        identity = {
            "task": task.module_path,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "takes_context": task.takes_context,
            "run_after": task.run_after.isoformat() if task.run_after else None,
        }
        # `atomic` joins an enclosing transaction: the job commits or rolls
        # back with the caller's business change.
        with transaction.atomic():
            job = Store().enqueue(
                self.tenant_for(task.queue_name),
                f"task-{uuid.uuid4().hex}",
                action=ACTION,
                payload={**identity, **call},
                priority=task.priority,
                run_at=task.run_after,
                max_attempts=self.max_attempts,
                actor=f"django_tasks:{self.alias}",
                detail=identity,
            )
        result = _task_result(job, task, [])
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The result of a task enqueued on any durable backend (as django-tasks'
        database backend reads any of its aliases' results); its `backend`
        and `task.backend` are the alias it was enqueued on, so `refresh()`
        asks that one. `TaskResultDoesNotExist` for an id no job has."""
        job = _job_of(result_id)
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        events = _result_events(job)
        return _task_result(job, _task_of(job, _identity(job, events)), events)

    def tenant_for(self, queue_name: str) -> str:
        return f"{self.tenant_prefix}{queue_name}"


def _job_of(result_id) -> Job | None:
    """The job of a result id: a UUID (or `<queue>:<uuid hex>`, as older results are named).
    The key is known, not the tenant: served by the index on the jobs' keys
    (`JobSearch`, `jobsearch_key_prefix`), not by jobs_job's (tenant, key)."""
    try:
        ref = uuid.UUID(str(result_id).rpartition(":")[2])
    except ValueError:
        return None
    keyed = JobSearch.objects.filter(key=f"task-{ref.hex}").values("job_id")
    return Job.objects.filter(id__in=keyed, action=ACTION).order_by("id").first()


def _result_events(job: Job) -> list[JobEvent]:
    # Served by `jobevent_job_id`; the enqueue event is the first.
    return list(JobEvent.objects.filter(Q(kind__in=_RESULT_EVENTS) | Q(claimed_at__isnull=False), job_id=job.pk)
                .order_by("id")[:200])


def _identity(job: Job, events: list[JobEvent]) -> dict:
    """Which task `job` runs: its payload says, or — once retention redacted
    the payload — its enqueue event."""
    if "task" in job.payload:
        return job.payload
    enqueued = next((e for e in events if e.kind == "enqueue"), None)
    if enqueued is not None and "task" in enqueued.detail:
        return enqueued.detail
    raise InvalidTaskError(f"job {job.pk} names no task (its payload holds none and its history none)")


def _task_of(job: Job, identity: dict) -> Task:
    """The `Task` a job runs, as declared by its module, with what the call
    was enqueued with (priority, queue, `run_after`, backend alias).
    `InvalidTaskError` when the job names no registered `@task` (nothing it
    names is imported)."""
    name = identity.get("task")
    declared = _declared_task(name) if isinstance(name, str) else None
    if declared is None:
        raise InvalidTaskError(f"job {job.pk} names no registered @task: {str(name)[:200]!r}")
    # Not `using()`: that validates again against this process's settings,
    # and a job accepted at enqueue stays an obligation even if a queue was
    # since removed from the configuration (or this process has no such alias).
    task = copy.copy(declared)
    run_after = identity.get("run_after")
    object.__setattr__(task, "priority", job.priority)
    object.__setattr__(task, "queue_name", identity.get("queue_name", declared.queue_name))
    object.__setattr__(task, "run_after", datetime.fromisoformat(run_after) if run_after else None)
    object.__setattr__(task, "backend", identity.get("backend", declared.backend))
    return task


def _task_result(job: Job, task: Task, events: list[JobEvent]) -> TaskResult:
    # (when, by whom) of each attempt, oldest first; the one running now is on the job row.
    attempts = [(e.claimed_at or e.created_at, e.worker_id) for e in events
                if e.claimed_at or e.kind in ("claim", "takeover")]
    if job.state == State.LEASED and job.claimed_at is not None:
        attempts.append((job.claimed_at, job.worker_id))
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
        id=str(uuid.UUID(hex=job.key.removeprefix("task-"))),
        status=status,
        enqueued_at=job.created_at,
        started_at=job.first_attempt_at,
        finished_at=finished_at,
        last_attempted_at=attempts[-1][0] if attempts else None,
        # A redacted payload has neither (retention removed the call's arguments).
        args=job.payload.get("args", []),
        kwargs=job.payload.get("kwargs", {}),
        backend=task.backend,
        errors=errors,
        worker_ids=[worker for _, worker in attempts],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.result)
    return result


def _while_handling(exc: BaseException, send) -> None:
    """Run `send()` with `exc` as the exception being handled, so a receiver's
    `logger.exception` (django-tasks' own, which error monitoring hooks)
    reports the task's exception and its traceback — not the engine's wrapper,
    and not "NoneType: None". `exc` is left as it was."""
    traceback, context = exc.__traceback__, exc.__context__
    try:
        raise exc
    except BaseException:
        exc.__traceback__, exc.__context__ = traceback, context
        send()


def _task_finished(job: Job, failure: BaseException | None) -> None:
    """`on_recorded`: the attempt's outcome is committed; send `task_finished`
    with the result as recorded (SUCCESSFUL, FAILED, or READY for a retry)."""
    original = getattr(failure, "original", failure)
    stored = Job.objects.filter(pk=job.pk).first()
    if stored is None:
        return
    events = _result_events(stored)
    try:
        result = _task_result(stored, _task_of(stored, _identity(stored, events)), events)
    except InvalidTaskError:
        # No task to name: no TaskResult can be built (django-tasks' worker
        # logs these the same way).
        result_id = str(uuid.UUID(hex=stored.key.removeprefix("task-")))
        if original is not None:
            _while_handling(original, lambda: log.exception("Task id=%s failed unexpectedly", result_id))
        return

    def send():
        task_finished.send(DurableBackend, task_result=result)

    if original is None:
        send()
    else:
        _while_handling(original, send)


@action(ACTION, on_recorded=_task_finished)
def run_task(ctx):
    """Run one enqueued `@task` call (a coroutine function in its own event
    loop); its return value, as JSON, becomes the result."""
    job = ctx.job
    args, kwargs = job.payload.get("args", []), job.payload.get("kwargs", {})
    try:
        task = _task_of(job, job.payload)
    except InvalidTaskError as exc:
        # Retried by the policy: a worker of an older release may lack a task
        # a newer one enqueued. The import error, if any, is what is recorded.
        raise TaskRaised(exc.__cause__ or exc) from exc
    try:
        result = _task_result(job, task, _result_events(job))
        task_started.send(DurableBackend, task_result=result)
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the task's failure, not the worker's
        raise TaskRaised(exc) from exc
    try:
        # As django-tasks stores it: `normalize_json` (bytes as text, tuples
        # as lists, `TypeError("Unsupported type …")` for anything else).
        stored = json.loads(json.dumps(normalize_json(value), allow_nan=False))
        problem = json_problem(stored)
        if problem:
            raise ValueError(f"Unsupported value: {problem}")
    except (TypeError, ValueError) as exc:
        raise TaskReturnRefused(exc) from exc
    return stored
