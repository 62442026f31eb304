"""Decisions on a job that no worker holds: what an operator, a reviewer, or
the system on their behalf (the consistency audit, a review policy) does.

Each decision is one keyword-only function that checks its move against the
transition table (`states.py`), changes the job and appends its history row
(who, why, from → to, the epoch) in one transaction — joining the caller's,
so the review layer's decision services, which are the outermost transaction
of a person's decision (`atomic(durable=True)`), commit the change, its
history row and the admin's `LogEntry` together. A move the table does not
allow raises `InvalidTransition` and writes nothing; a job that does not
exist raises `JobNotFound`.

Who may take which decision is not decided here: `jobs.access` answers that
for the review layer, which calls these."""

from django.db import transaction

from .clock import Clock
from .errors import Conflict
from .models import Job
from .states import State
from .transitions import decide_on, history_append, job_locked
from .validation import job_validate, storable_text

__all__ = ["job_retry", "job_approve", "job_correct", "job_reject", "job_resolve", "job_cancel", "job_escalate",
           "job_note", "job_assign"]


def job_retry(*, tenant: str, key: str, reason: str, actor: str, detail: dict | None = None, now=None) -> Job:
    """An operator sends a job that needs attention (or review) back to
    work with a fresh attempt budget: READY at once."""
    return decide_on(tenant=tenant, key=key, name="retry", target=State.READY, reason=reason, actor=actor,
                     detail=detail, now=now,
                     extra={"next_attempt_at": None, "attempts": 0, "first_attempt_at": None, "recoveries": 0})


def job_approve(*, tenant: str, key: str, reason: str, actor: str, detail: dict | None = None, now=None) -> Job:
    """A reviewer approves a job waiting for review: READY at once."""
    return decide_on(tenant=tenant, key=key, name="approve", target=State.READY, reason=reason, actor=actor,
                     detail=detail, now=now, extra={"next_attempt_at": None})


def job_correct(*, tenant: str, key: str, payload: dict, reason: str, actor: str, detail: dict | None = None,
                now=None) -> Job:
    """A reviewer approves a job waiting for review with a corrected
    `payload` (the caller records before → after in `detail`); the job is
    found by its new values as well as by the old ones."""
    return decide_on(tenant=tenant, key=key, name="correct", target=State.READY, reason=reason, actor=actor,
                     detail=detail, now=now, extra={"next_attempt_at": None, "payload": payload, "last_error": ""})


def job_reject(*, tenant: str, key: str, reason: str, actor: str, detail: dict | None = None, now=None) -> Job:
    """A reviewer rejects a job waiting for review: closed (CANCELLED)."""
    return decide_on(tenant=tenant, key=key, name="reject", target=State.CANCELLED, reason=reason, actor=actor,
                     detail=detail, now=now, finished=True)


def job_resolve(*, tenant: str, key: str, reason: str, actor: str, detail: dict | None = None, now=None) -> Job:
    """An operator marks the obligation fulfilled, with evidence in
    `detail` (e.g. "the provider shows it was sent"): DONE."""
    return decide_on(tenant=tenant, key=key, name="resolve", target=State.DONE, reason=reason, actor=actor,
                     detail=detail, now=now, finished=True)


def job_cancel(*, tenant: str, key: str, reason: str, actor: str, detail: dict | None = None, now=None) -> Job:
    """Cancel a job that is not running (terminal, not a success)."""
    return decide_on(tenant=tenant, key=key, name="cancel", target=State.CANCELLED, reason=reason, actor=actor,
                     detail=detail, now=now, finished=True)


def job_escalate(*, tenant: str, key: str, reason: str, actor: str, detail: dict | None = None, now=None) -> Job:
    """Send a job that is not running to an operator (NEEDS_ATTENTION)."""
    return decide_on(tenant=tenant, key=key, name="escalate", target=State.NEEDS_ATTENTION, reason=reason,
                     actor=actor, detail=detail, now=now)


def job_note(*, tenant: str, key: str, kind: str, reason: str, actor: str, state: str, detail: dict | None = None,
             payload: dict | None = None, now=None) -> Job:
    """Record what happened to a job that stays in `state` — a first of
    two approvals, a correction awaiting the second, an overdue review, an
    operator moving a timer — as a history row (`kind`, from = to =
    `state`), and with `payload` replace its payload. No transition: the
    state machine is not involved, and a job no longer in `state` raises
    `Conflict` with nothing written."""
    clock = Clock.of(now)
    with transaction.atomic():
        job = job_locked(tenant, key)
        if job.state != state:
            raise Conflict(f"{tenant}/{key} is {job.state}, not {state}; nothing was recorded")
        if payload is not None:
            checked = job_validate(tenant=tenant, key=key, action=job.action, payload=payload,
                                   priority=job.priority, run_at=None, max_attempts=job.max_attempts,
                                   default_max_attempts=job.max_attempts)
            Job.objects.filter(pk=job.pk).update(payload=checked.payload)
        history_append(job.id, kind, job.state, job.state, clock, epoch=job.lease_epoch, actor=actor,
                       reason=storable_text(reason), detail=detail)
    return Job.objects.get(pk=job.pk)


def job_assign(*, job_id: int, assignee_id: int | None, actor: str, reason: str, detail: dict | None = None,
               now=None) -> Job:
    """Set (or clear, with None) who took the job in its queue — not a
    transition: the state and `updated_at` (the queue's order) stay, and the
    history row says who assigned whom. The caller has checked who may."""
    clock = Clock.of(now)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        Job.objects.filter(pk=job.pk).update(assignee_id=assignee_id)
        history_append(job.id, "assign" if assignee_id else "unassign", job.state, job.state, clock,
                       epoch=job.lease_epoch, actor=actor, reason=reason, detail=detail)
    return Job.objects.get(pk=job.pk)
