"""Human decisions about operations and connectors (operators, in the admin).

The machine path (intent, dispatch, reconciliation) is `protocol.py`. These
services are what a person does when the machine must not guess: vouch that
the provider holds a message, confirm that it does not, or clear a pause
after fixing credentials. Each changes state and writes its history row in
one transaction.
"""

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from jobs import interventions

from .errors import OperationStateError
from .models import IN_DOUBT, ConnectorPause, Operation, OperationState, Receipt, ReceiptHow
from .selectors import connector_pauses_in_force
from .states import operation_transition

S = OperationState


def operation_resolve_by_human(
    *,
    operation: Operation,
    actor: str,
    provider_reference: str,
    evidence: dict,
    reason: str,
    accepted_at: datetime | None = None,
    continue_job: bool = False,
) -> Receipt:
    """A person vouches that the provider holds the operation's message.

    Records a `human` receipt (who, why, what they looked at), moves the
    operation to ACCEPTED and decides the job, all in one transaction: by
    default the job is resolved (DONE, `interventions.job_resolve`) — the operation was
    its point; with `continue_job` it is sent back to work (`interventions.job_retry`) and
    its handler carries on past this step, finding the receipt without any I/O.

    Raises `OperationStateError` when the operation already has a receipt or
    `actor`, `provider_reference` or `reason` is empty, and
    `jobs.errors.InvalidTransition` when the job is not waiting for a person
    (NEEDS_ATTENTION or WAITING_REVIEW) — e.g. a worker holds it right now.
    Nothing is written on error.
    """
    if not (actor and provider_reference and reason):
        raise OperationStateError("a human receipt needs who (actor), the provider's reference and why (reason)")
    with transaction.atomic():
        operation = Operation.objects.select_for_update().get(pk=operation.pk)
        if operation.state == S.ACCEPTED:
            raise OperationStateError(f"operation {operation.id} already has a receipt ({operation.receipt})")
        job = operation.job
        detail = {"operation": str(operation.id), "provider_reference": provider_reference}
        # The job's transition first: it locks the job and refuses if a worker holds it.
        decide = interventions.job_retry if continue_job else interventions.job_resolve
        decide(tenant=job.tenant, key=job.key, reason=f"{reason} (receipt recorded by hand for operation {operation.id})",
               actor=actor, detail=detail)
        receipt = Receipt.objects.create(
            operation=operation, provider_reference=provider_reference,
            accepted_at=accepted_at or timezone.now(), how=ReceiptHow.HUMAN, evidence=evidence or {},
            recorded_by=actor, reason=reason,
        )
        _human_change(operation, "human_receipt", S.ACCEPTED, actor=actor, reason=reason,
                      detail={**detail, "evidence": evidence or {}}, last_error="")
    return receipt


def operation_confirm_not_accepted(*, operation: Operation, actor: str, reason: str, evidence: dict | None = None,
                                   cancel_job: bool = False):
    """A person confirms the provider does not hold an in-doubt operation
    (INTENDED, UNKNOWN or NEEDS_INVESTIGATION): it becomes FAILED — safe to
    send again — and its job goes back to work (`interventions.job_retry`), where the next
    attempt sends it under the same operation id; with `cancel_job` the job
    is cancelled instead (`interventions.job_cancel`): nothing is sent, and neither the
    operation nor the job is left undecided.

    Raises `OperationStateError` for an operation not in doubt or an empty
    `actor`/`reason`, and `jobs.errors.InvalidTransition` when the job is not
    waiting for a person. Nothing is written on error.
    """
    if not (actor and reason):
        raise OperationStateError("confirming that nothing was sent needs who (actor) and why (reason)")
    with transaction.atomic():
        operation = Operation.objects.select_for_update().get(pk=operation.pk)
        if operation.state not in IN_DOUBT:
            raise OperationStateError(
                f"operation {operation.id} is {operation.state}, not in doubt; nothing to confirm"
            )
        job = operation.job
        decide = interventions.job_cancel if cancel_job else interventions.job_retry
        decide(tenant=job.tenant, key=job.key, reason=f"{reason} (operation {operation.id} confirmed not sent)",
               actor=actor, detail={"operation": str(operation.id)})
        _human_change(operation, "human_not_accepted", S.FAILED, actor=actor, reason=reason,
                      detail={"evidence": evidence or {}}, last_error=f"confirmed not sent by {actor}: {reason}")
    return operation


def connector_pause_clear(*, tenant: str, provider: str, actor: str, reason: str = "") -> ConnectorPause | None:
    """Lift the pause on (tenant, provider) after the credentials were fixed.

    Returns the cleared pause, or None when none was in force (clearing twice
    is harmless). Jobs that went to NEEDS_ATTENTION because of it stay there
    until an operator retries them: the pause does not know which were
    merely blocked and which an operator has since decided otherwise.
    """
    if not actor:
        raise OperationStateError("clearing a pause needs who (actor)")
    with transaction.atomic():
        pause = connector_pauses_in_force().select_for_update().filter(tenant=tenant, provider=provider).first()
        if pause is None:
            return None
        pause.cleared_at = timezone.now()
        pause.cleared_by = actor
        pause.clear_reason = reason
        pause.save(update_fields=["cleared_at", "cleared_by", "clear_reason"])
    return pause


def _human_change(operation: Operation, kind: str, to_state: str, *, actor: str, reason: str, detail: dict,
                  **changes) -> None:
    operation_transition(operation, kind, to_state=to_state, actor=actor, reason=reason, detail=detail, **changes)
