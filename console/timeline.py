"""A job's evidence timeline (selectors): its history events, operations and
their events, receipts, timers and inbound events interleaved, newest first,
with what other apps record about the job (`review.admin.register_timeline_source`).

Bounded at any size: a page is the newest `PAGE` job events before a cursor
(index `jobevent_job_id`) plus the other items whose time falls within the
page's span, each query limited. A job with 100,000 events opens as fast as
one with ten. The JSON export streams everything with iterators.

A reader who may not see the job's sensitive fields (a viewer,
`access.sees_sensitive`) reads the page and the export through
`reader_masker`: the fields masked wherever they appear.
"""

from dataclasses import dataclass, replace
from datetime import datetime

from django.core.serializers.json import DjangoJSONEncoder

from jobs import access
from jobs.models import InboundEvent, Job, JobEvent, Timer
from jobs.states import State
from operations.models import Operation, OperationEvent, Receipt
from review.admin import timeline_sources
from review.masking import CLEAR, Masker, job_masker

PAGE = 50
OTHER_LIMIT = 200  # other items per page span (a job has few; the cap bounds a pathological one)


def reader_masker(job: Job, *, scope: access.Scope, also=()) -> Masker:
    """How the holder of `scope` reads `job`: in clear (reviewers,
    operators, superusers) or with its action's sensitive fields masked
    (viewers). The values to hide come from the payload, the job's
    operation requests and its corrections' before/after (each a few rows,
    bounded), and `also` (a preview's fields, say)."""
    if access.sees_sensitive(job.tenant, scope=scope):
        return CLEAR
    requests = Operation.objects.filter(job=job).values_list("request", flat=True)[:OTHER_LIMIT]
    return job_masker(job, sees_sensitive=False, also=[*requests, *also])


@dataclass(frozen=True)
class Entry:
    at: datetime
    kind: str  # "event", "decision", "operation", "receipt", "timer", "inbound"
    title: str
    detail: str
    actor: str = ""
    link: str = ""  # admin URL name + pk, resolved in the view
    pk: object = None
    order: int = 0


DECISION_KINDS = frozenset({"approve", "correct", "reject", "retry", "resolve", "cancel", "escalate"})


def _event_entry(e: JobEvent, masker: Masker) -> Entry:
    decision = e.kind in DECISION_KINDS and bool(e.actor) and not e.worker_id
    detail = e.reason
    correction = (e.detail or {}).get("correction") if isinstance(e.detail, dict) else None
    if correction:
        detail += " — corrected: " + "; ".join(
            f"{name}: {masker.field(name, c['before'])!r} → {masker.field(name, c['after'])!r}"
            for name, c in correction.items())
    # A bulk decision's event names its batch (review.bulk): the entry links to it.
    batch = (e.detail or {}).get("batch") if isinstance(e.detail, dict) else None
    if batch:
        detail += f" — bulk decision, batch {batch}"
    return Entry(at=e.created_at, kind="decision" if decision else "event",
                 title=f"{e.kind}: {e.from_state or '—'} → {e.to_state or '—'} (epoch {e.epoch})",
                 detail=detail, actor=e.by, order=e.id,
                 link="console:batch" if batch else "", pk=batch)


def _claim_entry(*, at: datetime, epoch: int, worker: str, detail: str, order: int) -> Entry:
    """An attempt's claim, shown at the time it was taken: a claim writes no
    history row of its own (jobs.models.JobEvent); it is read from the row
    that ended the attempt, or from the job row while the attempt runs."""
    return Entry(at=at, kind="event", title=f"claim: → LEASED (epoch {epoch})", detail=detail, actor=worker,
                 order=order)


def _attempt_entries(job: Job, page: list[JobEvent], *, newest_page: bool) -> list[Entry]:
    """The claims of the attempts this page's rows ended, and on the newest
    page the claim of the attempt running now."""
    entries = [_claim_entry(at=e.claimed_at, epoch=e.epoch, worker=e.worker_id, order=e.id,
                            detail=f"attempt {e.epoch} by {e.worker_id}; ended by {e.kind} at {e.created_at:%Y-%m-%d %H:%M:%S}")
               for e in page if e.claimed_at is not None]
    if newest_page and job.state == State.LEASED and job.claimed_at is not None:
        until = f"{job.lease_until:%Y-%m-%d %H:%M:%S}" if job.lease_until else "—"
        entries.append(_claim_entry(at=job.claimed_at, epoch=job.lease_epoch, worker=job.worker_id, order=0,
                                    detail=f"attempt {job.lease_epoch} by {job.worker_id}; running, lease until {until}"))
    return entries


