"""Reads that several places need, each named once (the admin, health, the
audit, the Store, retention and the apps above call these; none re-derives
the rule). Each docstring names the index that serves it.

A rule the claim must state in SQL (`ELIGIBLE_SQL`) stands here beside its
ORM form, so the two are read — and changed — together.
"""

import re
from datetime import datetime

from django.db.models import CharField, Expression, Q, QuerySet

from .models import Job, JobEvent, Timer
from .states import TERMINAL, State

__all__ = ["FINISHED", "LIVE", "ELIGIBLE_SQL", "finished_jobs", "expired_leases", "lease_expired", "leases_held", "lease_holders",
           "eligible_ready", "is_eligible", "waits_due", "newest_events", "newest_event", "wake_detail", "job_by_key",
           "job_locked", "jobs_by_keys", "events_after", "last_decision", "DECISION_KINDS", "jobs_needing_attention",
           "timers_pending_for_subject", "timers_due", "Literal"]


class Literal(Expression):
    """A state name written into the SQL (`state = 'PENDING'`), never bound.

    A partial index serves a query only when the planner can see that the
    query implies the index's condition, and a bound parameter implies
    nothing: on SQLite never, and on PostgreSQL not in the generic plan of a
    prepared statement (psycopg prepares a query run five times). PostgreSQL
    takes that plan when it looks no dearer — as it does from statistics
    taken while a table was small or empty — and keeps it as the table
    grows: a sweep's timers, leases or events walked in full. States are
    names of this code, never input; anything else is refused."""

    output_field = CharField()

    def __init__(self, value):
        super().__init__()
        if not re.fullmatch(r"[A-Z][A-Z_]{0,39}", str(value)):
            raise ValueError(f"not a state name: {value!r}")
        self.value = str(value)

    def as_sql(self, compiler, connection):
        return f"'{self.value}'", []

# A finished job is in a terminal state (`states.TERMINAL`); every other state
# is live: work or a person still owes it something.
# (In the order of `State`, as the partial indexes name them.)
FINISHED = [state for state in State if state in TERMINAL]
LIVE = [state for state in State if state not in TERMINAL]


def _jobs(jobs: QuerySet | None) -> QuerySet:
    # Every selector narrows a queryset the caller may already have scoped
    # (to a user's tenants, say); by default all jobs.
    return Job.objects.all() if jobs is None else jobs


def finished_jobs(*, jobs: QuerySet | None = None) -> QuerySet:
    """DONE and CANCELLED jobs (retention walks them through the partial
    indexes `job_finished_redacted` / `job_finished_unredacted`)."""
    return _jobs(jobs).filter(state__in=FINISHED)


# ---------------------------------------------------------------- leases


def expired_leases(*, at: datetime, jobs: QuerySet | None = None) -> QuerySet:
    """LEASED jobs whose lease ran out by `at`: their worker stopped renewing
    and recovery has not taken them back yet (partial index `job_leased_expiry`)."""
    return _jobs(jobs).filter(state=Literal(State.LEASED), lease_until__lte=at)


def leases_held(*, by, jobs: QuerySet | None = None) -> QuerySet:
    """LEASED jobs whose holder is one of the worker ids `by`, whatever time
    their leases have left (partial index `job_leased_expiry`)."""
    return _jobs(jobs).filter(state=Literal(State.LEASED), worker_id__in=list(by))


def lease_holders(*, place: str, jobs: QuerySet | None = None) -> list[str]:
    """The worker ids holding leases whose id ends with `:place`: the
    workers of one host's boot (`jobs.holders`)."""
    held = _jobs(jobs).filter(state=Literal(State.LEASED), worker_id__endswith=f":{place}")
    return sorted(set(held.values_list("worker_id", flat=True)))


def lease_expired(job: Job, *, at: datetime) -> bool:
    """`expired_leases` for one loaded row."""
    return job.state == State.LEASED and job.lease_until is not None and job.lease_until <= at


# ---------------------------------------------------------------- eligible work

# A READY job is eligible once its `next_attempt_at` has passed; NULL means at
# once, whatever clock a claim passes (DESIGN §4). `{now}` is the claim's time.
# Served by the partial claim indexes on READY rows (migration 0002).
ELIGIBLE_SQL = "state = 'READY' AND COALESCE(next_attempt_at, '-infinity') <= {now}"


def eligible_ready(*, at: datetime, jobs: QuerySet | None = None) -> QuerySet:
    """READY jobs a claim may take at `at` (`ELIGIBLE_SQL`; the claim indexes)."""
    return _jobs(jobs).filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=at), state=Literal(State.READY))


def is_eligible(job: Job, *, at: datetime) -> bool:
    """`eligible_ready` for one loaded row."""
    return job.state == State.READY and (job.next_attempt_at is None or job.next_attempt_at <= at)


