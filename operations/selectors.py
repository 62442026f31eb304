"""Reads about operations, for operators, commands and tests."""

from collections import Counter

from django.db.models import Count, QuerySet

from .models import IN_DOUBT, ConnectorPause, Operation, OperationState, Receipt


def operation_for_step(*, job, step: str) -> Operation | None:
    """The operation of one job step, if its intent was ever recorded."""
    return Operation.objects.filter(job=job, step=step).select_related("receipt").first()


def operations_needing_investigation(*, tenant: str | None = None) -> QuerySet[Operation]:
    """Operations only a human can reconcile, oldest first (index operation_state_tenant)."""
    operations = Operation.objects.filter(state=OperationState.NEEDS_INVESTIGATION)
    if tenant is not None:
        operations = operations.filter(tenant=tenant)
    return operations.order_by("updated_at")


def connector_pauses_in_force() -> QuerySet[ConnectorPause]:
    """The pauses in force: those not cleared (an instance says so as
    `ConnectorPause.active`). By (tenant, provider) the partial unique index
    `connector_pause_one_active` serves it, before every dispatch."""
    return ConnectorPause.objects.filter(cleared_at__isnull=True)


def connector_pause_active(*, tenant: str, provider: str) -> ConnectorPause | None:
    """The pause in force for (tenant, provider), if any."""
    return connector_pauses_in_force().filter(tenant=tenant, provider=provider).first()


def operations_by_state(*, tenant: str | None = None, job_key_prefix: str | None = None) -> Counter:
    """How many operations are in each state."""
    return _count_by(Operation.objects.all(), "state", "", tenant, job_key_prefix)


def receipts_by_how(*, tenant: str | None = None, job_key_prefix: str | None = None) -> Counter:
    """How many receipts were obtained each way (direct, replay, lookup, human)."""
    return _count_by(Receipt.objects.all(), "how", "operation__", tenant, job_key_prefix)


def _count_by(rows, column: str, to_operation: str, tenant: str | None, job_key_prefix: str | None) -> Counter:
    """Count `rows` per `column`, optionally for one tenant and job keys with a prefix."""
    if tenant is not None:
        rows = rows.filter(**{f"{to_operation}tenant": tenant})
    if job_key_prefix is not None:
        rows = rows.filter(**{f"{to_operation}job__key__startswith": job_key_prefix})
    return Counter(dict(rows.values_list(column).annotate(n=Count("id")).order_by()))


def operations_in_doubt_count(tenants: list[str] | None = None) -> int:
    """Operations the provider may hold without us knowing (INTENDED, UNKNOWN,
    NEEDS_INVESTIGATION) — a queue health figure (index operation_state_tenant)."""
    rows = Operation.objects.filter(state__in=IN_DOUBT)
    if tenants is not None:
        rows = rows.filter(tenant__in=tenants)
    return rows.count()


def receipts_for_job(job_id: int) -> list[Receipt]:
    """The receipts of a job's operations, oldest first (constraint
    `operation_one_per_job_step` finds the job's operations)."""
    return list(Receipt.objects.filter(operation__job_id=job_id).select_related("operation").order_by("created_at"))
