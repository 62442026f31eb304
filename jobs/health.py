"""Queue health: selectors for operators and monitoring (DESIGN §7).

Health is what is waiting and for how long — the age of the oldest
unpublished outbox event and the attempts spent on it, quarantined events,
overdue timers, unmatched inbound events — not whether some process is alive.
Every query here is served by a partial index on the rows it counts.
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.db.models import Count, Min
from django.db.models.functions import Coalesce

from .clock import Clock
from .models import InboundEvent, Job, OutboxEvent, Timer
from .selectors import LIVE, Literal, eligible_ready, expired_leases
from .states import State

__all__ = ["OutboxHealth", "TimerHealth", "InboundHealth", "JobHealth", "QueueHealth", "register_health_figure",
           "outbox_health", "timer_health", "inbound_health", "job_state_counts", "job_health", "queue_health"]

# Figures other apps add (e.g. external calls in doubt) without the
# engine importing them: name → function(tenants or None) → int.
_figures: dict[str, Callable[[list[str] | None], int]] = {}


def register_health_figure(name: str, count: Callable[[list[str] | None], int]) -> None:
    """Add a count (`count(tenants)`, tenants None = all) to `queue_health`."""
    _figures[name] = count


def _in(queryset, tenants: list[str] | None, tenant_field: str = "tenant"):
    return queryset if tenants is None else queryset.filter(**{f"{tenant_field}__in": tenants})


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
class JobHealth:
    by_tenant: dict[str, dict[str, int]]  # tenant → state → jobs
    oldest_ready_age_seconds: float | None  # how long the longest-waiting eligible job has waited
    expired_leases: int  # LEASED past lease_until: a worker died and recovery has not run yet
    waiting_review: int
    needs_attention: int


@dataclass(frozen=True)
class QueueHealth:
    jobs: dict[str, int]
    outbox: OutboxHealth
    timers: TimerHealth
    inbound: InboundHealth
    job_health: JobHealth | None = None
    figures: dict[str, int] = field(default_factory=dict)  # registered by other apps

    def problems(self, *, max_outbox_age: float = 300.0) -> list[str]:
        """What needs a person or a running worker, in words (empty: healthy).
        Items waiting for review or attention count: they are work for people."""
        problems = []
        age = self.outbox.oldest_pending_age_seconds
        if age is not None and age > max_outbox_age:
            problems.append(f"oldest unpublished outbox event is {age:.0f}s old")
        if self.outbox.quarantined:
            problems.append(f"{self.outbox.quarantined} outbox event(s) quarantined")
        if self.inbound.unmatched:
            problems.append(f"{self.inbound.unmatched} inbound event(s) unmatched")
        if self.timers.overdue:
            problems.append(f"{self.timers.overdue} timer(s) overdue")
        j = self.job_health
        if j is not None:
            if j.expired_leases:
                problems.append(f"{j.expired_leases} expired lease(s) not yet recovered")
            if j.waiting_review:
                problems.append(f"{j.waiting_review} job(s) waiting for review")
            if j.needs_attention:
                problems.append(f"{j.needs_attention} job(s) need attention")
        for name, n in self.figures.items():
            if n:
                problems.append(f"{n} {name.replace('_', ' ')}")
        return problems

    def as_dict(self) -> dict:
        return asdict(self)


def _age(at: datetime, since: datetime | None) -> float | None:
    # The clocks of the app host and the database may differ slightly.
    return None if since is None else max(0.0, (at - since).total_seconds())


def outbox_health(*, now: float | datetime | None = None, tenants: list[str] | None = None) -> OutboxHealth:
    """The oldest PENDING event (age, attempts, last error) and counts of
    pending and quarantined events (of `tenants`; None: all)."""
    at = Clock.of(now).value()
    pending = _in(OutboxEvent.objects.filter(state=OutboxEvent.Status.PENDING), tenants)
    oldest = pending.order_by("created_at", "sequence").first()
    return OutboxHealth(
        pending=pending.count(),
        oldest_pending_id=str(oldest.pk) if oldest else None,
        oldest_pending_age_seconds=_age(at, oldest.created_at if oldest else None),
        oldest_pending_attempts=oldest.attempts if oldest else 0,
        oldest_pending_error=oldest.last_error if oldest else "",
        quarantined=_in(OutboxEvent.objects.filter(state=OutboxEvent.Status.QUARANTINED), tenants).count(),
    )


def timer_health(*, now: float | datetime | None = None, tenants: list[str] | None = None) -> TimerHealth:
    """Pending timers, and how many are due but not yet decided (a sweep
    that is not running, or jobs that stay awake past their timers)."""
    at = Clock.of(now).value()
    pending = _in(Timer.objects.filter(state=Timer.Status.PENDING), tenants)
    overdue = pending.filter(scheduled_for__lte=at).aggregate(n=Count("id"), oldest=Min("scheduled_for"))
    return TimerHealth(
        pending=pending.count(),
        overdue=overdue["n"],
        oldest_overdue_seconds=_age(at, overdue["oldest"]),
    )


def inbound_health(*, now: float | datetime | None = None, tenants: list[str] | None = None) -> InboundHealth:
    at = Clock.of(now).value()
    unmatched = _in(InboundEvent.objects.filter(state=InboundEvent.Status.UNMATCHED), tenants).aggregate(
        n=Count("id"), oldest=Min("received_at")
    )
    return InboundHealth(unmatched=unmatched["n"], oldest_unmatched_age_seconds=_age(at, unmatched["oldest"]))


def job_state_counts(*, tenants: list[str] | None = None) -> dict[str, int]:
    """How many jobs are in each state, finished ones included (a scan of
    the job table: no index holds every state)."""
    counts = dict(_in(Job.objects, tenants).values_list("state").annotate(n=Count("id")).order_by())
    return {str(state): counts.get(state, 0) for state in State}


def job_health(*, now: float | datetime | None = None, tenants: list[str] | None = None) -> JobHealth:
    """Jobs by state per tenant (a scan of the job table, finished rows included),
    the age of the oldest eligible READY job (the claim index), expired
    leases (`job_leased_expiry`), and the people's queues."""
    at = Clock.of(now).value()
    jobs = _in(Job.objects, tenants)
    by_tenant: dict[str, dict[str, int]] = {}
    for tenant, state, n in jobs.values_list("tenant", "state").annotate(n=Count("id")).order_by("tenant"):
        by_tenant.setdefault(tenant, {str(s): 0 for s in State})[state] = n
    ready = jobs.filter(state=State.READY).aggregate(oldest=Min("created_at"))["oldest"]
    totals = {str(s): sum(states[s] for states in by_tenant.values()) for s in State}
    return JobHealth(
        by_tenant=by_tenant,
        oldest_ready_age_seconds=_age(at, ready),
        expired_leases=expired_leases(at=at, jobs=jobs).count(),
        waiting_review=totals[State.WAITING_REVIEW],
        needs_attention=totals[State.NEEDS_ATTENTION],
    )


