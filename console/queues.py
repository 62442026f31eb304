"""The console's queues (DESIGN §16): items waiting for review and items
that need an operator, searched and filtered by query parameters that every
link keeps (pages, bulk previews, the next item after a decision); bulk
decisions over a queue's query (`review.bulk`); assignment (`review.assignment`).

Thin, as every console page: the set of items is the one selector
`queue_jobs`, the decisions are the review layer's services, who may see what is
`jobs.access`."""

from urllib.parse import urlencode, urlsplit

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, QueryDict
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import Resolver404, resolve, reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from durable.numbers import NumberRefused, whole_number
from jobs import access
from jobs.actions import registered_actions
from jobs.models import DecisionBatch, Job
from jobs.search import AGES, SEARCH_MAX_CHARS, SEARCH_MIN_CHARS, jobs_matching
from jobs.states import State
from operations.models import Operation
from review import assignment, bulk
from review.decisions import NOTE_MAX_CHARS
from review.masking import MASK, job_masker

from .timer_views import queue_deadlines

QUEUE_PAGE = 50
SAMPLE = 20  # items a bulk preview lists
STAFF_CANDIDATES = 200  # people an operator's "assign to" list considers

# "waiting longer than": the age filter's choices.
FILTERS = ("q", "tenant", "action", "reason", "proposer", "age", "assignee")
TEXT_FILTERS = ("q", "reason")  # free text, matched against texts that hold sensitive values
QUEUES = {State.WAITING_REVIEW: ("console:review", "Waiting for review"),
          State.NEEDS_ATTENTION: ("console:attention", "Needs attention")}


def _number_or_none(text: str, *, minimum: int = 0) -> int | None:
    try:
        return whole_number(text, minimum=minimum)
    except NumberRefused:
        return None


def view_allowed(request):
    """`PermissionDenied` unless the user may open the console's pages."""
    if not access.may_view_jobs(request.user):
        raise PermissionDenied


def console_context(request, **values):
    """The admin's context for a console page, and `values`."""
    return {**admin.site.each_context(request), "opts": Job._meta, **values}


def queue_jobs(user, state: str, params, *, scope=None):
    """The items of the queue of `state` that `user` sees, narrowed by the
    query parameters `params` (FILTERS), oldest first (index
    job_queue_order; a text search by job_search_trgm). Returns the
    queryset, the filters applied ({name: value}, what links keep) and the
    problems with the ones that were not (shown beside the form)."""
    scope = scope or access.scope_of(user)
    jobs = scope.filter(Job.objects.filter(state=state))
    values = {name: (params.get(name) or "").strip() for name in FILTERS}
    problems = []
    # The tenants whose sensitive text this reader sees masked: a search or
    # the reason filter must not read it there either.
    masked = access.masked_tenants(scope)
    if values["q"]:
        if len(values["q"]) < SEARCH_MIN_CHARS or len(values["q"]) > SEARCH_MAX_CHARS:
            problems.append(f"search: write {SEARCH_MIN_CHARS} to {SEARCH_MAX_CHARS} characters")
            values["q"] = ""
        else:
            jobs = jobs_matching(jobs, values["q"], masked=masked)
    if values["tenant"]:
        jobs = jobs.filter(tenant=values["tenant"])
    if values["action"]:
        jobs = jobs.filter(action=values["action"])
    if values["proposer"]:
        jobs = jobs.filter(proposed_by=values["proposer"])
    if values["reason"]:
        jobs = (jobs.filter(wait_reason__icontains=values["reason"]) if state == State.WAITING_REVIEW
                else jobs.filter(last_error__icontains=values["reason"])).exclude(tenant__in=masked)
    if values["age"]:
        if values["age"] in AGES:
            jobs = jobs.filter(updated_at__lte=timezone.now() - AGES[values["age"]])
        else:
            problems.append(f"age: choose one of {', '.join(AGES)}")
            values["age"] = ""
    if values["assignee"]:
        if (assigned := assignment.jobs_assigned(jobs, values["assignee"], user=user)) is not None:
            jobs = assigned
        else:
            problems.append("assignee: me, none or a user id")
            values["assignee"] = ""
    return jobs.order_by("updated_at", "id"), {k: v for k, v in values.items() if v}, problems


