"""The console's part of a review's clock and of a job's waits:
what the decision page shows (due time, overdue, first approvals, pending
timers) and the operators' forms on timers and waits — each a POST that
calls one service of `review.decisions` (permission, role, tenant and the state
the operator saw are checked there) and comes back to the page."""

from datetime import UTC, datetime

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from jobs import access
from jobs.errors import JobError
from jobs.models import Job
from jobs.states import State
from review import decisions
from review.due import is_overdue, review_deadlines_for
from review.policy import review_terms

__all__ = ["review_clock", "queue_deadlines", "timer_run_now", "timer_reschedule", "wait_cancel"]


def queue_deadlines(jobs) -> dict:
    """Due time and overdue mark of a page of queue rows, by job id (one query)."""
    deadlines = review_deadlines_for(job.pk for job in jobs)
    return {pk: {"due_at": d.due_at, "overdue": is_overdue(d), "overdue_at": d.overdue_at}
            for pk, d in deadlines.items()}


def review_clock(request, job: Job) -> dict:
    """The decision page's context about time and four eyes."""
    scope = access.request_scope(request)
    deadline = review_deadlines_for([job.pk]).get(job.pk) if job.state == State.WAITING_REVIEW else None
    in_review = job.state == State.WAITING_REVIEW
    required = review_terms(job).approvals if in_review else 1
    return {
        "deadline": deadline,
        "overdue": is_overdue(deadline),
        "approvals_required": required,
        "first_approvals": decisions.approvals_so_far(job) if required > 1 else [],
        "timers": list(decisions.job_timers(job)[:20]),
        "may_run_timer": access.may(request.user, "run_timer", job, scope=scope),
        "may_reschedule_timer": access.may(request.user, "reschedule_timer", job, scope=scope),
        "may_cancel_wait": access.may(request.user, "cancel_wait", job, scope=scope),
    }


def _job_or_404(request, job_id) -> Job:
    if not access.may_view_jobs(request.user):
        raise Http404("no such object")
    return access.get_visible_or_404(Job.objects.all(), request.user, scope=access.request_scope(request), pk=job_id)


def _taken(request, job: Job, decision: str, call) -> object:
    label = access.DECISIONS[decision].label
    try:
        changed = call(decisions.seen_event_from(request.POST.get("seen_event", "")))
    except (access.DecisionRefused, JobError) as exc:
        messages.error(request, f"{label} refused: {exc}")
    else:
        messages.success(request, f"{label}: {changed.tenant}/{changed.key} is {changed.state}.")
    return redirect("console:decide", job.pk)


@require_POST
def timer_run_now(request, job_id, timer_id):
    """Make one of the job's pending timers due now."""
    job = _job_or_404(request, job_id)
    return _taken(request, job, "run_timer", lambda seen: decisions.timer_run_now(
        job_id=job.pk, timer_id=timer_id, user=request.user, note=request.POST.get("note", ""), seen_event=seen))


@require_POST
def timer_reschedule(request, job_id, timer_id):
    """Move one of the job's pending timers (`scheduled_for`: a UTC date and time)."""
    job = _job_or_404(request, job_id)
    text = request.POST.get("scheduled_for", "").strip()
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        messages.error(request, f"Reschedule timer refused: {text!r:.40} is not a date and time "
                                f"(YYYY-MM-DD HH:MM, UTC); nothing changed")
        return redirect("console:decide", job.pk)
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at
    return _taken(request, job, "reschedule_timer", lambda seen: decisions.timer_reschedule(
        job_id=job.pk, timer_id=timer_id, user=request.user, note=request.POST.get("note", ""), seen_event=seen,
        scheduled_for=at))


@require_POST
def wait_cancel(request, job_id):
    """End the job's external wait (CANCELLED), with the operator's reason."""
    job = _job_or_404(request, job_id)
    return _taken(request, job, "cancel_wait", lambda seen: decisions.job_cancel_wait(
        job_id=job.pk, user=request.user, note=request.POST.get("note", ""), seen_event=seen))