def timeline_page(job: Job, *, before: int | None = None, masker: Masker = CLEAR) -> tuple[list[Entry], int | None]:
    """One page of `job`'s timeline: entries newest first, and the cursor of
    the next (older) page, or None on the last page; read through `masker`."""
    events = JobEvent.objects.filter(job=job)
    if before is not None:
        events = events.filter(id__lt=before)
    page = list(events.order_by("-id")[: PAGE + 1])
    more = len(page) > PAGE
    page = page[:PAGE]
    # The span this page covers: from its oldest event (or the beginning of
    # time, on the last page) to the newer page's oldest event (or now).
    upper = JobEvent.objects.filter(job=job, pk=before).values_list("created_at", flat=True).first() if before else None
    lower = page[-1].created_at if (page and more) else None

    def span(queryset, field):
        if lower is not None:
            queryset = queryset.filter(**{f"{field}__gte": lower})
        if upper is not None:
            queryset = queryset.filter(**{f"{field}__lt": upper})
        return queryset.order_by(f"-{field}")[:OTHER_LIMIT]

    entries = [_event_entry(e, masker) for e in page] + _attempt_entries(job, page, newest_page=before is None)
    for op in span(Operation.objects.filter(job=job), "created_at"):
        entries.append(Entry(at=op.created_at, kind="operation", title=f"operation {op.kind} via {op.provider}",
                             detail=f"{op.state} — step {op.step}, {op.attempts} attempt(s)",
                             link="admin:operations_operation_change", pk=op.pk))
    for oe in span(OperationEvent.objects.filter(operation__job=job).select_related("operation"), "created_at"):
        entries.append(Entry(at=oe.created_at, kind="operation",
                             title=f"operation {oe.kind}: {oe.from_state or '—'} → {oe.to_state or '—'}",
                             detail=oe.reason, actor=oe.actor, link="admin:operations_operation_change",
                             pk=oe.operation_id, order=oe.id))
    for r in span(Receipt.objects.filter(operation__job=job), "created_at"):
        entries.append(Entry(at=r.created_at, kind="receipt", title=f"receipt {r.provider_reference} ({r.how})",
                             detail=r.reason, actor=r.recorded_by, link="admin:operations_receipt_change", pk=r.pk))
    for t in span(Timer.objects.filter(job=job), "created_at"):
        entries.append(Entry(at=t.created_at, kind="timer", title=f"timer for {t.scheduled_for:%Y-%m-%d %H:%M}",
                             detail=f"{t.reason} [{t.state}]", link="admin:jobs_timer_change", pk=t.pk))
    for i in span(InboundEvent.objects.filter(job=job), "received_at"):
        entries.append(Entry(at=i.received_at, kind="inbound", title=f"inbound {i.event_type} from {i.provider}",
                             detail=f"{i.state} {i.note}".strip(), link="admin:jobs_inboundevent_change", pk=i.pk))
    for source in timeline_sources():
        # Other apps' records about this job (review.admin.register_timeline_source).
        for item in source(job, since=lower, until=upper, limit=OTHER_LIMIT):
            entries.append(Entry(at=item.at, kind=item.kind, title=item.title, detail=item.detail,
                                 actor=item.actor, link=item.link, pk=item.pk))
    if masker.active:
        entries = [replace(e, title=masker.text(e.title), detail=masker.text(e.detail)) for e in entries]
    entries.sort(key=lambda e: (e.at, e.order), reverse=True)
    return entries, (page[-1].id if more else None)


def timeline_json(job: Job, *, masker: Masker = CLEAR):
    """The whole history of `job` as one JSON document, yielded in chunks
    (events through an iterator: memory stays flat however long it is),
    every row read through `masker`."""
    encode = DjangoJSONEncoder().encode

    def dump(row):
        return encode(masker.data(row))

    def rows(queryset, fields):
        first = True
        for row in queryset.values(*fields).iterator(chunk_size=2000):
            yield ("" if first else ",\n") + dump(row)
            first = False

    head = {f: getattr(job, f) for f in ("id", "tenant", "key", "action", "state", "payload", "attempts",
                                         "lease_epoch", "worker_id", "claimed_at", "wait_reason", "last_error",
                                         "created_at", "updated_at")}
    yield '{"job": ' + dump(head) + ',\n"events": [\n'
    yield from rows(JobEvent.objects.filter(job=job).order_by("id"),
                    ["id", "created_at", "kind", "from_state", "to_state", "epoch", "worker_id", "claimed_at", "actor",
                     "reason", "detail"])
    yield '],\n"operations": [\n'
    yield from rows(Operation.objects.filter(job=job).order_by("created_at"),
                    ["id", "step", "provider", "kind", "state", "request", "request_digest", "attempts", "last_error",
                     "created_at", "updated_at"])
    yield '],\n"operation_events": [\n'
    yield from rows(OperationEvent.objects.filter(operation__job=job).order_by("id"),
                    ["id", "operation_id", "created_at", "kind", "from_state", "to_state", "actor", "epoch", "reason",
                     "detail"])
    yield '],\n"receipts": [\n'
    yield from rows(Receipt.objects.filter(operation__job=job).order_by("id"),
                    ["operation_id", "provider_reference", "accepted_at", "how", "evidence", "recorded_by", "reason",
                     "created_at"])
    yield '],\n"timers": [\n'
    yield from rows(Timer.objects.filter(job=job).order_by("id"),
                    ["id", "scheduled_for", "reason", "state", "subject_version", "fired_at", "decided_at",
                     "created_at"])
    yield '],\n"inbound_events": [\n'
    yield from rows(InboundEvent.objects.filter(job=job).order_by("id"),
                    ["id", "provider", "event_id", "event_type", "state", "body", "note", "received_at"])
    yield "]}\n"
