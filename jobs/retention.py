"""Retention: finished work does not pile up forever (DESIGN §13).

`retention_sweep` does two things, oldest first, in batches (starting at
`JOBS_RETENTION_BATCH` jobs and sized to take about
`JOBS_RETENTION_BATCH_SECONDS` each), each batch its own short transaction
followed by a pause (`JOBS_RETENTION_PAUSE_RATIO` times the batch's
duration), until the work runs out, its time budget
(`JOBS_RETENTION_BUDGET_SECONDS`) is spent or a signal stops it (a sweep
never holds a long transaction, and it never locks READY rows, so the queue
keeps flowing while it runs):

1. **Deletion** — DONE and CANCELLED jobs finished more than
   `JOBS_RETENTION_DAYS` ago are deleted with their history, search rows,
   timers, applied inbound events, and the rows registered apps tie to them
   (external calls and their receipts).
2. **Redaction** — DONE and CANCELLED jobs finished more than
   `JOBS_REDACT_AFTER_DAYS` ago have their `payload` (and, through the
   registered apps, the request bodies of their external calls) replaced by a marker,
   and their search text cut to their key, subject and proposer;
   `Job.redacted_at` records when. Keys, states, digests and history stay.
   When deletion stopped before the end, the rows already past
   retention that it did not reach are left for the next sweep to delete,
   not rewritten on their way out.

On PostgreSQL the history (`jobs.JobEvent`) is partitioned by day
(`jobs.partitions`): a deleted job's history stays in its day's partition
until the whole partition is dropped, which happens only once no remaining
job has history in it.

Never touched, by either phase: any job that is not DONE or CANCELLED, and
any finished job something live still refers to (`_referred_to`: one rule
for both) — a PENDING timer, an UNMATCHED inbound event (an operator still
has to look at it), or what an app that registered a `retention_dependent`
says must be kept (an external call still in doubt — the operator deciding
it must see what was asked of the provider —, or one an active connector
pause names as its evidence). A table of another app that PROTECTs a job
keeps that job too (reported as kept).
"""

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import ProtectedError, Q, QuerySet
from django.db.utils import IntegrityError

from .clock import Clock
from .models import InboundEvent, Job, JobSearch, Timer
from .partitions import history_delete, history_partitioned, history_partitions_drop, history_partitions_ensure
from .search import search_texts_redact
from .selectors import FINISHED

__all__ = ["RetentionReport", "retention_sweep", "retention_dependent", "REDACTED", "stop_on_signals"]


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
    # done (nothing left), budget, signal or max_batches: why the sweep ended.
    stopped_by: str = ""
    seconds: float = 0.0
    # PostgreSQL's partitioned history (`jobs.partitions`): partitions made
    # ahead, dropped, and kept because a remaining job has history in them
    # (name: how many such jobs, at least).
    partitions_created: list[str] = field(default_factory=list)
    partitions_dropped: list[str] = field(default_factory=list)
    partitions_kept: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"redacted": dict(self.redacted), "deleted": dict(self.deleted), "kept": self.kept,
                "kept_unredacted": self.kept_unredacted, "batches": self.batches, "stopped_by": self.stopped_by,
                "seconds": self.seconds, "partitions_created": self.partitions_created,
                "partitions_dropped": self.partitions_dropped, "partitions_kept": self.partitions_kept}

    def summary(self) -> str:
        def show(counts):
            return ", ".join(f"{n} {table}" for table, n in sorted(counts.items()) if n) or "nothing"

        return (f"redacted {show(self.redacted)}; deleted {show(self.deleted)}; "
                f"kept {self.kept} finished job(s) still referred to (and {self.kept_unredacted} unredacted); "
                f"{self.batches} batch(es)" + self._partitions() + self._end())

    def _partitions(self) -> str:
        if not (self.partitions_created or self.partitions_dropped or self.partitions_kept):
            return ""
        return (f"; history partitions: {len(self.partitions_created)} created ahead, "
                f"{len(self.partitions_dropped)} dropped, {len(self.partitions_kept)} kept (remaining jobs "
                f"have history in them)")

    def _end(self) -> str:
        why = {"": "", "done": "", "budget": "; stopped at its time budget, the rest is the next sweep's",
               "signal": "; stopped by a signal, the rest is the next sweep's",
               "max_batches": "; stopped at --max-batches, the rest is the next sweep's"}[self.stopped_by]
        return f"; {self.seconds:.1f} s{why}" if self.stopped_by else why


