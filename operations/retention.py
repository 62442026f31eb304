"""Operations under the engine's retention sweep (`jobs.retention`).

An operation and its receipt are evidence of what was done in a job's name;
they go when their job goes, and their request bodies are redacted when the
job's payload is. An operation still in doubt (INTENDED, UNKNOWN,
NEEDS_INVESTIGATION) or named by a connector pause in force keeps its job.
"""

from datetime import datetime

from jobs.retention import REDACTED, retention_dependent

from .models import IN_DOUBT, Operation, Receipt
from .selectors import connector_pauses_in_force


def _keep(job_ids: list[int]) -> set[int]:
    keep = set(Operation.objects.filter(job_id__in=job_ids, state__in=IN_DOUBT).values_list("job_id", flat=True))
    keep |= set(connector_pauses_in_force().filter(operation__job_id__in=job_ids)
                .values_list("operation__job_id", flat=True))
    return keep


def _delete(job_ids: list[int]) -> dict[str, int]:
    receipts = Receipt.objects.filter(operation__job_id__in=job_ids).delete()[0]
    # Cascades to the operations' events; cleared pauses keep their row
    # (the operation link becomes NULL).
    _, by_model = Operation.objects.filter(job_id__in=job_ids).delete()
    return {"operations.Receipt": receipts, "operations.Operation": by_model.get("operations.Operation", 0),
            "operations.OperationEvent": by_model.get("operations.OperationEvent", 0)}


def _redact(job_ids: list[int], at: datetime) -> dict[str, int]:
    return {"operations.Operation.request": Operation.objects.filter(job_id__in=job_ids).update(request=REDACTED(at))}


retention_dependent("operations", keep=_keep, delete=_delete, redact=_redact)
