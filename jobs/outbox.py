"""The transactional outbox and its relay (DESIGN §7).

A business change announces what happened by calling `outbox_emit` inside the
transaction that makes the change, so the change and its event commit — or
roll back — together. The relay then delivers each committed event to the
consumers registered for its type, repeatedly until they all accept it:

    @outbox_consumer("invoice.issued")
    def plan_reminder(event):                 # runs in its own transaction
        Store().enqueue(event.tenant, f"invoice-reminder-{event.aggregate_id}", ...)

Delivery is at least once. The relay counts an attempt and commits its claim
*before* it calls the consumers, and marks the event PUBLISHED only after they
returned; a relay killed in between leaves the event PENDING and it is
delivered again once the claim expires. Consumers therefore deduplicate by
business identity — the usual consumer enqueues a job under a unique key
(`outbox_consumer_enqueue`), so a redelivered event still yields one job.

Order: events of one aggregate (tenant, aggregate_type, aggregate_id) are
numbered by `sequence` as they are emitted, and the relay only ever takes the
*head* of an aggregate — the PENDING event with no earlier PENDING event of the
same aggregate. So a later event is never published before an earlier one,
however many relays run (their claims use `FOR UPDATE SKIP LOCKED`). Events of
different aggregates flow independently and roughly in emission order.

Poison: a failing consumer is retried with exponential backoff and full
jitter; after `max_attempts` attempts (counting relays that died while
publishing it) the event is QUARANTINED for an operator. That takes it out of
its aggregate's stream, so the events behind it keep flowing; an operator who
requeues it (`outbox_event_requeue`) accepts that it is published after them.
An event type with no registered consumer counts as a failure (a typo must not
make events vanish) and ends up quarantined the same way.

Where it runs: `run_worker` calls `outbox_relay` as a periodic task (bounded by
its `limit`), woken by the NOTIFY that `outbox_emit` sends on commit
(PostgreSQL); `manage.py relay_outbox [--once]` runs it alone.
"""

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max
from django.utils import timezone

from . import notify
from .clock import Clock
from .errors import JobError
from .models import OutboxEvent
from .retry import RetryPolicy
from .store import Store
from .validation import describe_exception
from .periodic import periodic_task

__all__ = [
    "OutboxError",
    "OutsideTransaction",
    "outbox_emit",
    "outbox_consumer",
    "outbox_consumer_enqueue",
    "outbox_relay",
    "outbox_event_requeue",
    "relay_policy",
    "CLAIM_TTL",
]

log = logging.getLogger("jobs.outbox")

Status = OutboxEvent.Status
Consumer = Callable[[OutboxEvent], None]

# Seconds a relay owns a claimed event; past it the event is delivered again.
# Far longer than a consumer should take, so a live relay is not overtaken.
CLAIM_TTL = 60.0
# How often `outbox_emit` re-reads the aggregate's last sequence after losing
# the race for the next number to a concurrent emitter of the same aggregate.
_SEQUENCE_RETRIES = 5


class OutboxError(JobError):
    """The outbox could not accept an event."""


class OutsideTransaction(OutboxError):
    """`outbox_emit` was called outside `transaction.atomic()`: the event
    would not commit together with the business change it announces."""


def relay_policy() -> RetryPolicy:
    """Backoff between delivery attempts and the attempt bound before
    quarantine (setting `OUTBOX_MAX_ATTEMPTS`, default 10)."""
    return RetryPolicy(
        initial_interval=1.0,
        multiplier=2.0,
        max_interval=300.0,
        max_attempts=getattr(settings, "OUTBOX_MAX_ATTEMPTS", 10),
    )


# ---------------------------------------------------------------- emitting