@contextmanager
def stop_on_signals():
    """An event SIGTERM and SIGINT set while the block runs (instead of
    killing the process), so a sweep ends after its current batch and says
    what it did. Outside the main thread signals cannot be caught: the event
    then stays unset."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum in previous:
        signal.signal(signum, lambda *_: stop.set())
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def retention_sweep(
    *,
    now: float | datetime | None = None,
    retention_days: float | None = None,
    redact_after_days: float | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    budget_seconds: float | None = None,
    pause_ratio: float | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every: float = 10.0,
    stop: threading.Event | None = None,
) -> RetentionReport:
    """Delete, then redact, finished work past its retention (see the module
    docstring for what is never touched), then, on PostgreSQL with the
    partitioned history, create the history partitions ahead and drop the old
    ones no remaining job has history in (`jobs.partitions`).

    Each phase runs until its rows run out, `budget_seconds` (default
    JOBS_RETENTION_BUDGET_SECONDS; 0: none) have passed, `stop` is set (a
    signal) or, if given, `max_batches` batches; the next sweep continues
    where work is left (`report.stopped_by` tells why it ended). Batches
    start at `batch_size` jobs and adapt to take about
    JOBS_RETENTION_BATCH_SECONDS each; after each one the sweep pauses
    `pause_ratio` times as long as the batch took, so the workers keep the
    database. `progress` receives a line every `progress_every` seconds."""
    at = Clock.of(now).value()
    retention = settings.JOBS_RETENTION_DAYS if retention_days is None else retention_days
    redact_after = settings.JOBS_REDACT_AFTER_DAYS if redact_after_days is None else redact_after_days
    budget = settings.JOBS_RETENTION_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    run = _Run(size=batch_size or settings.JOBS_RETENTION_BATCH, max_batches=max_batches,
               deadline=(time.monotonic() + budget) if budget else None,
               pause_ratio=settings.JOBS_RETENTION_PAUSE_RATIO if pause_ratio is None else pause_ratio,
               progress=progress, progress_every=progress_every, stop=stop or threading.Event())
    report = run.report
    # Deletion first: what it removes need not be redacted on the way out.
    retention_cutoff = at - timedelta(days=retention)
    # In two halves, each oldest first through its own partial index:
    # redacted rows (`job_finished_redacted`), then the rest
    # (`job_finished_unredacted`); no index holds both (a finish writes only
    # the second).
    expired = Job.objects.filter(state__in=FINISHED, finished_at__lt=retention_cutoff)
    deletion = _Pages(run, "deleting", expired.filter(redacted_at__isnull=False),
                      expired.filter(redacted_at__isnull=True))
    for ids in deletion:
        run.timed(_delete, ids, report)
    if redact_after is not None and redact_after < retention and not run.stopped_by:
        unredacted = Job.objects.filter(state__in=FINISHED, redacted_at__isnull=True,
                                        finished_at__lt=at - timedelta(days=redact_after))
        if not deletion.exhausted:
            # Deletion stopped at its limit: the rows past retention it did
            # not reach are the next sweep's to delete, not to rewrite now.
            unredacted = unredacted.filter(finished_at__gte=retention_cutoff)
        for ids in _Pages(run, "redacting", unredacted):
            run.timed(_redact, ids, at, report)
    if history_partitioned():
        # Ahead of the clock even when deletion was cut short: new history
        # must always find its day's partition.
        report.partitions_created = history_partitions_ensure(now=at)
        if not run.stopped_by:
            dropped, kept = history_partitions_drop(before=retention_cutoff)
            report.partitions_dropped, report.partitions_kept = dropped, kept
    report.stopped_by = run.stopped_by or ("max_batches" if run.limited else "done")
    report.seconds = round(time.monotonic() - run.started, 3)
    return report


class _Run:
    """One sweep's pace and limits: the adaptive batch size, the pause after
    each batch, the budget, the stop signal and the progress lines."""

    MIN_SIZE, MAX_SIZE = 50, 20_000

    def __init__(self, *, size, max_batches, deadline, pause_ratio, progress, progress_every, stop):
        self.size = size
        self.max_batches, self.deadline, self.pause_ratio = max_batches, deadline, pause_ratio
        self.progress, self.progress_every, self.stop = progress, progress_every, stop
        self.target = settings.JOBS_RETENTION_BATCH_SECONDS
        self.report = RetentionReport()
        self.started = self.last_line = time.monotonic()
        self.batches = 0
        self.stopped_by = ""
        self.limited = False
        self.phase, self.done, self.total = "", 0, 0

    def go_on(self) -> bool:
        """Whether another batch may start (records why not)."""
        if not self.stopped_by:
            if self.stop.is_set():
                self.stopped_by = "signal"
            elif self.deadline is not None and time.monotonic() >= self.deadline:
                self.stopped_by = "budget"
        if self.max_batches is not None and self.batches >= self.max_batches:
            # A limit per phase: redaction still gets its batches.
            self.limited = True
            return False
        return not self.stopped_by

    def begin(self, phase: str, total: int) -> None:
        self.phase, self.done, self.total = phase, 0, total
        self.phase_started = time.monotonic()
        self.batches = 0

    def timed(self, work, ids, *args) -> None:
        began = time.monotonic()
        work(ids, *args)
        took = time.monotonic() - began
        self.batches += 1
        self.done += len(ids)
        # Aim each batch at the target duration: short transactions whatever
        # the rows cost, and no more round trips than that needs.
        if took < self.target / 2:
            self.size = min(self.MAX_SIZE, self.size * 2)
        elif took > self.target * 2:
            self.size = max(min(self.size, self.MIN_SIZE), self.size // 2)
        # The first batch's line at once: the operator sees the rate early.
        self._line(force=self.batches == 1)
        if self.pause_ratio:
            # Interrupted by the stop signal; the budget also counts pauses.
            self.stop.wait(took * self.pause_ratio)

    def _line(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.progress or (not force and now - self.last_line < self.progress_every):
            return
        self.last_line = now
        elapsed = now - self.phase_started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = max(0, self.total - self.done)
        eta = f"{left / rate:.0f} s" if rate else "unknown"
        self.progress(f"retention: {self.phase} {self.done} of {self.total} job(s) in {elapsed:.0f} s "
                      f"({rate:.0f} jobs/s, batch {self.size}); about {left} left, {eta} to go; "
                      f"{self.report.summary()}")


def rows_after(rows: QuerySet, key: tuple[datetime, int]) -> QuerySet:
    """The finished rows after `key` (finished_at, id) in keyset order: a
    range of the partial index from `finished_at` on, the ties at that
    instant (a batch's finish gives its jobs one) past the id. Written as
    "later, or as late with a greater id" the condition is no range at all:
    each page would read the index from its start and filter out every row
    before the key."""
    finished_at, job_id = key
    return rows.filter(Q(finished_at__gte=finished_at) & (Q(finished_at__gt=finished_at) | Q(id__gt=job_id)))


class _Pages:
    """Keyset pages of job ids in (finished_at, id) order — a range of the
    partial indexes `job_finished_redacted` / `job_finished_unredacted` each
    (`rows_after`) — so kept rows at the front never stall the sweep and no
    page rescans the ones before it. Several sets of rows (each one index's)
    are walked one after the other, as one phase. Pages are as large as the
    run's current batch size and stop when the run says so; `exhausted`
    tells, once iterated, whether the rows ran out."""

    def __init__(self, run: _Run, phase: str, *row_sets):
        self.run, self.phase, self.row_sets = run, phase, row_sets
        self.exhausted = False

    def __iter__(self):
        # The total only feeds the progress lines' estimate.
        self.run.begin(self.phase, sum(rows.count() for rows in self.row_sets) if self.run.progress else 0)
        for rows in self.row_sets:
            if not (yield from self._walk(rows)):
                break
        else:
            self.exhausted = True
        self.run._line(force=True)

    def _walk(self, rows):
        """Pages of one set; True once its rows ran out."""
        after = None
        while self.run.go_on():
            page = rows if after is None else rows_after(rows, after)
            size = self.run.size
            keys = list(page.order_by("finished_at", "id").values_list("finished_at", "id")[:size])
            if keys:
                yield [job_id for _, job_id in keys]
            if len(keys) < size:
                return True
            after = keys[-1]
        return False


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
        # The search text copies payload fields (recipient, subject): it is
        # body too, and a redacted job must not be found by them.
        search_texts_redact(ids)
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
    deleted["jobs.JobEvent"] += history_delete(ids)
    # Their search rows (jobs.search): no constraint ties them to the job.
    deleted["jobs.JobSearch"] += JobSearch.objects.filter(job_id__in=ids).delete()[0]
    # The ORM delete honours every other foreign key to Job (PROTECT raises).
    # Only the ids: the collector needs instances, not their columns.
    _, by_model = Job.objects.filter(id__in=ids, state__in=FINISHED).only("id").delete()
    deleted["jobs.Job"] += by_model.get("jobs.Job", 0)
    return deleted
