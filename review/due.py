"""The clock of a review: when an item waiting for review is due,
and the durable timers that act when it is not decided in time.

Whenever a job enters WAITING_REVIEW (a proposal, a handler's wait, a
failure sent to review) the Store tells this module in the same transaction
(`transitions.on_review_change`): a `ReviewDeadline` row starts a new *round* with
the due time from the policy's `ReviewTerms` (`review.policy`), and an
engine timer (`jobs.timers`, no sleeping process) is scheduled for it. When
the job leaves review — any decision, by any path — the row's times are
cleared and the round's pending timers are cancelled, in that transaction
too. The row itself stays with the job: rounds are counted over the job's
whole life, so the next stay in review (an approved job a worker sends back,
say) begins a round no earlier stay ever had.

A timer does not act itself: on firing it enqueues `jobs.review_escalate`
(`review.escalation`) under a key naming the job, the stage and the
round — unique per stay, so a timer fired twice escalates once, and a later
stay is escalated under keys of its own. It is also bound to its round by a
cancellation condition (`review_round_over`), so a timer that escaped the
cancellation (an operator's reschedule racing a decision) is cancelled when
it fires rather than acting on a review that is over; an escalation of an
earlier round finds another round running and does nothing.
"""

from datetime import datetime, timedelta

from django.utils import timezone

from jobs.models import Job, ReviewDeadline, Timer
from jobs.selectors import timers_pending_for_subject
from jobs.states import State
from jobs.timers import SubjectState, register_subject, timer_condition, timer_schedule
from jobs.transitions import on_review_change

from .policy import review_terms

__all__ = ["SUBJECT", "ESCALATE", "OVERDUE", "REJECT", "review_clock_start", "review_clock_stop",
           "review_timers", "review_deadlines_for"]

SUBJECT = "jobs.review"
ESCALATE = "jobs.review_escalate"
ROUND_OVER = "review_round_over"
OVERDUE, REJECT = "overdue", "reject"


def _load(*, tenant: str, subject_id: str) -> SubjectState | None:
    job = Job.objects.filter(tenant=tenant, pk=subject_id).first()
    if job is None:
        return None
    deadline = ReviewDeadline.objects.filter(job_id=job.pk).first()
    return SubjectState(version=None, context={"state": job.state, "round": deadline.round if deadline else None})


register_subject(SUBJECT, loader=_load)


@timer_condition(ROUND_OVER)
def review_round_over(subject: SubjectState, *, round: int, **_) -> bool | str:
    """Holds when the review the timer was set for is over: the job left
    review, or its clock was restarted (a new round)."""
    if subject.context.get("state") != State.WAITING_REVIEW:
        return f"the review ended (the job is {subject.context.get('state')})"
    if subject.context.get("round") != round:
        return f"the review's clock was restarted (round {subject.context.get('round')})"
    return False


def review_timers(job_id: int, *, tenant: str):
    """The pending timers of the job's review (partial index `timer_pending_due`)."""
    return timers_pending_for_subject(tenant=tenant, subject_type=SUBJECT, subject_id=job_id)


def _cancel_timers(job: Job, *, at: datetime, reason: str) -> int:
    return review_timers(job.pk, tenant=job.tenant).update(
        state=Timer.Status.CANCELLED, decided_at=at, outcome={"decision": "cancelled", "reason": reason})


def escalation_timer(job: Job, deadline: ReviewDeadline, *, stage: str, at: datetime) -> Timer:
    """Schedule the round's `stage` (overdue or reject) for `at`."""
    what = "due" if stage == OVERDUE else "rejected by the review policy if still undecided"
    return timer_schedule(
        scheduled_for=at, reason=f"review {what}", tenant=job.tenant, action=ESCALATE,
        job_key=f"review-{stage}-{job.pk}-r{deadline.round}",
        payload={"job_id": job.pk, "round": deadline.round, "stage": stage},
        subject_type=SUBJECT, subject_id=job.pk, cancellation_condition=ROUND_OVER,
        cancellation_args={"round": deadline.round},
    )


def review_clock_start(*, job: Job, at: datetime, reason: str = "the job entered review") -> ReviewDeadline:
    """Begin a new round of `job`'s review at `at` — a new stay, or a
    restart of the clock within one: due per the policy, the previous
    round's timers cancelled, the round numbered after every earlier one of
    the job. In the caller's transaction, with the job's row locked by it
    (a transition or a decision)."""
    terms = review_terms(job)
    deadline = ReviewDeadline.objects.select_for_update().filter(job_id=job.pk).first()
    first = deadline is None
    if first:
        deadline = ReviewDeadline(job_id=job.pk, tenant=job.tenant, round=1)
    else:
        deadline.round += 1
        _cancel_timers(job, at=at, reason=f"{reason}: the clock restarted")
    deadline.entered_at = at
    deadline.due_at = at + timedelta(seconds=terms.due_after) if terms.due_after is not None else None
    deadline.overdue_at = deadline.reject_at = None
    # The job's row lock keeps another row from appearing since the read.
    deadline.save(force_insert=first)
    if deadline.due_at is not None:
        escalation_timer(job, deadline, stage=OVERDUE, at=deadline.due_at)
    return deadline


def review_clock_stop(*, job: Job, at: datetime, reason: str) -> None:
    """End `job`'s review clock (in the caller's transaction): its pending
    timers are cancelled and its times cleared. The row keeps the round, so
    the job's next stay counts on from it."""
    stopped = ReviewDeadline.objects.filter(job_id=job.pk).update(due_at=None, overdue_at=None, reject_at=None)
    if stopped:  # a review without a clock row never had timers
        _cancel_timers(job, at=at, reason=reason)


def _review_changed(*, job_id: int, entered: bool, clock) -> None:
    job = Job.objects.get(pk=job_id)
    at = clock.value()
    if entered:
        review_clock_start(job=job, at=at)
    else:
        review_clock_stop(job=job, at=at, reason=f"the review ended: the job is {job.state}")


on_review_change(_review_changed)


def review_deadlines_for(job_ids) -> dict[int, ReviewDeadline]:
    """The deadlines of these jobs (a page of a queue), by job id."""
    return {d.job_id: d for d in ReviewDeadline.objects.filter(job_id__in=list(job_ids))}


def is_overdue(deadline: ReviewDeadline | None, *, now: datetime | None = None) -> bool:
    """Past its due time (marked by the escalation, or past due already)."""
    if deadline is None:
        return False
    if deadline.overdue_at is not None:
        return True
    return deadline.due_at is not None and deadline.due_at <= (now or timezone.now())