# ---------------------------------------------------------------- waits a timer ends

# SQLite uses a partial index only when the query itself states the index's
# condition, and a bound parameter never matches the index's literals: with
# `state IN (%s, %s)` it scans every waiting row. So the states are written
# into the SQL as `job_waiting_wake` names them (values of `State`, not input).
_WAITING_WAKE_SQL = (f"\"jobs_job\".\"state\" IN ('{State.WAITING_EXTERNAL.value}', "
                     f"'{State.WAITING_REVIEW.value}')")


def waits_due(*, at: datetime, jobs: QuerySet | None = None) -> QuerySet:
    """Waiting jobs whose `wake_at` has passed by `at`, soonest first (partial
    index `job_waiting_wake`, on SQLite too: an idle worker reads none of the
    jobs that wait without a wake-up time, however many)."""
    return (_jobs(jobs).filter(wake_at__isnull=False, wake_at__lte=at).extra(where=[_WAITING_WAKE_SQL])
            .order_by("wake_at"))


# ---------------------------------------------------------------- history


def newest_events(job_id: int, *, limit: int) -> list[JobEvent]:
    """The job's newest `limit` history rows, newest first (index
    `jobevent_job_id`: the job's rows, sorted). The first is the state a person saw
    on a page: decisions are conditional on its id."""
    return list(JobEvent.objects.filter(job_id=job_id).order_by("-id")[:limit])


def newest_event(job_id: int) -> JobEvent | None:
    """The job's newest history row (see `newest_events`), or None."""
    events = newest_events(job_id, limit=1)
    return events[0] if events else None


def wake_detail(job: Job) -> dict | None:
    """The detail of the resume that ended the job's last wait — a reply
    (`inbound_event` in it) or a timer (`timer`) — or None when the job has
    not woken from a wait (a first run; a reviewer's approval is not a wake-up).
    Index `jobevent_job_id`."""
    last = job.events.filter(kind__in=["wait", "resume"]).order_by("-id").first()
    if last is None or last.kind != "resume" or not job.events.filter(kind="wait", id__lt=last.id).exists():
        return None
    return last.detail or {}


def events_after(job_id: int, *, after: int = 0, limit: int = 100) -> list[JobEvent]:
    """The job's history rows newer than event id `after`, oldest first, at
    most `limit` (index `jobevent_job_id`). A job's events are written under
    its row lock, so their ids grow in commit order: a reader that remembers
    the last id it saw misses none."""
    return list(JobEvent.objects.filter(job_id=job_id, id__gt=after).order_by("id")[:limit])


# The reviewers' decisions on a job waiting for review (states.TRANSITIONS).
DECISION_KINDS = ("approve", "correct", "reject")


def last_decision(job_id: int) -> JobEvent | None:
    """The newest reviewer decision on the job (approve, correct or reject),
    or None (index `jobevent_job_id`: the job's rows, sorted)."""
    return JobEvent.objects.filter(job_id=job_id, kind__in=DECISION_KINDS).order_by("-id").first()


# ---------------------------------------------------------------- by business identity


def job_by_key(*, tenant: str, key: str) -> Job | None:
    """The job of a business key, or None (`Job.objects.by_key`)."""
    return Job.objects.by_key(tenant, key).first()


def job_locked(*, tenant: str, key: str) -> Job | None:
    """The job of a business key, its row locked until the caller's
    transaction ends (PostgreSQL `FOR UPDATE`), or None."""
    return Job.objects.select_for_update().by_key(tenant, key).first()


def jobs_by_keys(*, tenant: str, keys) -> dict[str, Job]:
    """The jobs of these business keys in one tenant, by key
    (`Job.objects.by_keys`); keys without a job are left out."""
    return {job.key: job for job in Job.objects.by_keys(tenant, keys)}


def jobs_needing_attention(*, tenant: str, jobs: QuerySet | None = None) -> QuerySet:
    """A tenant's NEEDS_ATTENTION jobs, longest-waiting first (`job_state_tenant`)."""
    return _jobs(jobs).filter(tenant=tenant, state=State.NEEDS_ATTENTION).order_by("updated_at")


def timers_due(*, at: datetime) -> QuerySet:
    """PENDING timers scheduled by `at`, earliest first (partial index
    `timer_pending_due`)."""
    return Timer.objects.filter(state=Literal(Timer.Status.PENDING), scheduled_for__lte=at).order_by("scheduled_for",
                                                                                                     "id")


def timers_pending_for_subject(*, tenant: str, subject_type: str, subject_id: str | int) -> QuerySet:
    """PENDING timers about one subject (partial index `timer_pending_subject`)."""
    return Timer.objects.filter(tenant=tenant, subject_type=subject_type, subject_id=str(subject_id),
                                state=Literal(Timer.Status.PENDING))
