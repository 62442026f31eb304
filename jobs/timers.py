"""Timers with business meaning (DESIGN §8).

A timer is permission to reconsider at `scheduled_for`, not an instruction
frozen in the past. When it comes due, the sweep (`timer_fire_due`, run by
`run_worker`) re-reads the subject through the loader registered for its
`subject_type`, then decides, in this order:

1. the timer's job has finished, or has moved on from the wait the timer was
   set for (`job_epoch`) → CANCELLED;
2. the subject is gone, or its `cancellation_condition` (a registered
   predicate) now holds — the invoice was paid, reminders were suppressed →
   CANCELLED;
3. the subject's version differs from `subject_version` (new due date, new
   terms) → the subject's planner decides from the current record: a new date
   (this timer SUPERSEDED by a new one) or nothing (CANCELLED). A subject
   without a planner fires with the fresh context and the job decides;
4. otherwise → FIRED: the waiting job becomes READY with the fresh context in
   its history (or, for a timer without a job, its `action` is enqueued).

"A reply or a timer, whichever comes first": when a timer resumes a job, the
job's other pending timers are cancelled in the same transaction; when an
inbound event resumes it first (`jobs.inbound`), its pending timers are
cancelled in that transaction. Exactly one of them resumes the job.

Registrations (in an app's `handlers` module, imported at start-up):

    register_subject("shop.invoice", loader=load_invoice, planner=plan_reminder)

    @timer_condition("invoice_settled")
    def invoice_settled(subject, **args) -> bool: ...

A loader is `loader(*, tenant, subject_id) -> SubjectState | None` (None: the
subject no longer exists); a planner is `planner(*, timer, subject) ->
datetime | None`. A loader, predicate or planner that raises does not block
the sweep: the timer fires with the error recorded, and the job — which must
re-read its subject anyway — decides under its own retry policy.

Locking (PostgreSQL): the sweep locks due timers with SKIP LOCKED and then
their job with SKIP LOCKED, so it never waits for a lock; an inbound event
locks the job and then its timers. Lock waits therefore cannot form a cycle.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from .clock import Clock, to_datetime
from .errors import JobError
from .models import Job, Timer
from .states import TERMINAL, WAITING, State
from .store import Store
from .validation import describe_exception
from .periodic import periodic_task
from .selectors import timers_due

__all__ = [
    "SubjectState",
    "TimerError",
    "register_subject",
    "timer_condition",
    "timer_schedule",
    "waiting_jobs_resume",
    "timer_cancel_for_job",
    "timer_fire_due",
]

log = logging.getLogger("jobs.timers")

Status = Timer.Status


class TimerError(JobError):
    """A timer cannot be scheduled as asked (unknown subject type or
    condition, neither or both of a job and an action)."""


@dataclass(frozen=True)
class SubjectState:
    """What a loader returns: the subject's current version and the context a
    woken job should see (JSON-serialisable)."""

    version: int | None
    context: dict = field(default_factory=dict)


Loader = Callable[..., SubjectState | None]
Planner = Callable[..., datetime | None]
Predicate = Callable[..., bool]


@dataclass(frozen=True)
class _Subject:
    loader: Loader
    planner: Planner | None


_subjects: dict[str, _Subject] = {}
_conditions: dict[str, Predicate] = {}


def register_subject(subject_type: str, *, loader: Loader, planner: Planner | None = None) -> None:
    """Tell timers how to re-read subjects of `subject_type` and how to
    re-plan a timer when the subject's version changed."""
    _subjects[subject_type] = _Subject(loader, planner)


def timer_condition(name: str):
    """Register the decorated `predicate(subject: SubjectState, **args) ->
    bool | str` as a cancellation condition: when it holds at firing time, the
    timer is cancelled instead of fired (a non-empty string is both "holds"
    and the reason recorded on the timer)."""

    def register(predicate: Predicate) -> Predicate:
        _conditions[name] = predicate
        return predicate

    return register


# ---------------------------------------------------------------- scheduling