def outbox_emit(
    *,
    tenant: str,
    aggregate_type: str,
    aggregate_id: str | int,
    event_type: str,
    payload: dict | None = None,
) -> OutboxEvent:
    """Record that `event_type` happened to an aggregate, as part of the
    caller's transaction.

    Guarantees: the event commits if and only if the caller's transaction
    commits; it gets the next `sequence` of its aggregate, so the relay
    publishes it after every event of that aggregate emitted before it; the
    relay is woken when the transaction commits (NOTIFY on PostgreSQL).

    Raises `OutsideTransaction` when called outside `transaction.atomic()`,
    and `OutboxError` if the aggregate's next sequence number cannot be taken
    (emitters of one aggregate should serialise on the aggregate's own row).
    """
    if not transaction.get_connection().in_atomic_block:
        raise OutsideTransaction(
            f"outbox_emit({event_type!r}) must run inside transaction.atomic() together with the change it "
            "announces; in autocommit mode the event and the change could commit separately"
        )
    aggregate_id = str(aggregate_id)
    aggregate = OutboxEvent.objects.filter(tenant=tenant, aggregate_type=aggregate_type, aggregate_id=aggregate_id)
    for _ in range(_SEQUENCE_RETRIES):
        last = aggregate.aggregate(last=Max("sequence"))["last"] or 0
        try:
            # The unique (aggregate, sequence) constraint decides a race with a
            # concurrent emitter: the loser's insert waits for the winner to
            # commit, fails, and re-reads the last sequence (READ COMMITTED).
            with transaction.atomic():
                event = OutboxEvent.objects.create(
                    tenant=tenant,
                    aggregate_type=aggregate_type,
                    aggregate_id=aggregate_id,
                    sequence=last + 1,
                    event_type=event_type,
                    payload=payload or {},
                    created_at=timezone.now(),
                )
        except IntegrityError:
            continue
        # Delivered on commit, dropped on rollback: wakes the workers' relay.
        notify.job_ready()
        return event
    raise OutboxError(
        f"could not number an event of {aggregate_type}/{aggregate_id}: concurrent emitters kept taking the "
        "next sequence; lock the aggregate's row before changing it"
    )


# ---------------------------------------------------------------- consumers


_consumers: dict[str, list[Consumer]] = {}


def outbox_consumer(event_type: str):
    """Register the decorated function as a consumer of `event_type`.

    A consumer receives the `OutboxEvent` (its `id` is the dedupe id) and runs
    in its own transaction. It must be idempotent: an event may be delivered
    more than once, and an event with several consumers is delivered again to
    all of them when one fails. Raising means "not accepted, try again later".
    """

    def register(consumer: Consumer) -> Consumer:
        registered = _consumers.setdefault(event_type, [])
        # Re-importing a module re-registers the same function: replace it.
        name = getattr(consumer, "__qualname__", repr(consumer)), getattr(consumer, "__module__", "")
        registered[:] = [
            c for c in registered if (getattr(c, "__qualname__", repr(c)), getattr(c, "__module__", "")) != name
        ]
        registered.append(consumer)
        return consumer

    return register


def outbox_consumer_enqueue(
    event_type: str,
    *,
    action: str,
    key: Callable[[OutboxEvent], str] | None = None,
    priority: int = 0,
) -> Consumer:
    """Register the usual consumer: enqueue one job per event.

    The job's key is `key(event)` — a business identity such as
    `invoice-reminder-plan-<id>` — or `<event_type>:<event id>`; since enqueue
    is idempotent per (tenant, key), a redelivered event yields one job. The
    job's payload carries the event (`outbox_event`, `event_type`, `data`).
    """

    def enqueue(event: OutboxEvent) -> None:
        Store().enqueue(
            event.tenant,
            key(event) if key else f"{event.event_type}:{event.id}",
            action=action,
            priority=priority,
            payload={"outbox_event": str(event.id), "event_type": event.event_type, "data": event.payload},
            subject_type=event.aggregate_type,
            subject_id=event.aggregate_id,
            actor=f"outbox:{event.id}",
        )

    enqueue.__qualname__ = f"enqueue[{event_type}->{action}]"
    return outbox_consumer(event_type)(enqueue)


def registered_consumers(event_type: str) -> list[Consumer]:
    return list(_consumers.get(event_type, ()))


# ---------------------------------------------------------------- the relay


