"""Consistency audit (DESIGN §13): what no machine will fix by itself.

`consistency_audit` looks for conditions that mean a part of the system is
not doing its job, and files each one, once, as an item in the operators'
NEEDS_ATTENTION queue:

- `stale-lease`: a lease expired longer than `AUDIT_STALE_LEASE_SECONDS` ago
  (recovery runs in every worker every ttl/3, so no worker is recovering);
- `unknown-operation` (registered by the app recording external calls): a call
  UNKNOWN for longer than its provider's idempotency retention — a resend or
  lookup can no longer settle it with certainty;
- `quarantined-outbox`: an outbox event the relay gave up on;
- `overdue-timer`: a PENDING timer due more than `AUDIT_TIMER_OVERDUE_SECONDS`
  ago (no worker fires timers).

An item is a job of action `jobs.audit_finding` in the finding's tenant,
created directly in NEEDS_ATTENTION under the business key
`audit-<kind>-<ref>`: the payload and the creation history hold the evidence
(business keys, ages, errors), and the key makes a second audit of the same
condition file nothing. An operator resolves it, or cancels it; retrying it
re-checks the condition (DONE if it is gone, back to NEEDS_ATTENTION if not).
"""

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from . import interventions
from .actions import action
from .clock import Clock
from .errors import NeedsAttention
from .models import Job, OutboxEvent, Timer
from .selectors import expired_leases
from .states import State
from .store import Store

__all__ = ["Finding", "AuditReport", "audit_check", "consistency_audit", "ACTION"]

ACTION = "jobs.audit_finding"
ACTOR = "audit"


@dataclass(frozen=True)
class Finding:
    kind: str
    ref: str  # what the condition is about, unique within the kind
    tenant: str
    summary: str
    evidence: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"audit-{self.kind}-{self.ref}"[:200]


# A check: (at, limit) -> findings; `recheck(ref, at)` says whether a filed
# finding still holds (for an operator's retry).
@dataclass(frozen=True)
class AuditCheck:
    kind: str
    find: Callable[[datetime, int], Iterable[Finding]]
    still_holds: Callable[[str, datetime], bool]


_checks: dict[str, AuditCheck] = {}


def audit_check(kind: str, *, still_holds: Callable[[str, datetime], bool]):
    """Register a check of the audit (apps the engine does not import add theirs)."""

    def register(find):
        _checks[kind] = AuditCheck(kind, find, still_holds)
        return find

    return register


@dataclass
class AuditReport:
    filed: Counter = field(default_factory=Counter)  # new items, by kind
    already_filed: Counter = field(default_factory=Counter)  # found again, item exists
    items: list[str] = field(default_factory=list)  # tenant/key of the new items

    def summary(self) -> str:
        kinds = sorted(set(self.filed) | set(self.already_filed))
        parts = [f"{k}: {self.filed[k]} new, {self.already_filed[k]} already filed" for k in kinds]
        return "; ".join(parts) or "nothing found"


def consistency_audit(*, now: float | datetime | None = None, limit: int = 200) -> AuditReport:
    """Run every registered check (at most `limit` findings each) and file
    each finding once. Safe to run repeatedly and concurrently: the unique
    (tenant, key) decides. Returns what was filed and what was known."""
    at = Clock.of(now).value()
    report = AuditReport()
    for check in list(_checks.values()):
        for finding in check.find(at, limit):
            if finding_file(finding=finding, now=at):
                report.filed[finding.kind] += 1
                report.items.append(f"{finding.tenant}/{finding.key}")
            else:
                report.already_filed[finding.kind] += 1
    return report


@transaction.atomic
def finding_file(*, finding: Finding, now: datetime | None = None) -> bool:
    """File one finding as a NEEDS_ATTENTION item; False when it was filed
    before (whatever became of that item). Both rows of history — the
    creation and the escalation with the evidence — commit together, so no
    worker ever sees the item READY."""
    store = Store()
    if Job.objects.by_key(finding.tenant, finding.key).exists():
        return False
    payload = {"kind": finding.kind, "ref": finding.ref, "summary": finding.summary, "evidence": finding.evidence}
    job = store.enqueue(finding.tenant, finding.key, action=ACTION, payload=payload, actor=ACTOR,
                        subject_type=f"audit.{finding.kind}", subject_id=finding.ref[:100], now=now)
    if job.state != State.READY or job.action != ACTION:
        return False  # a concurrent audit filed it first
    interventions.job_escalate(tenant=finding.tenant, key=finding.key, reason=finding.summary, actor=ACTOR,
                   detail={"audit": finding.kind, "evidence": finding.evidence}, now=now)
    return True