def timer_schedule(
    *,
    scheduled_for: datetime | float,
    reason: str,
    tenant: str = "",
    job: Job | None = None,
    job_epoch: int | None = None,
    action: str = "",
    job_key: str = "",
    payload: dict | None = None,
    subject_type: str = "",
    subject_id: str | int = "",
    subject_version: int | None = None,
    cancellation_condition: str = "",
    cancellation_args: dict | None = None,
) -> Timer:
    """Create a PENDING timer.

    It either wakes `job` when it waits (from a handler, pass
    `job_epoch=ctx.epoch` and write it under `ctx.under_fence()`: the timer
    then belongs to the wait the handler is about to return, and is
    cancelled if the job moves on without it), or, without a job, enqueues
    `action` under `job_key` (default `timer-<id>`) with `payload`.

    Raises `TimerError` for an unregistered subject type or cancellation
    condition, for a subject version without a subject type, and unless
    exactly one of `job` and `action` is given.
    """
    if (job is None) == (not action):
        raise TimerError("a timer wakes a job or enqueues an action: give exactly one of job= and action=")
    if subject_type and subject_type not in _subjects:
        raise TimerError(f"no loader is registered for subject type {subject_type!r}")
    if subject_version is not None and not subject_type:
        raise TimerError("subject_version needs a subject_type to re-read the subject with")
    if cancellation_condition and cancellation_condition not in _conditions:
        known = ", ".join(sorted(_conditions)) or "none"
        raise TimerError(f"no cancellation condition {cancellation_condition!r} is registered (registered: {known})")
    tenant = tenant or (job.tenant if job is not None else "")
    if not tenant:
        raise TimerError("a timer without a job needs a tenant")
    if job is not None and job.tenant != tenant:
        raise TimerError(f"job {job.tenant}/{job.key} belongs to another tenant than {tenant!r}")
    return Timer.objects.create(
        tenant=tenant,
        job=job,
        job_epoch=job_epoch,
        action=action,
        job_key=job_key,
        payload=payload or {},
        subject_type=subject_type,
        subject_id=str(subject_id or ""),
        subject_version=subject_version,
        scheduled_for=to_datetime(scheduled_for),
        reason=reason[:500],
        cancellation_condition=cancellation_condition,
        cancellation_args=cancellation_args or {},
        created_at=timezone.now(),
    )


def timer_cancel_for_job(*, job_id: int, reason: str, now: float | datetime | None = None) -> int:
    """Cancel every PENDING timer of a job (its wait ended another way);
    returns how many. Waits for a sweep that holds one of them, so call it
    with the job's row locked: that sweep cannot then fire it."""
    at = to_datetime(now) or timezone.now()
    return Timer.objects.filter(job_id=job_id, state=Status.PENDING).update(
        state=Status.CANCELLED, decided_at=at, outcome={"decision": "cancelled", "reason": reason}
    )


def waiting_jobs_resume(*, tenant: str, subject_type: str, subject_id: str | int, reason: str, actor: str,
                        detail: dict | None = None, timer_reason: str) -> list[str]:
    """Resume the jobs of `tenant` waiting (WAITING_EXTERNAL) on one subject
    and cancel their pending timers — the subject was settled another way,
    so what they wait for will not come. One transaction per job, its row
    locked first (a sweep cannot then fire one of its timers); a job a reply
    or a timer resumed meanwhile is skipped. Returns the keys resumed."""
    waiting = (Job.objects.filter(tenant=tenant, subject_type=subject_type, subject_id=str(subject_id),
                                  state=State.WAITING_EXTERNAL).values_list("key", "pk"))
    resumed = []
    for key, pk in waiting:
        with transaction.atomic():
            if Job.objects.select_for_update().filter(pk=pk, state=State.WAITING_EXTERNAL).first() is None:
                continue
            Store().resume(tenant, key, reason=reason, actor=actor, detail=detail)
            timer_cancel_for_job(job_id=pk, reason=timer_reason)
            resumed.append(key)
    return resumed


# ---------------------------------------------------------------- firing


@periodic_task("timers.fire", every=1.0)
def timer_fire_due(*, limit: int = 100, worker_id: str = "timers", now: float | datetime | None = None) -> int:
    """Decide at most `limit` due timers (fire, cancel or supersede each);
    return how many were decided.

    One transaction; timers are locked with SKIP LOCKED (scan served by the
    partial index `timer_pending_due`), so several workers sweep at once
    without taking the same timer or waiting for each other. A timer whose
    job is awake at the timer's own epoch (LEASED, READY …) is left for a
    later sweep: it is reconsidered once the job waits.
    """
    decided = 0
    with transaction.atomic(durable=True):
        at = Clock.of(now).value()
        awake = Q(job__state__in=[State.READY, State.LEASED, State.NEEDS_ATTENTION])
        same_wait = Q(job_epoch__isnull=True) | Q(job_epoch=F("job__lease_epoch"))
        due = timers_due(at=at).filter(Q(job__isnull=True) | ~(awake & same_wait))
        if connection.vendor == "postgresql":
            due = due.select_for_update(skip_locked=True, of=("self",))
        for timer in due[:limit]:
            decided += _decide(timer, at=at, worker_id=worker_id)
    return decided


