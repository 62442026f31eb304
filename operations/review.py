"""Operators' decisions that involve operations, taken in the console (DESIGN
§14): what became of an operation in doubt, and clearing a connector pause
(then retrying the jobs it held back). Each checks `jobs.access`, what the
user saw, and writes the job's event and an admin `LogEntry` in the same
transaction as the change.

Also the guards this app adds to the review layer's decisions (`review.decisions`):
a job whose operation is in doubt is never ended around it (resolved,
cancelled or rejected: the operation would stay undecidable and the job
unprunable for ever) — the operation's decision ends the job instead — and a
payload is never corrected while an operation may have reached the provider.
"""

from django.db import transaction

from jobs import access
from jobs.access import DecisionRefused, decision_logged
from jobs.models import Job
from jobs.selectors import jobs_needing_attention
from review.decisions import check_seen, decision_text, job_for_decision, job_retry

from .models import IN_DOUBT, ConnectorPause, Operation, OperationState, Receipt
from .services import connector_pause_clear, operation_confirm_not_accepted, operation_resolve_by_human

S = OperationState
# The provider may hold the request (or does): correcting it now could send both.
MAY_HAVE_REACHED_PROVIDER = frozenset({S.INTENDED, S.UNKNOWN, S.ACCEPTED, S.NEEDS_INVESTIGATION})


def operations_in_doubt(job: Job):
    return Operation.objects.filter(job=job, state__in=IN_DOUBT).order_by("created_at")


# What an operator may record for an operation in doubt, and what it does to the job.
OPERATION_DECISIONS = {
    "sent": "The provider holds it — record a receipt and resolve the job",
    "not_sent": "The provider does not hold it — send it again (same operation id)",
    "not_sent_cancel": "The provider does not hold it — cancel the job (nothing is sent)",
}
PROVIDER_REFERENCE_MAX_CHARS = Receipt._meta.get_field("provider_reference").max_length


def refuse_ending_around_doubt(job: Job) -> str:
    """Guard for the decisions that end a job (`job_resolve`, `job_cancel`,
    `job_reject`): ending it must go through the operation's decision."""
    doubt = operations_in_doubt(job).first()
    if doubt is None:
        return ""
    return (f"operation {doubt.id} is {doubt.state}: the provider may hold it. Record what the provider shows "
            f"(sent, with its reference; or not sent, then send it again or cancel the job) — that decides "
            f"the job too, so no operation is left behind")


def refuse_correction_after_dispatch(job: Job) -> str:
    """Guard for `job_correct_and_approve`."""
    reached = Operation.objects.filter(job=job, state__in=MAY_HAVE_REACHED_PROVIDER).order_by("created_at").first()
    if reached is None:
        return ""
    return (f"operation {reached.id} is {reached.state}: it may have reached the provider, so correcting the "
            f"request could send it twice; decide the operation first")


def operation_decide(*, operation_id, user, decision: str, note: str, seen_event: int | None,
                     provider_reference: str = "", evidence: str = "") -> Operation:
    """An operator records what the provider shows for an operation in doubt,
    on the job as they saw it (`seen_event`, required):
    `decision="sent"` (a human receipt with `provider_reference`; the job is
    resolved), `"not_sent"` (the operation FAILED, safe to send again; the
    job is retried under the same operation id) or `"not_sent_cancel"` (the
    operation FAILED and the job cancelled: nothing is sent, nothing is left
    in doubt).

    Raises `Http404` (another tenant's operation), `DecisionRefused`
    (permission, role, job state, an empty or over-long note or evidence, a
    missing seen state), `AlreadyDecided`, and what the operation services
    raise (`OperationStateError`, `InvalidTransition`). Nothing is written on
    error."""
    note = decision_text(note)
    evidence = decision_text(evidence, what="evidence", required=False)
    provider_reference = (provider_reference or "").strip()
    if len(provider_reference) > PROVIDER_REFERENCE_MAX_CHARS:
        raise DecisionRefused(f"the provider's reference is at most {PROVIDER_REFERENCE_MAX_CHARS} characters")
    if decision not in OPERATION_DECISIONS:
        raise DecisionRefused("say whether the provider holds it (sent) or not (not_sent, not_sent_cancel)")
    with transaction.atomic(durable=True):  # a human decision: never nested
        operation = access.get_visible_or_404(Operation.objects.all(), user, pk=operation_id)
        job = job_for_decision(operation.job_id)
        check_seen(job, seen_event)
        access.require(user, "decide_operation", job)
        actor = user.get_username()
        extra = {"note": evidence} if evidence else {}
        if decision == "sent":
            operation_resolve_by_human(operation=operation, actor=actor, evidence=extra,
                                       provider_reference=provider_reference, reason=note)
            message = f"Operation {operation.id}: the provider holds it as {provider_reference}. {note}"
        else:
            cancel = decision == "not_sent_cancel"
            operation_confirm_not_accepted(operation=operation, actor=actor, evidence=extra, reason=note,
                                           cancel_job=cancel)
            then = "the job is cancelled" if cancel else "the job sends it again"
            message = f"Operation {operation.id}: confirmed not sent; {then}. {note}"
        operation.refresh_from_db()
        decision_logged(user=user, obj=operation, message=message)
        job.refresh_from_db()
        decision_logged(user=user, obj=job, message=message)
    return operation


def jobs_held_by_pause(pause: ConnectorPause):
    """Jobs of the pause's tenant that need attention because of it: their
    last error is the refusal of credentials by that provider, or the pause
    itself (see `protocol._pause` and `protocol._paused_reason`)."""
    from django.db.models import Q

    held = Q(last_error__startswith=f"{pause.provider} refused the credentials of tenant {pause.tenant}") | Q(
        last_error__contains=f"connector {pause.provider} paused for tenant {pause.tenant}"
    )
    return jobs_needing_attention(tenant=pause.tenant).filter(held)


def connector_pause_decide(*, pause_id: int, user, note: str,
                           retry: dict[int, int | None] | None = None) -> tuple[ConnectorPause, list[Job]]:
    """An operator clears a connector pause (credentials fixed) and retries
    the held jobs they chose (`retry`: job id → the newest history row of it
    their page showed, for jobs of `jobs_held_by_pause`). The clearing and
    each retry are separate decisions: a job someone else decided meanwhile
    (or whose seen state is missing) is skipped, not forced. Returns the
    pause and the jobs retried."""
    note = decision_text(note)
    with transaction.atomic(durable=True):  # a human decision: never nested
        pause = access.get_visible_or_404(ConnectorPause.objects.all(), user, pk=pause_id)
        reason = access.refusal(user, "clear_pause", tenant=pause.tenant)
        if reason:
            raise DecisionRefused(reason)
        held = {job.pk: job for job in jobs_held_by_pause(pause)}
        if pause.active:
            connector_pause_clear(tenant=pause.tenant, provider=pause.provider, actor=user.get_username(),
                                  reason=note)
            pause.refresh_from_db()
            decision_logged(user=user, obj=pause, message=f"Cleared: {note}")
    retried = []
    for job_id, seen_event in (retry or {}).items():
        if job_id not in held:
            continue
        try:
            retried.append(job_retry(job_id=job_id, user=user, seen_event=seen_event,
                                     note=f"connector {pause.provider} pause cleared: {note}"))
        except DecisionRefused:
            continue  # decided by someone else meanwhile: their decision stands
    return pause, retried
