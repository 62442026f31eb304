"""Queue health: selectors for operators and monitoring (DESIGN §7).

Health is what is waiting and for how long — the age of the oldest
unpublished outbox event and the attempts spent on it, quarantined events,
overdue timers, unmatched inbound events — not whether some process is alive.
Every query here is served by a partial index on the rows it counts.
"""

from dataclasses import asdict, dataclass
from datetime import datetime

from django.db.models import Count, Min

from .clock import Clock
from .models import InboundEvent, Job, OutboxEvent, Timer
from .states import State

__all__ = ["OutboxHealth", "TimerHealth", "InboundHealth", "QueueHealth",
           "outbox_health", "timer_health", "inbound_health", "job_state_counts", "queue_health"]


@dataclass(frozen=True)
class OutboxHealth:
    pending: int
    oldest_pending_id: str | None
    oldest_pending_age_seconds: float | None  # how long the oldest unpublished event has waited
    oldest_pending_attempts: int  # delivery attempts spent on it so far
    oldest_pending_error: str
    quarantined: int


@dataclass(frozen=True)
class TimerHealth:
    pending: int
    overdue: int  # due but not yet decided
    oldest_overdue_seconds: float | None


@dataclass(frozen=True)
class InboundHealth:
    unmatched: int  # kept for an operator
    oldest_unmatched_age_seconds: float | None


@dataclass(frozen=True)
class QueueHealth:
    jobs: dict[str, int]
    outbox: OutboxHealth
    timers: TimerHealth
    inbound: InboundHealth

    def as_dict(self) -> dict:
        return asdict(self)


def _age(at: datetime, since: datetime | None) -> float | None:
    # The clocks of the app host and the database may differ slightly.
    return None if since is None else max(0.0, (at - since).total_seconds())


def outbox_health(*, now: float | datetime | None = None) -> OutboxHealth:
    """The oldest PENDING event (age, attempts, last error) and counts of
    pending and quarantined events."""
    at = Clock.of(now).value()
    pending = OutboxEvent.objects.filter(state=OutboxEvent.Status.PENDING)
    oldest = pending.order_by("created_at", "sequence").first()
    return OutboxHealth(
        pending=pending.count(),
        oldest_pending_id=str(oldest.pk) if oldest else None,
        oldest_pending_age_seconds=_age(at, oldest.created_at if oldest else None),
        oldest_pending_attempts=oldest.attempts if oldest else 0,
        oldest_pending_error=oldest.last_error if oldest else "",
        quarantined=OutboxEvent.objects.filter(state=OutboxEvent.Status.QUARANTINED).count(),
    )


def timer_health(*, now: float | datetime | None = None) -> TimerHealth:
    """Pending timers, and how many are due but not yet decided (a sweep
    that is not running, or jobs that stay awake past their timers)."""
    at = Clock.of(now).value()
    pending = Timer.objects.filter(state=Timer.Status.PENDING)
    overdue = pending.filter(scheduled_for__lte=at).aggregate(n=Count("id"), oldest=Min("scheduled_for"))
    return TimerHealth(
        pending=pending.count(),
        overdue=overdue["n"],
        oldest_overdue_seconds=_age(at, overdue["oldest"]),
    )


def inbound_health(*, now: float | datetime | None = None) -> InboundHealth:
    at = Clock.of(now).value()
    unmatched = InboundEvent.objects.filter(state=InboundEvent.Status.UNMATCHED).aggregate(
        n=Count("id"), oldest=Min("received_at")
    )
    return InboundHealth(unmatched=unmatched["n"], oldest_unmatched_age_seconds=_age(at, unmatched["oldest"]))


def job_state_counts() -> dict[str, int]:
    """How many jobs are in each state (served by `job_state_tenant`)."""
    counts = dict(Job.objects.values_list("state").annotate(n=Count("id")).order_by())
    return {str(state): counts.get(state, 0) for state in State}


def queue_health(*, now: float | datetime | None = None) -> QueueHealth:
    """Everything `manage.py queue_health` shows."""
    return QueueHealth(
        jobs=job_state_counts(),
        outbox=outbox_health(now=now),
        timers=timer_health(now=now),
        inbound=inbound_health(now=now),
    )


# ---------------------------------------------------------------- for /metrics and /readyz

LIVE_STATES = [State.READY, State.LEASED, State.WAITING_EXTERNAL, State.WAITING_REVIEW, State.NEEDS_ATTENTION]


def live_job_counts() -> dict[tuple[str, str], int]:
    """Jobs per (state, tenant) for the states work is in — never DONE or
    CANCELLED, whose history grows without bound (served by
    `job_state_tenant`; the cost follows the backlog, not the history)."""
    rows = Job.objects.filter(state__in=LIVE_STATES).values_list("state", "tenant").annotate(n=Count("id"))
    return {(state, tenant): n for state, tenant, n in rows.order_by()}


def oldest_ready_age_seconds(*, now: float | datetime | None = None) -> float | None:
    """How long the longest-waiting eligible READY job has been eligible
    (since its `next_attempt_at`, or its creation): the queue's lag."""
    from django.db.models import Q
    from django.db.models.functions import Coalesce

    at = Clock.of(now).value()
    eligible = Job.objects.filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=at), state=State.READY)
    oldest = eligible.aggregate(oldest=Min(Coalesce("next_attempt_at", "created_at")))["oldest"]
    return _age(at, oldest)


def leases_expired(*, now: float | datetime | None = None) -> int:
    """LEASED jobs whose lease has run out, not yet recovered (`job_leased_expiry`)."""
    at = Clock.of(now).value()
    return Job.objects.filter(state=State.LEASED, lease_until__lte=at).count()
