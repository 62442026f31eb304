"""What a review's timer does when it fires (`review.due`): the job
`jobs.review_escalate` it enqueues marks the item overdue and tells the
tenant's reviewers, or — a second period later, when the policy says so —
rejects it through the decision service (`review.decisions.job_reject_by_policy`).

Each step re-reads the reviewed job under its row lock and does nothing when
the review round it was set for is over (decided, its clock restarted, or an
earlier stay in review): a late escalation is harmless. The overdue mark,
its history row, the reject timer and the reviewers' notices are written in
one transaction, so a step retried after a failure does all of it once, and
a step run again after it succeeded changes nothing and answers as it did.
An overdue time is never earlier than the stay in review it belongs to.
"""

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import transaction

from jobs import interventions
from jobs.actions import action
from jobs.models import Job, ReviewDeadline
from jobs.states import State

from . import decisions
from .due import ESCALATE, OVERDUE, REJECT, escalation_timer
from .policy import POLICY_ACTOR, review_terms

__all__ = ["register_overdue_notifier", "review_escalate"]

# Told, in the overdue mark's transaction, that an item is overdue:
# `notifier(job=…, deadline=…)` — the business app enqueues an email to each
# of the tenant's reviewers (keyed by the round, so telling twice is harmless).
_notifiers: list[Callable] = []


def register_overdue_notifier(notifier: Callable) -> None:
    """Add a notifier (registering it twice is harmless)."""
    if notifier not in _notifiers:
        _notifiers.append(notifier)


def _fired_at(payload: dict) -> datetime:
    # The time the round's timer was set for: the escalation is dated by the
    # policy's clock, not by when a worker got round to it.
    scheduled = (payload.get("timer") or {}).get("scheduled_for")
    return datetime.fromisoformat(scheduled) if scheduled else None


@action(ESCALATE, description="Mark an undecided review overdue, or reject it when the tenant's policy says so.")
def review_escalate(ctx) -> dict:
    payload = ctx.payload
    job_id, round_, stage = payload.get("job_id"), payload.get("round"), payload.get("stage")
    if stage == REJECT:
        return decisions.job_reject_by_policy(job_id=job_id, round=round_, due=_fired_at(payload))
    if stage != OVERDUE:
        raise ValueError(f"unknown review escalation stage {stage!r}")
    marked = _mark_overdue(job_id=job_id, round_=round_, at=_fired_at(payload))
    if marked is None:
        return {"skipped": "the review ended or its clock restarted"}
    job, deadline = marked
    return {"overdue": job.key, "round": round_, "reject_at": deadline.reject_at.isoformat()
            if deadline.reject_at else None}


def _mark_overdue(*, job_id: int, round_: int, at: datetime | None):
    """Mark the round overdue, schedule its reject step and tell the
    reviewers, once: `(job, deadline)` — also when this round was marked
    already — or None when the round is no longer the job's review."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        deadline = ReviewDeadline.objects.filter(job_id=job_id).first()
        if job is None or job.state != State.WAITING_REVIEW or deadline is None or deadline.round != round_:
            return None
        if deadline.overdue_at is not None:
            return job, deadline
        terms = review_terms(job)
        # A timer moved behind the stay's start (a reschedule into the past)
        # does not date the mark before the item was there to be reviewed.
        deadline.overdue_at = max(at or deadline.due_at, deadline.entered_at)
        if terms.reject_after is not None:
            deadline.reject_at = deadline.overdue_at + timedelta(seconds=terms.reject_after)
        deadline.save(update_fields=["overdue_at", "reject_at"])
        interventions.job_note(tenant=job.tenant, key=job.key, kind="overdue", state=State.WAITING_REVIEW, actor=POLICY_ACTOR,
                     reason=f"not decided by {deadline.due_at:%Y-%m-%d %H:%M:%S %Z}; the tenant's reviewers are told"
                            + (f"; rejected at {deadline.reject_at:%Y-%m-%d %H:%M:%S %Z} if still undecided"
                               if deadline.reject_at else ""),
                     detail={"round": round_, "due_at": deadline.due_at.isoformat(),
                             "reject_at": deadline.reject_at.isoformat() if deadline.reject_at else None,
                             "policy": terms.source})
        if deadline.reject_at is not None:
            escalation_timer(job, deadline, stage=REJECT, at=deadline.reject_at)
        for notifier in _notifiers:
            notifier(job=job, deadline=deadline)
    return job, deadline
