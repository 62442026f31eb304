"""The console's pages (thin: read through selectors, decide through
`jobs.review` / `operations.review`; who may see and do what is asked of
`jobs.access`, never decided here)."""

from django.contrib import messages
from django.http import Http404, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from durable.numbers import NumberRefused, whole_number
from jobs import access, review
from jobs.errors import JobError
from jobs.models import Job, JobEvent
from jobs.payloads import payload_display
from jobs.selectors import newest_events
from jobs.states import State
from operations.models import IN_DOUBT, Operation

from .queues import assignment_context, next_item_url
from .queues import console_context as _context
from .queues import view_allowed as _may_view
from .timeline import timeline_json, timeline_page

SERVICES = {
    "approve": review.job_approve,
    "reject": review.job_reject,
    "retry": review.job_retry,
    "cancel": review.job_cancel,
}
JOB_DECISIONS = frozenset({*SERVICES, "correct", "resolve"})


def _job_or_404(request, job_id) -> Job:
    return access.get_visible_or_404(Job.objects.all(), request.user, scope=access.request_scope(request), pk=job_id)


def _why(job: Job, operations: list[Operation]) -> dict:
    """Why the job waits: the proposal (contract C1: the creation event's
    detail["proposal"]), the provider's rejection, or the engine's reason."""
    created = JobEvent.objects.filter(job=job, kind="enqueue").order_by("id").first()
    proposal = (created.detail or {}).get("proposal") if created and isinstance(created.detail, dict) else None
    rejected = next((op for op in reversed(operations) if op.state == "REJECTED"), None)
    rationale = (proposal or {}).get("rationale") or (created.reason if created else "")
    reason = job.wait_reason or job.last_error
    if proposal and rationale and rationale in reason:
        reason = ""  # the engine's reason only repeats the proposal's rationale
    return {
        "proposal": proposal,
        "proposed_by": (proposal or {}).get("proposed_by") or (created.actor if created else ""),
        "rationale": rationale,
        "rejected": rejected,
        "reason": reason,
    }


@require_GET
def decision_page(request, job_id):
    """One item: why it waits, its payload, history and operations, and the
    decisions this user may take on it now."""
    _may_view(request)
    job = _job_or_404(request, job_id)
    scope = access.request_scope(request)
    operations = list(Operation.objects.filter(job=job).select_related("receipt").order_by("created_at"))
    events = newest_events(job.pk, limit=20)
    # The job decisions this page takes (another app's decision on the job,
    # an operation's say, has its own page, linked below).
    allowed = {d.name: d for d in access.allowed_decisions(request.user, job, scope=scope)
               if d.name in JOB_DECISIONS}
    # A decision another app's guard refuses now (ending a job around an
    # operation in doubt, say) is not offered; the page says why.
    held_back: dict[str, list[str]] = {}
    for name, d in list(allowed.items()):
        reason = review.guard_refusal(name, job)
        if reason:
            held_back.setdefault(reason, []).append(d.label)
            del allowed[name]
    in_doubt = [op for op in operations if op.state in IN_DOUBT]
    correction = review.correction_form(job) if "correct" in allowed else None
    if correction is None:
        allowed.pop("correct", None)
    return TemplateResponse(request, "console/decide.html", _context(
        request,
        title=f"{job.tenant}/{job.key}",
        job=job,
        why=_why(job, operations),
        payload=payload_display(job.action, job.payload),
        events=events,
        seen_event=events[0].id if events else "",
        operations=operations,
        in_doubt=in_doubt,
        may_decide_operation=access.may(request.user, "decide_operation", job, scope=scope),
        allowed=allowed,
        held_back=held_back,
        correction=correction,
        note_max=review.NOTE_MAX_CHARS,
        next_url=request.GET.get("next", ""),
        assignment=assignment_context(request, job),
    ))


@require_POST
def decide(request, job_id, decision):
    """Take one decision (POST, CSRF-protected by the admin view) and go back
    to the queue; a refusal is shown on the item's page and changes nothing."""
    _may_view(request)
    job = _job_or_404(request, job_id)
    if decision not in access.DECISIONS or not access.DECISIONS[decision].states:
        raise Http404("no such decision")
    note = request.POST.get("note", "")
    try:
        # Every decision is conditional on the state the person saw.
        seen_event = review.seen_event_from(request.POST.get("seen_event", ""))
        if decision == "correct":
            changed = review.job_correct_and_approve(job_id=job.pk, user=request.user, note=note,
                                                     seen_event=seen_event, data=request.POST)
        elif decision == "resolve":
            changed = review.job_resolve(job_id=job.pk, user=request.user, note=note, seen_event=seen_event,
                                         evidence=request.POST.get("evidence", ""))
        elif decision in SERVICES:
            changed = SERVICES[decision](job_id=job.pk, user=request.user, note=note, seen_event=seen_event)
        else:
            raise Http404("no such decision")
    except (access.DecisionRefused, JobError) as exc:
        messages.error(request, f"{access.DECISIONS[decision].label} refused: {exc}")
        return redirect("console:decide", job.pk)
    messages.success(request, f"{access.DECISIONS[decision].label}: {changed.tenant}/{changed.key} is now "
                              f"{changed.state}.")
    target = request.POST.get("next", "")
    # From a queue's item: on to the next item of that queue (its filters kept).
    following = next_item_url(request, target, decided=changed)
    if following:
        return redirect(following)
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return redirect(target)
    queue = "console:review" if job.state == State.WAITING_REVIEW else "console:attention"
    return redirect(queue)


@require_GET
def timeline(request, job_id):
    """The job's story, newest first, paged by `before` (an event id)."""
    _may_view(request)
    job = _job_or_404(request, job_id)
    before = request.GET.get("before", "")
    try:
        cursor = whole_number(before, minimum=1) if before else None
    except NumberRefused as exc:
        return HttpResponseBadRequest(f"before: an event id of this timeline's pages {exc}",
                                      content_type="text/plain; charset=utf-8")
    entries, older = timeline_page(job, before=cursor)
    resolved = [(entry, reverse(entry.link, args=[entry.pk]) if entry.link else "") for entry in entries]
    return TemplateResponse(request, "console/timeline.html", _context(
        request, title=f"Evidence timeline — {job.tenant}/{job.key}", job=job, entries=resolved, older=older,
        first_page=not before,
    ))


@require_GET
def timeline_download(request, job_id):
    """The job's whole history as JSON, streamed."""
    _may_view(request)
    job = _job_or_404(request, job_id)
    response = StreamingHttpResponse(timeline_json(job), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-history.json"'
    return response
