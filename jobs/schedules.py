"""django-q2 is the calendar, never the executor (DESIGN §13).

A django-q2 `Schedule` (run by `manage.py qcluster`) may only run one of the
functions listed in `settings.DURABLE_SCHEDULES` — ours, which create durable
obligations under business keys or run a bounded, idempotent sweep, so a
repeated or late trigger is harmless. django-q2 itself would run any
importable function a Schedule names (it resolves `func` with
`pydoc.locate`), so the list is enforced twice:

- **on save**: a Schedule created with, or changed to, another function or
  any result hook is refused with a `ValidationError` (the admin form shows
  it; an ORM save raises it), whoever saves it;
- **when it fires**: django-q2's `pre_enqueue` signal sees every task before
  it is signed and queued; a task naming another function is replaced by
  `schedule_refused`, which records the refusal as a failed task — the named
  function is never imported, let alone run — and any hook is dropped.

Each schedule is given `intended_date_kwarg="intended_date"`: django-q2 then
passes the run's *scheduled* time, so a trigger that fires late (a cluster
that was down) or twice (a redelivered task) still names the same day and
therefore the same business key.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models.signals import pre_save
from django.dispatch import receiver
from django.utils import timezone
from django_q.models import Schedule
from django_q.signals import pre_enqueue

log = logging.getLogger("jobs.schedules")

INTENDED_DATE_KWARG = "intended_date"


def allowed_schedule_functions() -> set[str]:
    """The dotted paths a Schedule may run."""
    return {spec[0] for spec in settings.DURABLE_SCHEDULES.values()}


def _dotted(func) -> str:
    if isinstance(func, str):
        return func.strip()
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def schedule_validate(*, func, hook=None) -> None:
    """Raise `ValidationError` unless `func` is an allow-listed schedule
    function and no result hook is set (a hook is any function too)."""
    errors = {}
    name = _dotted(func)
    if name not in allowed_schedule_functions():
        allowed = ", ".join(sorted(allowed_schedule_functions()))
        errors["func"] = f"{name!r} is not a schedule function of this project; allowed: {allowed}"
    if hook:
        errors["hook"] = "result hooks are not allowed: a schedule only creates durable obligations"
    if errors:
        raise ValidationError(errors)


@receiver(pre_save, sender=Schedule, dispatch_uid="jobs.schedules.refuse_unlisted")
def _refuse_unlisted_schedule(sender, instance: Schedule, **kwargs) -> None:
    # The scheduler itself saves every schedule it fires (next_run, task), in
    # one transaction for all of them: refusing a row whose function did not
    # change would roll back every other schedule's trigger too. Such a row
    # (written around this check) is refused when it fires instead.
    if instance.pk is not None:
        stored = Schedule.objects.filter(pk=instance.pk).values("func", "hook").first()
        if stored == {"func": instance.func, "hook": instance.hook}:
            return
    schedule_validate(func=instance.func, hook=instance.hook)


@receiver(pre_enqueue, dispatch_uid="jobs.schedules.guard_task")
def _guard_task(sender, task: dict, **kwargs) -> None:
    """Runs inside `django_q.tasks.async_task` before the task is signed and
    queued, for every schedule that fires (and any direct `async_task`)."""
    name = _dotted(task.get("func"))
    if task.pop("hook", None):
        log.warning("dropped the result hook of django-q2 task %s (%s)", task.get("name"), name)
    if name not in allowed_schedule_functions():
        log.error("refused django-q2 task %s: %r is not an allow-listed schedule function", task.get("name"), name)
        task["func"] = "jobs.schedules.schedule_refused"
        task["args"] = (name,)
        task["kwargs"] = {}


def schedule_refused(func: str) -> None:
    """What a refused task runs instead: its failure is the record."""
    raise PermissionDenied(f"{func!r} is not an allow-listed schedule function; it was not run")


def intended_day(intended_date: str | None) -> str:
    """The calendar day (settings.TIME_ZONE) a trigger was scheduled for, as
    YYYY-MM-DD; today when called by hand."""
    at = datetime.fromisoformat(intended_date) if intended_date else timezone.now()
    if timezone.is_naive(at):
        at = timezone.make_aware(at)
    return timezone.localtime(at).date().isoformat()


# ---------------------------------------------------------------- the engine's schedule functions


def retention_sweep(intended_date: str | None = None) -> dict:
    """Redact and delete finished work past its retention (`jobs.retention`);
    idempotent: a second run finds nothing more to do. It runs until done,
    within JOBS_RETENTION_BUDGET_SECONDS and under django-q2's timeout (what
    is left is the next run's), logs its progress, and logs what it did when
    a signal stops it."""
    from .retention import retention_sweep as sweep
    from .retention import stop_on_signals

    budget = settings.Q_CLUSTER["timeout"] * 0.9 - 5
    if settings.JOBS_RETENTION_BUDGET_SECONDS:
        budget = min(budget, settings.JOBS_RETENTION_BUDGET_SECONDS)
    with stop_on_signals() as stop:
        report = sweep(budget_seconds=max(1.0, budget), progress=log.info, stop=stop)
    log.info("retention sweep for %s: %s", intended_day(intended_date), report.summary())
    return report.as_dict()


def consistency_audit(intended_date: str | None = None) -> dict:
    """File what no machine will fix as NEEDS_ATTENTION items (`jobs.audit`),
    once each: a repeated run files nothing new."""
    from .audit import consistency_audit as audit

    report = audit()
    log.info("consistency audit for %s: %s", intended_day(intended_date), report.summary())
    return {"filed": dict(report.filed), "already_filed": dict(report.already_filed), "items": report.items}


# ---------------------------------------------------------------- installing the defaults


def _first_run(kind: str, at: str, now: datetime) -> datetime:
    hour, minute = (int(part) for part in at.split(":"))
    if kind == Schedule.HOURLY:
        candidate = now.replace(minute=minute, second=0, microsecond=0)
        return candidate if candidate > now else candidate + timedelta(hours=1)
    candidate = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return candidate if candidate > now else candidate + timedelta(days=1)


def schedules_install(*, now: datetime | None = None) -> list[tuple[str, str]]:
    """Create each schedule of `settings.DURABLE_SCHEDULES` that does not
    exist yet (matched by name); an existing one — perhaps retimed by a
    superuser — is left as it is. Returns (name, "created" | "exists")."""
    now = now or timezone.now()
    outcome = []
    for name, (func, kind, at, _what) in settings.DURABLE_SCHEDULES.items():
        if Schedule.objects.filter(name=name).exists():
            outcome.append((name, "exists"))
            continue
        Schedule.objects.create(
            name=name, func=func, schedule_type=kind, repeats=-1, next_run=_first_run(kind, at, now),
            intended_date_kwarg=INTENDED_DATE_KWARG,
        )
        outcome.append((name, "created"))
    return outcome