def _queue(request, state: str, template: str):
    view_allowed(request)
    scope = access.request_scope(request)
    jobs, filters, problems = queue_jobs(request.user, state, request.GET, scope=scope)
    # A page number that is not one shows the first page.
    page = Paginator(jobs.select_related("assignee"), QUEUE_PAGE).get_page(
        _number_or_none(request.GET.get("page", ""), minimum=1))
    operations = {}
    for op in Operation.objects.filter(job__in=[job.pk for job in page]).order_by("created_at"):
        operations.setdefault(op.job_id, []).append(op)
    deadlines = queue_deadlines(page) if state == State.WAITING_REVIEW else {}
    rows = []
    for job in page:
        ops = operations.get(job.pk, [])
        # A viewer reads the reasons and errors with the action's sensitive
        # values masked, as on the decision page (review.masking).
        masker = job_masker(job, sees_sensitive=access.sees_sensitive(job.tenant, scope=scope),
                            also=[op.request for op in ops])
        rows.append({"job": job, "deadline": deadlines.get(job.pk), "reason": masker.text(job.wait_reason),
                     "error": masker.text(job.last_error),
                     "operations": [{"op": op, "error": masker.text(op.last_error)} for op in ops]})
    url_name, title = QUEUES[state]
    here = reverse(url_name) + (f"?{urlencode(filters)}" if filters else "")
    return TemplateResponse(request, template, console_context(
        request, title=title, page=page, rows=rows, tenants=scope.tenants(), actions=registered_actions(),
        filters=filters, problems=problems, ages=list(AGES), here=here, query=urlencode(filters),
        bulk_decisions=[name for name in bulk.BULK_DECISIONS[state]
                        if request.user.has_perm(access.DECISIONS[name].permission)],
    ))


@require_GET
def review_queue(request):
    """Items waiting for review, oldest first, searched and filtered."""
    return _queue(request, State.WAITING_REVIEW, "console/review_queue.html")


@require_GET
def attention_queue(request):
    """Items that need an operator, oldest first, with their evidence."""
    return _queue(request, State.NEEDS_ATTENTION, "console/attention_queue.html")


# ---------------------------------------------------------------- the next item after a decision


def next_item_url(request, target: str, *, decided: Job) -> str | None:
    """Where a decision taken from a queue's item goes: the next item of
    that queue (`target`, the queue's URL with its filters) the user may
    decide, or the queue itself when none is left; None when `target` is
    not one of the queues."""
    if not target or not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return None
    parts = urlsplit(target)
    try:
        match = resolve(parts.path)
    except Resolver404:
        return None
    state = next((s for s, (name, _) in QUEUES.items() if f"{match.namespace}:{match.url_name}" == name), None)
    if state is None:
        return None
    jobs, _, _ = queue_jobs(request.user, state, QueryDict(parts.query))
    scope = access.request_scope(request)
    for job in jobs.exclude(pk=decided.pk)[:QUEUE_PAGE]:
        if assignment.may_decide_in_queue(request.user, job, scope=scope):
            return f"{reverse('console:decide', args=[job.pk])}?{urlencode({'next': target})}"
    return target


# ---------------------------------------------------------------- bulk decisions


def _bulk(request, state: str):
    view_allowed(request)
    url_name, title = QUEUES[state]
    decisions = bulk.BULK_DECISIONS[state]
    if not any(request.user.has_perm(access.DECISIONS[name].permission) for name in decisions):
        raise PermissionDenied
    if request.method == "POST":
        decision = request.POST.get("decision", "")
        try:
            batch = bulk.batch_take(token=request.POST.get("token", ""), user=request.user, decision=decision,
                                    note=request.POST.get("note", ""))
        except access.DecisionRefused as exc:
            messages.error(request, f"Bulk decision refused: {exc}")
            back = request.POST.get("query", "")
            return redirect(reverse(f"{url_name}-bulk") + (f"?{back}" if back else ""))
        report = messages.success if batch.status == DecisionBatch.Status.DONE else messages.warning
        report(request, f"Batch {batch.pk} ({access.DECISIONS[batch.decision].label.lower()}): "
                        f"{batch.decided} decided, {batch.first_approvals} first approvals recorded (waiting for a "
                        f"second reviewer), {batch.skipped} skipped because they moved since the preview, "
                        f"{batch.refused} refused"
                        + (f", {batch.unfinished} not decided because of an error: take the batch again to decide "
                           f"them" if batch.unfinished else "") + ".")
        return redirect("console:batch", batch.pk)
    scope = access.request_scope(request)
    jobs, filters, problems = queue_jobs(request.user, state, request.GET, scope=scope)
    batch, matched = bulk.batch_preview(user=request.user, queue=state, jobs=jobs, query=filters)
    sample = list(Job.objects.filter(pk__in=[job_id for job_id, _ in batch.items[:SAMPLE]])
                  .order_by("updated_at", "id"))
    return TemplateResponse(request, "console/bulk_preview.html", console_context(
        request, title=f"Bulk decision — {title}", queue_title=title, queue_url=reverse(url_name),
        batch=batch, matched=matched, count=len(batch.items), sample=sample, cap=bulk.BULK_MAX,
        filters=filters, problems=problems, query=urlencode(filters),
        decisions=[access.DECISIONS[name] for name in decisions
                   if request.user.has_perm(access.DECISIONS[name].permission)],
        note_max=NOTE_MAX_CHARS,
    ))


