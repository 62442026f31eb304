"""Retention: finished work does not pile up forever (DESIGN §13).

`retention_sweep` does two things, oldest first, in bounded batches of
`JOBS_RETENTION_BATCH` jobs, each batch its own short transaction (a sweep
never holds a long transaction, and it never locks READY rows, so the queue
keeps flowing while it runs):

1. **Deletion** — DONE and CANCELLED jobs finished more than
   `JOBS_RETENTION_DAYS` ago are deleted with their history, timers, applied
   inbound events, and the rows registered apps tie to them (external calls
   and their receipts).
2. **Redaction** — DONE and CANCELLED jobs finished more than
   `JOBS_REDACT_AFTER_DAYS` ago have their `payload` (and, through the
   registered apps, the request bodies of their external calls) replaced by a marker;
   `Job.redacted_at` records when. Keys, states, digests and history stay.
   When deletion stopped at its batch limit, the rows already past
   retention that it did not reach are left for the next sweep to delete,
   not rewritten on their way out.

Never touched, by either phase: any job that is not DONE or CANCELLED, and
any finished job something live still refers to (`_referred_to`: one rule
for both) — a PENDING timer, an UNMATCHED inbound event (an operator still
has to look at it), or what an app that registered a `retention_dependent`
says must be kept (an external call still in doubt — the operator deciding
it must see what was asked of the provider —, or one an active connector
pause names as its evidence). A table of another app that PROTECTs a job
keeps that job too (reported as kept).
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import ProtectedError, Q
from django.db.utils import IntegrityError

from .clock import Clock
from .models import InboundEvent, Job, JobEvent, Timer
from .selectors import FINISHED

__all__ = ["RetentionReport", "retention_sweep", "retention_dependent", "REDACTED"]


def REDACTED(at: datetime) -> dict:
    """What a redacted body becomes."""
    return {"redacted": True, "redacted_at": at.isoformat()}


@dataclass(frozen=True)
class RetentionDependent:
    """Rows of another app that belong to jobs (the engine never imports it)."""

    name: str
    keep: Callable[[list[int]], set[int]]  # of these job ids, those that must stay
    delete: Callable[[list[int]], dict[str, int]]  # delete what belongs to these jobs; counts by table
    redact: Callable[[list[int], datetime], dict[str, int]]  # redact bodies of these jobs; counts by table


_dependents: dict[str, RetentionDependent] = {}


def retention_dependent(name: str, *, keep, delete, redact) -> None:
    """Register the rows of another app that belong to jobs (e.g. external calls)."""
    _dependents[name] = RetentionDependent(name, keep, delete, redact)


@dataclass
class RetentionReport:
    redacted: Counter = field(default_factory=Counter)  # rows redacted, by table
    deleted: Counter = field(default_factory=Counter)  # rows deleted, by table
    kept: int = 0  # finished jobs past the cutoff kept because something live refers to them
    kept_unredacted: int = 0  # finished jobs past the redaction cutoff left whole for the same reason
    batches: int = 0

    def as_dict(self) -> dict:
        return {"redacted": dict(self.redacted), "deleted": dict(self.deleted), "kept": self.kept,
                "kept_unredacted": self.kept_unredacted, "batches": self.batches}

    def summary(self) -> str:
        def show(counts):
            return ", ".join(f"{n} {table}" for table, n in sorted(counts.items()) if n) or "nothing"

        return (f"redacted {show(self.redacted)}; deleted {show(self.deleted)}; "
                f"kept {self.kept} finished job(s) still referred to (and {self.kept_unredacted} unredacted); "
                f"{self.batches} batch(es)")


def retention_sweep(
    *,
    now: float | datetime | None = None,
    retention_days: float | None = None,
    redact_after_days: float | None = None,
    batch_size: int | None = None,
    max_batches: int = 200,
) -> RetentionReport:
    """Delete, then redact, finished work past its retention (see the module
    docstring for what is never touched). At most `max_batches` batches of
    `batch_size` jobs per phase; the next sweep continues where work is left.
    Returns what it redacted, deleted and kept."""
    at = Clock.of(now).value()
    retention = settings.JOBS_RETENTION_DAYS if retention_days is None else retention_days
    redact_after = settings.JOBS_REDACT_AFTER_DAYS if redact_after_days is None else redact_after_days
    size = batch_size or settings.JOBS_RETENTION_BATCH
    report = RetentionReport()
    # Deletion first: what it removes need not be redacted on the way out.
    retention_cutoff = at - timedelta(days=retention)
    expired = Job.objects.filter(state__in=FINISHED, finished_at__lt=retention_cutoff)
    deletion = _Pages(expired, size, max_batches)
    for ids in deletion:
        _delete(ids, report)
    if redact_after is not None and redact_after < retention:
        unredacted = Job.objects.filter(state__in=FINISHED, redacted_at__isnull=True,
                                        finished_at__lt=at - timedelta(days=redact_after))
        if not deletion.exhausted:
            # Deletion stopped at its limit: the rows past retention it did
            # not reach are the next sweep's to delete, not to rewrite now.
            unredacted = unredacted.filter(finished_at__gte=retention_cutoff)
        for ids in _Pages(unredacted, size, max_batches):
            _redact(ids, at, report)
    return report


class _Pages:
    """Keyset pages of job ids over (finished_at, id) — served by the partial
    indexes `job_finished` / `job_finished_unredacted` — so kept rows at the
    front never stall the sweep and no page rescans the ones before it. At
    most `max_batches` pages; `exhausted` tells, once iterated, whether the
    rows ran out before that limit."""

    def __init__(self, rows, size: int, max_batches: int):
        self.rows, self.size, self.max_batches = rows, size, max_batches
        self.exhausted = False

    def __iter__(self):
        after = None
        for _ in range(self.max_batches):
            page = self.rows
            if after is not None:
                page = page.filter(Q(finished_at__gt=after[0]) | Q(finished_at=after[0], id__gt=after[1]))
            keys = list(page.order_by("finished_at", "id").values_list("finished_at", "id")[:self.size])
            if keys:
                yield [job_id for _, job_id in keys]
            if len(keys) < self.size:
                self.exhausted = True
                return
            after = keys[-1]


def _redact(ids: list[int], at: datetime, report: RetentionReport) -> None:
    with transaction.atomic():
        # The state condition again (a batch is read before its transaction),
        # under the row locks deletion takes.
        candidates = list(Job.objects.select_for_update().filter(id__in=ids, state__in=FINISHED,
                                                                 redacted_at__isnull=True)
                          .values_list("id", flat=True))
        keep = _referred_to(candidates)
        report.kept_unredacted += len(keep)
        ids = [job_id for job_id in candidates if job_id not in keep]
        if not ids:
            return
        report.redacted["jobs.Job.payload"] += Job.objects.filter(id__in=ids).update(payload=REDACTED(at),
                                                                                     redacted_at=at)
        for dependent in _dependents.values():
            report.redacted.update(dependent.redact(ids, at))
        report.batches += 1


def _referred_to(ids: list[int]) -> set[int]:
    """Finished jobs that something live still refers to."""
    keep = set(Timer.objects.filter(job_id__in=ids, state=Timer.Status.PENDING).values_list("job_id", flat=True))
    keep |= set(InboundEvent.objects.filter(job_id__in=ids, state=InboundEvent.Status.UNMATCHED)
                .values_list("job_id", flat=True))
    for dependent in _dependents.values():
        keep |= dependent.keep(ids)
    return keep


def _delete(ids: list[int], report: RetentionReport) -> None:
    with transaction.atomic():
        candidates = list(Job.objects.select_for_update().filter(id__in=ids, state__in=FINISHED)
                          .values_list("id", flat=True))
        keep = _referred_to(candidates)
        doomed = [job_id for job_id in candidates if job_id not in keep]
        report.kept += len(keep)
        report.batches += 1
        if not doomed:
            return
        try:
            with transaction.atomic():
                report.deleted.update(_delete_jobs(doomed))
                return
        except (ProtectedError, IntegrityError):
            pass
        # Some table outside the engine still PROTECTs one of them: delete one
        # by one and keep those that are referred to.
        for job_id in doomed:
            try:
                with transaction.atomic():
                    report.deleted.update(_delete_jobs([job_id]))
            except (ProtectedError, IntegrityError):
                report.kept += 1


def _delete_jobs(ids: list[int]) -> Counter:
    deleted = Counter()
    for dependent in _dependents.values():
        deleted.update(dependent.delete(ids))
    deleted["jobs.InboundEvent"] += InboundEvent.objects.filter(job_id__in=ids).delete()[0]
    deleted["jobs.Timer"] += Timer.objects.filter(job_id__in=ids).delete()[0]
    deleted["jobs.JobEvent"] += JobEvent.objects.filter(job_id__in=ids)._raw_delete(JobEvent.objects.db)
    # The ORM delete honours every other foreign key to Job (PROTECT raises).
    _, by_model = Job.objects.filter(id__in=ids, state__in=FINISHED).delete()
    deleted["jobs.Job"] += by_model.get("jobs.Job", 0)
    return deleted