def queue_health(*, now: float | datetime | None = None, tenants: list[str] | None = None) -> QueueHealth:
    """Everything `manage.py queue_health` and the admin index show, for
    `tenants` (None: all) — one selector for both, so they never disagree."""
    jobs = job_health(now=now, tenants=tenants)
    return QueueHealth(
        jobs={s: sum(states[s] for states in jobs.by_tenant.values()) for s in map(str, State)},
        outbox=outbox_health(now=now, tenants=tenants),
        timers=timer_health(now=now, tenants=tenants),
        inbound=inbound_health(now=now, tenants=tenants),
        job_health=jobs,
        figures={name: count(tenants) for name, count in sorted(_figures.items())},
    )


# ---------------------------------------------------------------- for /metrics and /readyz

def live_job_counts() -> dict[tuple[str, str], int]:
    """Jobs per (state, tenant) for the states work is in — never DONE or
    CANCELLED, whose history grows without bound (served by
    `job_state_tenant`, `job_leased_expiry` and the claim indexes; the cost
    follows the backlog, not the history)."""
    counts = {}
    for state in LIVE:
        # One state at a time, written into the SQL: no index holds every
        # live state, and each state's own partial index answers its count.
        rows = Job.objects.filter(state=Literal(state)).values_list("tenant").annotate(n=Count("id"))
        counts.update(((state, tenant), n) for tenant, n in rows.order_by())
    return counts


def oldest_ready_age_seconds(*, now: float | datetime | None = None) -> float | None:
    """How long the longest-waiting eligible READY job has been eligible
    (since its `next_attempt_at`, or its creation): the queue's lag."""
    at = Clock.of(now).value()
    oldest = eligible_ready(at=at).aggregate(oldest=Min(Coalesce("next_attempt_at", "created_at")))["oldest"]
    return _age(at, oldest)


def leases_expired(*, now: float | datetime | None = None) -> int:
    """LEASED jobs whose lease has run out, not yet recovered (`job_leased_expiry`)."""
    return expired_leases(at=Clock.of(now).value()).count()