@periodic_task("outbox.relay", every=1.0)
def outbox_relay(
    *,
    limit: int = 100,
    worker_id: str = "relay",
    now: float | datetime | None = None,
    policy: RetryPolicy | None = None,
    claim_ttl: float = CLAIM_TTL,
) -> int:
    """Deliver at most `limit` pending events; return how many were handled
    (published, failed for a later retry, or quarantined).

    Works in rounds: each claims a batch of aggregate heads in one short
    transaction (SKIP LOCKED, so concurrent relays take disjoint batches and
    never wait for each other), commits the claim, then delivers each event.
    The next round can take the events that were behind the ones just
    published. Safe to run in any number of processes at once.
    """
    policy = policy or relay_policy()
    handled = 0
    while handled < limit:
        batch = _claim(limit=limit - handled, now=now, policy=policy, claim_ttl=claim_ttl, worker_id=worker_id)
        if not batch:
            break
        handled += len(batch)
        for event in batch:
            if event.state == Status.PENDING:
                _deliver(event, now=now, policy=policy, worker_id=worker_id)
    return handled


# The due aggregate heads, oldest first: the scan walks
# `outbox_pending_order`; each candidate is a head if it is the first
# PENDING event of its aggregate, asked of `outbox_pending_aggregate` in its
# order. An earlier event claimed by another relay is still PENDING in our
# snapshot, so its successor is never taken. Both are written so that no
# statistics can turn them into a read of every pending event: the LIMIT is
# a subquery, a size the planner cannot read (it then plans for a tenth of
# the rows it expects and walks the index, as the job claim does,
# jobs.claim), and the head test a subquery in the aggregate index's order
# (as NOT EXISTS it could become a hash anti-join, or a scan of the other
# index per candidate). Under statistics taken while nearly everything was
# published, a consumer's outage would otherwise make each batch hash and
# sort every pending event.
_HEADS = f"""
    SELECT * FROM jobs_outboxevent AS e
    WHERE e.state = '{Status.PENDING}' AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= %s)
      AND e.sequence = (
          SELECT p.sequence FROM jobs_outboxevent AS p
          WHERE p.state = '{Status.PENDING}' AND p.tenant = e.tenant AND p.aggregate_type = e.aggregate_type
            AND p.aggregate_id = e.aggregate_id
          ORDER BY p.tenant, p.aggregate_type, p.aggregate_id, p.sequence
          LIMIT 1)
    ORDER BY e.created_at, e.sequence
    LIMIT (SELECT %s)"""


def heads_sql(*, at: datetime, limit: int) -> tuple[str, list]:
    """The relay's claim of up to `limit` due aggregate heads (locked, SKIP
    LOCKED, on PostgreSQL) as SQL and its parameters."""
    sql = _HEADS + (" FOR UPDATE OF e SKIP LOCKED" if connection.vendor == "postgresql" else "")
    return sql, [connection.ops.adapt_datetimefield_value(at), int(limit)]


def _claim(*, limit: int, now, policy: RetryPolicy, claim_ttl: float, worker_id: str) -> list[OutboxEvent]:
    """Claim up to `limit` due aggregate heads: count the attempt and hide
    each event for `claim_ttl` seconds. Events already claimed `max_attempts`
    times without being acknowledged are quarantined instead — their
    consumer keeps killing the relay."""
    with transaction.atomic(durable=True):
        at = Clock.of(now).value()
        sql, params = heads_sql(at=at, limit=limit)
        batch = list(OutboxEvent.objects.raw(sql, params))
        spent = [e for e in batch if e.attempts >= policy.max_attempts]
        for event in spent:
            _quarantine(
                event,
                worker_id=worker_id,
                error=f"claimed {event.attempts} times without being acknowledged (the relay may have died "
                f"delivering it); last error: {event.last_error or 'none recorded'}",
            )
        claimed = [e for e in batch if e.attempts < policy.max_attempts]
        if claimed:
            OutboxEvent.objects.filter(pk__in=[e.pk for e in claimed]).update(
                attempts=F("attempts") + 1, next_attempt_at=at + timedelta(seconds=claim_ttl)
            )
            for event in claimed:
                event.attempts += 1
    return batch