@action(ACTION)
def audit_finding(ctx):
    """An operator retried an audit item: done if the condition is gone,
    back to the operator if it still holds."""
    kind, ref = ctx.payload.get("kind", ""), ctx.payload.get("ref", "")
    check = _checks.get(kind)
    if check is not None and check.still_holds(ref, Clock.of(None).value()):
        raise NeedsAttention(f"still found: {ctx.payload.get('summary', kind)}")
    return {"condition_gone": True}


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def _age(at: datetime, since: datetime) -> int:
    return max(0, int((at - since).total_seconds()))


# ---------------------------------------------------------------- the engine's checks


def _stale_since(at: datetime) -> datetime:
    return at - timedelta(seconds=settings.AUDIT_STALE_LEASE_SECONDS)


def _stale_lease_holds(ref: str, at: datetime) -> bool:
    job_id, _, epoch = ref.partition("-e")
    return expired_leases(at=_stale_since(at)).filter(pk=job_id, lease_epoch=epoch).exists()


@audit_check("stale-lease", still_holds=_stale_lease_holds)
def stale_leases(at: datetime, limit: int):
    rows = expired_leases(at=_stale_since(at)).order_by("lease_until")[:limit]
    for job in rows:
        yield Finding(
            "stale-lease", f"{job.pk}-e{job.lease_epoch}", job.tenant,
            f"lease of {job.tenant}/{job.key} expired {_age(at, job.lease_until)}s ago and nothing recovered it",
            {"job": f"{job.tenant}/{job.key}", "action": job.action, "worker_id": job.worker_id,
             "lease_epoch": job.lease_epoch, "lease_until": _iso(job.lease_until),
             "expired_for_seconds": _age(at, job.lease_until)},
        )


@audit_check("quarantined-outbox",
             still_holds=lambda ref, at: OutboxEvent.objects.filter(pk=ref, state=OutboxEvent.Status.QUARANTINED)
             .exists())
def quarantined_outbox(at: datetime, limit: int):
    # Served by the partial index outbox_quarantined.
    rows = OutboxEvent.objects.filter(state=OutboxEvent.Status.QUARANTINED).order_by("created_at")[:limit]
    for event in rows:
        yield Finding(
            "quarantined-outbox", str(event.pk), event.tenant,
            f"outbox event {event.event_type} of {event.aggregate_type}/{event.aggregate_id} "
            f"was quarantined after {event.attempts} attempts",
            {"event_id": str(event.pk), "event_type": event.event_type,
             "aggregate": f"{event.aggregate_type}/{event.aggregate_id}", "sequence": event.sequence,
             "attempts": event.attempts, "last_error": event.last_error[:1000],
             "created_at": _iso(event.created_at)},
        )


def _overdue_since(at: datetime) -> datetime:
    return at - timedelta(seconds=settings.AUDIT_TIMER_OVERDUE_SECONDS)


@audit_check("overdue-timer",
             still_holds=lambda ref, at: Timer.objects.filter(pk=ref, state=Timer.Status.PENDING,
                                                              scheduled_for__lt=_overdue_since(at)).exists())
def overdue_timers(at: datetime, limit: int):
    # Served by the partial index timer_pending_due.
    rows = (Timer.objects.filter(state=Timer.Status.PENDING, scheduled_for__lt=_overdue_since(at))
            .select_related("job").order_by("scheduled_for", "id")[:limit])
    for timer in rows:
        yield Finding(
            "overdue-timer", str(timer.pk), timer.tenant,
            f"timer '{timer.reason}' was due {_age(at, timer.scheduled_for)}s ago and has not fired",
            {"timer_id": timer.pk, "reason": timer.reason, "scheduled_for": _iso(timer.scheduled_for),
             "overdue_seconds": _age(at, timer.scheduled_for),
             "job": f"{timer.job.tenant}/{timer.job.key}" if timer.job else timer.job_key,
             "subject": f"{timer.subject_type}:{timer.subject_id}" if timer.subject_type else ""},
        )