@require_http_methods(["GET", "POST"])
def review_bulk(request):
    """Preview (GET: count, sample, a token fixing the set) or take (POST) a
    bulk approve/reject over the review queue's filters."""
    return _bulk(request, State.WAITING_REVIEW)


@require_http_methods(["GET", "POST"])
def attention_bulk(request):
    """Preview or take a bulk retry/cancel over the attention queue's filters."""
    return _bulk(request, State.NEEDS_ATTENTION)


@require_GET
def batch_page(request, batch_id):
    """One bulk decision: who took it, with which note, and what became of
    each item. Shown to its author, and to whoever sees all its tenants."""
    view_allowed(request)
    batch = DecisionBatch.objects.select_related("user").filter(pk=batch_id).first()
    scope = access.request_scope(request)
    # A batch that touched no tenant (an empty preview) names none to check:
    # it is its author's alone, or ids counted upwards would show anyone the
    # filters of every other tenant's previews.
    if batch is None or not (batch.user_id == request.user.pk or scope.everything
                             or (batch.tenants and all(scope.sees(t) for t in batch.tenants))):
        raise Http404("no such batch")
    # The texts typed into the search and reason filters may be a value the
    # reader sees masked in one of the batch's tenants.
    masked = set(access.masked_tenants(scope)) & set(batch.tenants) and batch.user_id != request.user.pk
    query = {name: MASK if masked and name in TEXT_FILTERS and value else value for name, value in batch.query.items()}
    jobs = {job.pk: job for job in scope.filter(Job.objects.filter(pk__in=[i for i, _ in batch.items]))}
    rows = [{"job": jobs.get(job_id), "job_id": job_id, "outcome": batch.outcome.get(str(job_id), "not taken")}
            for job_id, _ in batch.items]
    # Its user may take a batch cut off half-way again (the token is theirs alone).
    unfinished = batch.status in (DecisionBatch.Status.TAKING, DecisionBatch.Status.INTERRUPTED)
    retake_url = (reverse(f"{QUEUES[batch.queue][0]}-bulk")
                  if unfinished and batch.user_id == request.user.pk and batch.queue in QUEUES else "")
    return TemplateResponse(request, "console/batch.html", console_context(
        request, title=f"Decision batch {batch.pk}", batch=batch, rows=rows, query=query, retake_url=retake_url,
        label=access.DECISIONS[batch.decision].label if batch.decision else "",
    ))


# ---------------------------------------------------------------- assignment


def _back(request, job: Job):
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return redirect(target)
    return redirect("console:decide", job.pk)


@require_POST
def assign(request, job_id):
    """Assign the item to the signed-in user, or (operators) to `user`."""
    view_allowed(request)
    job = access.get_visible_or_404(Job.objects.all(), request.user, scope=access.request_scope(request),
                                    pk=job_id)
    raw = request.POST.get("user", "").strip()
    assignee_id = None
    if raw:
        assignee_id = _number_or_none(raw, minimum=1)
        if assignee_id is None:
            messages.error(request, "Assignment refused: user must be a user id")
            return _back(request, job)
    try:
        changed = assignment.job_assign(job_id=job.pk, user=request.user, assignee_id=assignee_id,
                                        note=request.POST.get("note", ""))
    except access.DecisionRefused as exc:
        messages.error(request, f"Assignment refused: {exc}")
    else:
        messages.success(request, f"{changed.tenant}/{changed.key} is assigned to "
                                  f"{changed.assignee.get_username()}.")
    return _back(request, job)


@require_POST
def unassign(request, job_id):
    """Release the item (its assignee, or an operator)."""
    view_allowed(request)
    job = access.get_visible_or_404(Job.objects.all(), request.user, scope=access.request_scope(request),
                                    pk=job_id)
    try:
        changed = assignment.job_unassign(job_id=job.pk, user=request.user, note=request.POST.get("note", ""))
    except access.DecisionRefused as exc:
        messages.error(request, f"Release refused: {exc}")
    else:
        messages.success(request, f"{changed.tenant}/{changed.key} is assigned to nobody now.")
    return _back(request, job)


def assignment_context(request, job: Job) -> dict:
    """What the decision page's assignment box shows: the assignee, and
    whether this user may take, release or give the item."""
    scope = access.request_scope(request)
    in_queue = job.state in assignment.QUEUE_STATES
    may_decide = assignment.may_decide_in_queue(request.user, job, scope=scope)
    give = in_queue and assignment.may_assign_others(request.user, job, scope=scope)
    candidates = []
    if give:
        staff = get_user_model().objects.filter(is_active=True, is_staff=True).order_by("username")
        candidates = assignment.assignable_users(job, candidates=staff[:STAFF_CANDIDATES])
    return {"assignee": job.assignee, "may_take": in_queue and may_decide and job.assignee_id != request.user.pk,
            "may_release": in_queue and job.assignee_id is not None
            and (job.assignee_id == request.user.pk or give),
            "candidates": candidates, "in_queue": in_queue}
