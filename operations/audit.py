"""The consistency audit's operations check (`jobs.audit`).

An operation UNKNOWN for longer than its provider remembers idempotency keys
and client references (`Capabilities.idempotency_retention`) can no longer
be settled by a resend or a lookup with certainty: a human must find out.
"""

from datetime import datetime, timedelta

from connectors.registry import PROVIDER_CAPABILITIES
from jobs.audit import Finding, audit_check

from .models import Operation, OperationState

DEFAULT_RETENTION = 24 * 3600.0


def retention_of(provider: str) -> float:
    """Seconds `provider` declares it remembers idempotency keys (default 24 h)."""
    capabilities = PROVIDER_CAPABILITIES.get(provider)
    declared = capabilities.idempotency_retention if capabilities else None
    return DEFAULT_RETENTION if declared is None else declared


def _past_retention(operation: Operation, at: datetime) -> bool:
    return operation.updated_at < at - timedelta(seconds=retention_of(operation.provider))


def _still_holds(ref: str, at: datetime) -> bool:
    operation = Operation.objects.filter(pk=ref, state=OperationState.UNKNOWN).first()
    return operation is not None and _past_retention(operation, at)


@audit_check("unknown-operation", still_holds=_still_holds)
def unknown_operations(at: datetime, limit: int):
    shortest = min([retention_of(p) for p in PROVIDER_CAPABILITIES] + [DEFAULT_RETENTION])
    # Served by operation_state_tenant (state first); UNKNOWN rows are few.
    candidates = (Operation.objects.filter(state=OperationState.UNKNOWN,
                                           updated_at__lt=at - timedelta(seconds=shortest))
                  .select_related("job").order_by("updated_at")[: limit * 4])
    found = 0
    for operation in candidates:
        if found >= limit or not _past_retention(operation, at):
            continue
        found += 1
        age = int((at - operation.updated_at).total_seconds())
        yield Finding(
            "unknown-operation", str(operation.pk), operation.tenant,
            f"{operation.kind} for {operation.job.tenant}/{operation.job.key} has been UNKNOWN for {age}s, "
            f"longer than {operation.provider} keeps idempotency keys",
            {"operation": str(operation.pk), "job": f"{operation.job.tenant}/{operation.job.key}",
             "step": operation.step, "provider": operation.provider, "attempts": operation.attempts,
             "request_digest": operation.request_digest, "last_error": operation.last_error[:1000],
             "unknown_since": operation.updated_at.isoformat(), "unknown_for_seconds": age,
             "provider_retention_seconds": retention_of(operation.provider)},
        )