def _deliver(event: OutboxEvent, *, now, policy: RetryPolicy, worker_id: str) -> None:
    consumers = registered_consumers(event.event_type)
    try:
        if not consumers:
            raise OutboxError(f"no consumer is registered for event type {event.event_type!r}")
        for consumer in consumers:
            # Each consumer's writes commit on their own, before the event is
            # marked: a relay that dies here leaves a PENDING event whose
            # redelivery the consumer deduplicates.
            with transaction.atomic():
                consumer(event)
    except Exception as exc:  # noqa: BLE001 - any consumer failure is a failed delivery attempt
        # Storable whatever the consumer raised (a NUL in its message must
        # not make recording the failure fail too).
        _failed(event, error=describe_exception(exc, limit=4000), now=now, policy=policy, worker_id=worker_id)
        return
    at = Clock.of(now).value()
    # Fenced on the attempt we claimed: a relay whose claim expired (and was
    # overtaken) writes nothing.
    OutboxEvent.objects.filter(pk=event.pk, state=Status.PENDING, attempts=event.attempts).update(
        state=Status.PUBLISHED, published_at=at, next_attempt_at=None, last_error=""
    )


def _failed(event: OutboxEvent, *, error: str, now, policy: RetryPolicy, worker_id: str) -> None:
    at = Clock.of(now).value()
    if event.attempts >= policy.max_attempts:
        _quarantine(event, worker_id=worker_id, error=f"gave up after {event.attempts} attempts: {error}",
                    fenced=True)
        return
    delay = policy.backoff(event.attempts)
    OutboxEvent.objects.filter(pk=event.pk, state=Status.PENDING, attempts=event.attempts).update(
        next_attempt_at=at + timedelta(seconds=delay), last_error=error[:4000]
    )
    log.info("outbox.retry", extra={"fields": {
        "event": "outbox.retry", "worker": worker_id, "outbox_event": str(event.id),
        "event_type": event.event_type, "attempts": event.attempts, "delay": round(delay, 3), "error": error[:300],
    }})


def _quarantine(event: OutboxEvent, *, worker_id: str, error: str, fenced: bool = False) -> None:
    rows = OutboxEvent.objects.filter(pk=event.pk, state=Status.PENDING)
    if fenced:
        rows = rows.filter(attempts=event.attempts)
    if rows.update(state=Status.QUARANTINED, next_attempt_at=None, last_error=error[:4000]):
        event.state = Status.QUARANTINED
        log.warning("outbox.quarantined", extra={"fields": {
            "event": "outbox.quarantined", "worker": worker_id, "outbox_event": str(event.id),
            "event_type": event.event_type, "aggregate": f"{event.aggregate_type}/{event.aggregate_id}",
            "attempts": event.attempts, "error": error[:300],
        }})


# ---------------------------------------------------------------- operators


def outbox_event_requeue(*, event_id, actor: str) -> OutboxEvent:
    """Send a QUARANTINED event back to the relay with a fresh attempt budget
    (after its consumer was fixed). It is published after the events of its
    aggregate that overtook it while it was quarantined.
    Raises `OutboxError` unless the event is quarantined."""
    with transaction.atomic(durable=True):  # a human decision: never nested
        event = OutboxEvent.objects.select_for_update().filter(pk=event_id).first()
        if event is None:
            raise OutboxError(f"no outbox event {event_id}")
        if event.state != Status.QUARANTINED:
            raise OutboxError(f"outbox event {event_id} is {event.state}, only QUARANTINED events can be requeued")
        event.state = Status.PENDING
        event.attempts = 0
        event.next_attempt_at = None
        event.last_error = f"requeued by {actor} at {timezone.now():%Y-%m-%d %H:%M:%S}Z after: {event.last_error}"[:4000]
        event.save(update_fields=["state", "attempts", "next_attempt_at", "last_error"])
        notify.job_ready()
    return event