def _decide(timer: Timer, *, at: datetime, worker_id: str) -> bool:
    """Decide one locked timer; False when it must wait for a later sweep."""
    job = None
    if timer.job_id is not None:
        jobs = Job.objects.filter(pk=timer.job_id)
        if connection.vendor == "postgresql":
            # Never wait: the job's row is held by a reply resuming it (which
            # then cancels this timer) or by an operator. Look again next sweep.
            jobs = jobs.select_for_update(skip_locked=True)
        job = jobs.first()
        if job is None:
            return False
        if job.state in TERMINAL:
            return _close(timer, Status.CANCELLED, at, f"the job is {job.state}")
        if timer.job_epoch is not None and job.lease_epoch != timer.job_epoch:
            return _close(timer, Status.CANCELLED, at,
                          f"the wait it was set for has ended (the job moved on to epoch {job.lease_epoch})")
        if job.state not in WAITING:
            return False

    subject, error = None, ""
    try:
        if timer.subject_type:
            spec = _subjects.get(timer.subject_type)
            if spec is None:
                raise TimerError(f"no loader is registered for subject type {timer.subject_type!r}")
            subject = spec.loader(tenant=timer.tenant, subject_id=timer.subject_id)
            if subject is None:
                return _close(timer, Status.CANCELLED, at, f"{timer.subject_type} {timer.subject_id} no longer exists")
        if timer.cancellation_condition:
            predicate = _conditions.get(timer.cancellation_condition)
            if predicate is None:
                raise TimerError(f"no cancellation condition {timer.cancellation_condition!r} is registered")
            holds = predicate(subject, **timer.cancellation_args)
            if holds:
                # A predicate may say *why* it holds ("the customer is suppressed").
                why = holds if isinstance(holds, str) else f"cancellation condition {timer.cancellation_condition} holds"
                return _close(timer, Status.CANCELLED, at, why, subject=subject)
        if subject is not None and timer.subject_version is not None and subject.version != timer.subject_version:
            planner = _subjects[timer.subject_type].planner
            if planner is not None:
                return _replan(timer, subject, planner(timer=timer, subject=subject), at=at)
    except Exception as exc:  # noqa: BLE001 - a broken loader/predicate/planner must not stall the sweep
        error = describe_exception(exc)
        log.warning("timer.evaluation_failed", extra={"fields": {
            "event": "timer.evaluation_failed", "worker": worker_id, "timer": timer.pk, "error": error[:300],
        }})
    return _fire(timer, job, subject, at=at, error=error)


def _fire(timer: Timer, job: Job | None, subject: SubjectState | None, *, at: datetime, error: str) -> bool:
    wake = {
        "timer": timer.pk,
        "reason": timer.reason,
        "scheduled_for": timer.scheduled_for.isoformat(),
        "subject": {"type": timer.subject_type, "id": timer.subject_id,
                    "version": subject.version if subject else timer.subject_version},
        "context": subject.context if subject else {},
    }
    if error:
        wake["error"] = error
    store = Store()
    if job is not None:
        store.resume(job.tenant, job.key, reason=f"timer fired: {timer.reason}", actor="timer", detail=wake, now=at)
        outcome = {"job": job.key}
        # Whichever wake-up of this wait comes first wins; the job re-plans
        # from the fresh context. SKIP LOCKED: a sibling held by another
        # sweep finds the job moved on and cancels itself then.
        siblings = Timer.objects.filter(job_id=job.pk, state=Status.PENDING).exclude(pk=timer.pk)
        if connection.vendor == "postgresql":
            siblings = siblings.select_for_update(skip_locked=True)
        Timer.objects.filter(pk__in=list(siblings.values_list("pk", flat=True))).update(
            state=Status.CANCELLED, decided_at=at,
            outcome={"decision": "cancelled", "reason": f"timer {timer.pk} woke the job first"},
        )
    else:
        created = store.enqueue(
            timer.tenant,
            timer.job_key or f"timer-{timer.pk}",
            action=timer.action,
            payload={**timer.payload, "timer": wake},
            subject_type=timer.subject_type,
            subject_id=timer.subject_id,
            subject_version=subject.version if subject else timer.subject_version,
            actor="timer",
        )
        outcome = {"job": created.key}
    timer.state = Status.FIRED
    timer.fired_at = at
    timer.decided_at = at
    timer.outcome = {"decision": "fired", **outcome, "context": wake["context"], **({"error": error} if error else {})}
    timer.save(update_fields=["state", "fired_at", "decided_at", "outcome"])
    return True


def _replan(timer: Timer, subject: SubjectState, new_time: datetime | None, *, at: datetime) -> bool:
    change = f"{timer.subject_type} {timer.subject_id} changed from version {timer.subject_version} to {subject.version}"
    if new_time is None:
        return _close(timer, Status.CANCELLED, at, f"{change}; the planner says it is no longer needed", subject=subject)
    successor = Timer.objects.create(
        tenant=timer.tenant,
        job_id=timer.job_id,
        job_epoch=timer.job_epoch,
        action=timer.action,
        job_key=timer.job_key,
        payload=timer.payload,
        subject_type=timer.subject_type,
        subject_id=timer.subject_id,
        subject_version=subject.version,
        scheduled_for=to_datetime(new_time),
        reason=timer.reason,
        cancellation_condition=timer.cancellation_condition,
        cancellation_args=timer.cancellation_args,
        created_at=at,
    )
    timer.superseded_by = successor
    return _close(timer, Status.SUPERSEDED, at, f"{change}; re-planned for {successor.scheduled_for.isoformat()}",
                  subject=subject, extra={"successor": successor.pk})


def _close(timer: Timer, state: str, at: datetime, reason: str, *, subject: SubjectState | None = None,
           extra: dict | None = None) -> bool:
    timer.state = state
    timer.decided_at = at
    timer.outcome = {"decision": str(state).lower(), "reason": reason, **(extra or {})}
    if subject is not None:
        timer.outcome["context"] = subject.context
    timer.save(update_fields=["state", "decided_at", "outcome", "superseded_by"])
    return True

