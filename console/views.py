"""The console's pages (thin: read through selectors, decide through
`review.decisions` / `operations.review`; who may see and do what is asked of
`jobs.access`, never decided here)."""

from django.apps import apps
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from durable.numbers import NumberRefused, whole_number
from jobs import access
from jobs.actions import action_preview
from jobs.errors import JobError
from jobs.models import Job, JobEvent
from jobs.payloads import payload_display
from jobs.selectors import newest_events
from jobs.states import State
from operations.models import IN_DOUBT, Operation
from review import decisions

from .queues import assignment_context, next_item_url
from .queues import console_context as _context
from .queues import view_allowed as _may_view
from .timeline import reader_masker, timeline_json, timeline_page
from .timer_views import review_clock

SERVICES = {
    "approve": decisions.job_approve,
    "reject": decisions.job_reject,
    "retry": decisions.job_retry,
    "cancel": decisions.job_cancel,
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


# The states in which a job waits for something (the page says why); in the
# others it runs or has ended (the page says how it ended).
WAITING = frozenset({State.WAITING_REVIEW, State.NEEDS_ATTENTION, State.WAITING_EXTERNAL})
ENDED = frozenset({State.DONE, State.CANCELLED})


def _subject(request, job: Job) -> dict | None:
    """What the job is about ("company.invoice 1") and, when the user may
    open that record in the admin (its view permission and their tenants, as
    its own admin decides: `ModelAdmin.get_queryset` is scoped), its link."""
    if not job.subject_type:
        return None
    subject = {"label": f"{job.subject_type} {job.subject_id}", "name": "", "url": ""}
    try:
        model = apps.get_model(job.subject_type)
    except (LookupError, ValueError):
        return subject
    if not admin.site.is_registered(model):
        return subject
    model_admin = admin.site.get_model_admin(model)
    try:
        record = model_admin.get_queryset(request).filter(pk=job.subject_id).first()
    except (ValueError, TypeError, ValidationError):
        return subject  # an id that is not one of this model's
    if record is None or not model_admin.has_view_permission(request, record):
        return subject
    opts = model._meta
    return {**subject, "name": str(record), "url": reverse(f"admin:{opts.app_label}_{opts.model_name}_change",
                                                           args=[record.pk])}


def _ending(job: Job, masker) -> dict | None:
    """How an ended job ended: the event that ended it (a person's decision
    with its note, or the engine's) — a rejection's note among them."""
    if job.state not in ENDED:
        return None
    last = JobEvent.objects.filter(job=job, to_state=job.state).order_by("-id").first()
    if last is None:
        return None
    return {"kind": last.kind, "by": last.by or "the engine", "at": last.created_at,
            "note": masker.text(last.reason)}


def _preview(preview, masker) -> dict | None:
    if preview is None:
        return None
    return {"summary": masker.text(preview.summary), "note": masker.text(preview.note),
            "fields": [(f.label, masker.field(f.name, f.value), f.multiline) for f in preview.fields]}


def _decision_response(request, job: Job, *, posted: dict | None = None, correction=None, status: int = 200):
    """The decision page of `job` — fresh from the database, or re-shown
    after a refusal with what the person wrote (`posted`: decision, note,
    evidence, error) and the correction form bound to their edits."""
    scope = access.request_scope(request)
    operations = list(Operation.objects.filter(job=job).select_related("receipt").order_by("created_at"))
    events = newest_events(job.pk, limit=20)
    preview = action_preview(job)
    masker = reader_masker(job, scope=scope, also=[{f.name: f.value for f in preview.fields}] if preview else ())
    # The job decisions this page takes (another app's decision on the job,
    # an operation's say, has its own page, linked below).
    allowed = {d.name: d for d in access.allowed_decisions(request.user, job, scope=scope)
               if d.name in JOB_DECISIONS}
    # A decision another app's guard refuses now (ending a job around an
    # operation in doubt, say) is not offered; the page says why.
    held_back: dict[str, list[str]] = {}
    for name, d in list(allowed.items()):
        reason = decisions.guard_refusal(name, job)
        if reason:
            held_back.setdefault(reason, []).append(d.label)
            del allowed[name]
    in_doubt = [op for op in operations if op.state in IN_DOUBT]
    if "correct" in allowed and correction is None:
        correction = decisions.correction_form(job)
    if "correct" not in allowed or correction is None:
        allowed.pop("correct", None)
        correction = None
    why = _why(job, operations)
    why = {**why, "rationale": masker.text(why["rationale"]), "reason": masker.text(why["reason"]),
           "rejected_error": masker.text(why["rejected"].last_error) if why["rejected"] else ""}
    return TemplateResponse(request, "console/decide.html", _context(
        request,
        title=f"{job.tenant}/{job.key}",
        job=job,
        waits=job.state in WAITING,
        ending=_ending(job, masker),
        subject=_subject(request, job),
        preview=_preview(preview, masker),
        masked=masker.active,
        why=why,
        payload=payload_display(job.action, masker.data(job.payload)),
        events=[(e, masker.text(e.reason)) for e in events],
        seen_event=events[0].id if events else "",
        operations=[{"op": op, "request": masker.data(op.request), "error": masker.text(op.last_error)}
                    for op in operations],
        in_doubt=in_doubt,
        may_decide_operation=access.may(request.user, "decide_operation", job, scope=scope),
        allowed=allowed,
        held_back=held_back,
        correction=correction,
        posted=posted or {},
        note_max=decisions.NOTE_MAX_CHARS,
        next_url=request.GET.get("next", "") if posted is None else request.POST.get("next", ""),
        assignment=assignment_context(request, job),
        **review_clock(request, job),
    ), status=status)


@require_GET
def decision_page(request, job_id):
    """One item: the effect of approving it first (its action's preview),
    then why it waits (or how it ended), its payload, history and
    operations, and the decisions this user may take on it now."""
    _may_view(request)
    return _decision_response(request, _job_or_404(request, job_id))


def _refused(request, job: Job, decision: str, exc: Exception):
    """A refused decision re-shows the page — the job as it is now, with
    the person's note, evidence and correction kept and the error beside
    the field it is about — instead of a redirect that would lose them."""
    job = _job_or_404(request, job.pk)
    label = access.DECISIONS[decision].label
    posted = {"decision": decision, "note": request.POST.get("note", ""),
              "evidence": request.POST.get("evidence", ""), "error": str(exc)}
    correction = None
    if decision == "correct" and job.state == State.WAITING_REVIEW:
        correction = decisions.correction_form(job, data=request.POST)
        if correction is not None:
            correction.is_valid()
            for name, errors in getattr(exc, "errors", {}).items():
                if name not in correction.errors:
                    for error in errors:
                        correction.add_error(name if name in correction.fields else None, error)
            if isinstance(exc, decisions.CorrectionInvalid):
                posted["error"] = "the correction is not valid: see the fields below"
    messages.error(request, f"{label} refused: {posted['error']}")
    return _decision_response(request, job, posted=posted, correction=correction,
                              status=409 if isinstance(exc, decisions.AlreadyDecided) else 400)


@require_POST
def decide(request, job_id, decision):
    """Take one decision (POST, CSRF-protected by the admin view) and go back
    to the queue; a refusal re-shows the item's page and changes nothing."""
    _may_view(request)
    job = _job_or_404(request, job_id)
    if decision not in access.DECISIONS or not access.DECISIONS[decision].states:
        raise Http404("no such decision")
    note = request.POST.get("note", "")
    try:
        # Every decision is conditional on the state the person saw.
        seen_event = decisions.seen_event_from(request.POST.get("seen_event", ""))
        if decision == "correct":
            changed = decisions.job_correct_and_approve(job_id=job.pk, user=request.user, note=note,
                                                     seen_event=seen_event, data=request.POST)
        elif decision == "resolve":
            changed = decisions.job_resolve(job_id=job.pk, user=request.user, note=note, seen_event=seen_event,
                                         evidence=request.POST.get("evidence", ""))
        elif decision in SERVICES:
            changed = SERVICES[decision](job_id=job.pk, user=request.user, note=note, seen_event=seen_event)
        else:
            raise Http404("no such decision")
    except (access.DecisionRefused, JobError) as exc:
        return _refused(request, job, decision, exc)
    if changed.state == job.state == State.WAITING_REVIEW:
        # The first of two approvals (four eyes): the effect waits for another person.
        messages.success(request, f"{access.DECISIONS[decision].label}: your approval of {changed.tenant}/"
                                  f"{changed.key} is recorded; it waits for a second reviewer's.")
    else:
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
    entries, older = timeline_page(job, before=cursor, masker=reader_masker(job, scope=access.request_scope(request)))
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
    masker = reader_masker(job, scope=access.request_scope(request))
    response = StreamingHttpResponse(timeline_json(job, masker=masker), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-history.json"'
    return response
