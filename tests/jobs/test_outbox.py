"""The transactional outbox and its relay (DESIGN §7)."""

import multiprocessing
import time
from datetime import date, timedelta

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.utils import timezone

from jobs import notify, outbox
from jobs.health import outbox_health
from jobs.models import Job, OutboxEvent
from jobs.outbox import (
    CLAIM_TTL,
    OutboxError,
    OutsideTransaction,
    outbox_consumer_enqueue,
    outbox_emit,
    outbox_event_requeue,
    outbox_relay,
)
from jobs.retry import RetryPolicy
from tests.support import explained
from tests.testapp.models import Delivery, Invoice

INVOICE = "testapp.invoice"


def invoice_issue(*, number: str, tenant: str = "studio", payload: dict | None = None) -> Invoice:
    """A business change and its event, committed together."""
    with transaction.atomic():
        invoice = Invoice.objects.create(tenant=tenant, number=number, due_date=date(2030, 1, 10))
        outbox_emit(tenant=tenant, aggregate_type=INVOICE, aggregate_id=invoice.pk, event_type="invoice.issued",
                    payload={"number": number, **(payload or {})})
    return invoice


def emit(aggregate_id: str, event_type: str = "testapp.recorded", **payload) -> OutboxEvent:
    with transaction.atomic():
        return outbox_emit(tenant="studio", aggregate_type="testapp.thing", aggregate_id=aggregate_id,
                           event_type=event_type, payload=payload)


@pytest.mark.django_db
def test_rolling_back_a_business_change_rolls_back_its_outbox_event():
    with pytest.raises(RuntimeError), transaction.atomic():
        invoice_issue(number="INV-1")
        raise RuntimeError("the business transaction fails after emitting")
    assert Invoice.objects.count() == 0
    assert OutboxEvent.objects.count() == 0
    assert outbox_relay() == 0


@pytest.mark.django_db(transaction=True)
def test_emit_outside_a_transaction_is_refused_and_writes_nothing():
    with pytest.raises(OutsideTransaction, match="inside transaction.atomic"):
        outbox_emit(tenant="studio", aggregate_type=INVOICE, aggregate_id=1, event_type="invoice.issued")
    assert OutboxEvent.objects.count() == 0


@pytest.mark.django_db
def test_a_committed_event_is_published_once_and_yields_one_job():
    invoice = invoice_issue(number="INV-1")
    event = OutboxEvent.objects.get()
    assert (event.state, event.sequence, event.aggregate_id) == ("PENDING", 1, str(invoice.pk))

    assert outbox_relay() == 1
    event.refresh_from_db()
    assert (event.state, event.attempts, event.last_error) == ("PUBLISHED", 1, "")
    assert event.published_at is not None
    assert Job.objects.filter(key=f"invoice-reminder-plan-{invoice.pk}").count() == 1
    assert outbox_relay() == 0
    assert Delivery.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_relay_killed_between_publishing_and_marking_still_yields_one_job(manage):
    invoice = invoice_issue(number="INV-1", payload={"crash_after_publish_on_attempt": 1})
    key = f"invoice-reminder-plan-{invoice.pk}"

    killed = manage.run("relay_outbox", "--once", check=False)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    event = OutboxEvent.objects.get()
    # The consumer's job committed; the event was never marked.
    assert Job.objects.filter(key=key).count() == 1
    assert (event.state, event.attempts) == ("PENDING", 1)

    # Not redelivered while the dead relay's claim lasts; afterwards it is.
    assert outbox_relay() == 0
    assert outbox_relay(now=time.time() + CLAIM_TTL + 1) == 1
    event.refresh_from_db()
    assert (event.state, event.attempts) == ("PUBLISHED", 2)
    assert Delivery.objects.filter(event_id=event.id).count() == 2  # delivered twice …
    assert Job.objects.filter(key=key).count() == 1  # … deduplicated by the consumer: one job


@pytest.mark.django_db
def test_a_poison_event_is_quarantined_while_the_100_events_behind_it_are_published():
    policy = RetryPolicy(initial_interval=10, multiplier=2, max_interval=100, max_attempts=3)
    poison = emit("A", event_type="testapp.poison", broken=True)
    behind = [emit("A", n=n) for n in range(10)] + [emit(f"B{n % 9}", n=n) for n in range(90)]

    # Attempt 1 fails; other aggregates flow, A's later events wait behind it.
    assert outbox_relay(now=1000, limit=500, policy=policy) == 1 + 90
    poison.refresh_from_db()
    assert (poison.state, poison.attempts) == ("PENDING", 1)
    assert "ValueError: cannot parse" in poison.last_error
    assert OutboxEvent.objects.filter(aggregate_id="A", state="PENDING").count() == 11
    # Backoff: not retried before its next attempt time.
    assert outbox_relay(now=1000, limit=500, policy=policy) == 0
    assert poison.next_attempt_at.timestamp() <= 1010

    outbox_relay(now=1011, limit=500, policy=policy)  # attempt 2 fails (delay ≤ 20 s)
    handled = outbox_relay(now=1032, limit=500, policy=policy)  # attempt 3 fails → quarantined, A flows
    assert handled == 1 + 10
    poison.refresh_from_db()
    assert (poison.state, poison.attempts) == ("QUARANTINED", 3)
    assert "gave up after 3 attempts" in poison.last_error
    assert OutboxEvent.objects.filter(pk__in=[e.pk for e in behind], state="PUBLISHED").count() == 100
    a_order = list(Delivery.objects.filter(aggregate_id="A").values_list("sequence", flat=True))
    assert a_order == list(range(2, 12))

    health = outbox_health()
    assert (health.pending, health.quarantined, health.oldest_pending_id) == (0, 1, None)


@pytest.mark.django_db
def test_a_requeued_event_is_published_after_its_consumer_is_fixed(monkeypatch):
    policy = RetryPolicy(initial_interval=0, max_attempts=2)
    event = emit("A", event_type="testapp.flaky")
    assert outbox_relay(policy=policy) == 2  # no consumer yet: not dropped, retried, then quarantined
    event.refresh_from_db()
    assert event.state == "QUARANTINED"
    assert "no consumer is registered for event type 'testapp.flaky'" in event.last_error

    monkeypatch.setitem(outbox._consumers, "testapp.flaky", [lambda e: None])
    outbox_event_requeue(event_id=event.pk, actor="ops@example.com")
    with pytest.raises(OutboxError, match="only QUARANTINED"):
        outbox_event_requeue(event_id=event.pk, actor="ops@example.com")
    assert outbox_relay(policy=policy) == 1
    event.refresh_from_db()
    assert event.state == "PUBLISHED"


@pytest.mark.django_db
def test_a_relay_that_died_mid_delivery_too_often_quarantines_the_event():
    policy = RetryPolicy(initial_interval=0, max_attempts=3)
    event = emit("A")
    OutboxEvent.objects.filter(pk=event.pk).update(attempts=3)  # three claims, never acknowledged
    assert outbox_relay(policy=policy) == 1
    event.refresh_from_db()
    assert event.state == "QUARANTINED"
    assert "claimed 3 times without being acknowledged" in event.last_error
    assert Delivery.objects.count() == 0


@pytest.mark.django_db
def test_the_relay_is_bounded_per_call():
    for n in range(30):
        emit(f"agg-{n}")
    assert outbox_relay(limit=12) == 12
    assert OutboxEvent.objects.filter(state="PENDING").count() == 18


@pytest.mark.django_db
def test_the_relay_drains_one_aggregate_in_order_within_one_call():
    for n in range(5):
        emit("A", n=n)
    assert outbox_relay(limit=100) == 5
    assert list(Delivery.objects.values_list("sequence", flat=True)) == [1, 2, 3, 4, 5]


@pytest.mark.django_db
def test_enqueue_consumer_turns_a_redelivered_event_into_one_job(monkeypatch):
    monkeypatch.setitem(outbox._consumers, "quote.approved", [])
    outbox_consumer_enqueue("quote.approved", action="jobs.noop", key=lambda e: f"send-quote-{e.aggregate_id}")
    with transaction.atomic():
        event = outbox_emit(tenant="studio", aggregate_type="quote", aggregate_id="017",
                            event_type="quote.approved", payload={"to": "a@example.com"})
    outbox_relay()
    OutboxEvent.objects.filter(pk=event.pk).update(state="PENDING", next_attempt_at=None)  # a redelivery
    outbox_relay()
    job = Job.objects.get(tenant="studio", key="send-quote-017")
    assert job.payload == {"outbox_event": str(event.pk), "event_type": "quote.approved",
                           "data": {"to": "a@example.com"}}
    assert (job.subject_type, job.subject_id) == ("quote", "017")
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_health_shows_the_oldest_unpublished_event_its_age_and_attempts(capsys):
    policy = RetryPolicy(initial_interval=300, max_attempts=5)
    poison = emit("A", event_type="testapp.poison")
    outbox_relay(policy=policy)
    health = outbox_health(now=poison.created_at.timestamp() + 90)
    assert health.pending == 1
    assert health.oldest_pending_id == str(poison.pk)
    assert health.oldest_pending_age_seconds == pytest.approx(90, abs=1)
    assert health.oldest_pending_attempts == 1
    assert "ValueError" in health.oldest_pending_error

    call_command("queue_health")
    out = capsys.readouterr().out
    assert "outbox:  1 pending" in out and "1 attempt(s)" in out and "0 quarantined" in out
    call_command("queue_health", "--check")  # young enough: healthy
    OutboxEvent.objects.filter(pk=poison.pk).update(created_at=poison.created_at - timedelta(minutes=10))
    with pytest.raises(SystemExit):
        call_command("queue_health", "--check", "--max-outbox-age", "300")
    assert "PROBLEM: oldest unpublished outbox event is" in capsys.readouterr().out


@pytest.mark.django_db(transaction=True)
def test_run_worker_relays_the_outbox_and_runs_the_resulting_job(manage):
    invoice = invoice_issue(number="INV-1")
    manage.run("run_worker", "--until-idle", "--poll-interval", "0.05")
    assert OutboxEvent.objects.get().state == "PUBLISHED"
    assert Job.objects.get(key=f"invoice-reminder-plan-{invoice.pk}").state == "DONE"


# ---------------------------------------------------------------- real processes (NOTIFY: PostgreSQL only)


_START: "multiprocessing.synchronize.Barrier | None" = None  # set before forking the relays


def _relay_until_drained(relay_id: str) -> int:
    handled = 0
    if _START is not None:
        # Start together, then each relay delivers one head of the eight
        # aggregates before any takes more: every relay gets work, whatever
        # the host's load. (Started together only, one relay drained the
        # outbox alone on a loaded CI host: it took every head, delivered
        # them and took the next ones before the others, asleep between
        # their tries, woke.)
        _START.wait(timeout=60)
        handled += outbox_relay(limit=1, worker_id=relay_id)
        _START.wait(timeout=60)
    while OutboxEvent.objects.filter(state="PENDING").exists():
        # Two heads a call: the others stay open to the other relays while
        # this one delivers.
        done = outbox_relay(limit=2, worker_id=relay_id)
        handled += done
        if not done:
            time.sleep(0.005)  # the heads are claimed by other relays
    connections.close_all()
    return handled


@pytest.mark.django_db(transaction=True)
def test_per_aggregate_order_holds_under_four_concurrent_relays():
    for n in range(200):
        emit(f"agg-{n % 8}", sleep=0.002, n=n)
    connections.close_all()
    global _START
    ctx = multiprocessing.get_context("fork")
    _START = ctx.Barrier(4)  # inherited by the forked relays
    try:
        with ctx.Pool(4) as pool:
            handled = pool.map(_relay_until_drained, [f"relay-{n}" for n in range(4)], chunksize=1)
    finally:
        _START = None
    assert sum(handled) == 200
    assert OutboxEvent.objects.exclude(state="PUBLISHED").count() == 0
    deliveries = list(Delivery.objects.order_by("id").values_list("aggregate_id", "sequence", "consumer"))
    assert len(deliveries) == 200  # each delivered once: no claim expired
    for aggregate in {a for a, _, _ in deliveries}:
        sequences = [s for a, s, _ in deliveries if a == aggregate]
        assert sequences == list(range(1, 26)), aggregate
    assert len({process for _, _, process in deliveries}) == 4  # every relay delivered some


@pytest.mark.postgres
def test_emit_wakes_listening_workers_on_commit_and_not_on_rollback(test_database_url):
    import select
    import time

    from django.conf import settings

    # A listener on a connection of its own, direct to the database (behind a
    # pooler: DATABASE_LISTEN_URL, as the workers' is).
    listener = notify.Listener(lambda: None, url=settings.DATABASE_LISTEN_URL or test_database_url)
    assert listener.ensure()
    received = 0
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            emit("A")
            raise RuntimeError("rolled back")
        emit("A")
        emit("B")
        # Notifications arrive in commit order: once both commits' have
        # arrived, one from the rolled-back emit would have arrived too.
        deadline = time.monotonic() + 20
        while received < 2 and time.monotonic() < deadline:
            select.select([listener.fileno()], [], [], 0.5)
            received += listener.drain()
        assert received == 2
    finally:
        listener.close()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_relay_batch_reads_the_head_of_a_backlog_not_all_of_it_whatever_the_statistics():
    """Statistics taken while nearly every event was published, then a
    consumer's outage leaves 20,000 pending: a batch of the relay must read
    the oldest heads in index order, not hash and sort every pending event
    (a plan PostgreSQL chose for the LIMIT written in as a constant)."""
    at = timezone.now()

    def events(n, state, aggregates):
        return [OutboxEvent(tenant="studio", aggregate_type="testapp.thing", aggregate_id=f"a{i % aggregates}",
                            sequence=i + 1, event_type="e", state=state, created_at=at - timedelta(seconds=n - i))
                for i in range(n)]

    OutboxEvent.objects.bulk_create(events(5000, "PUBLISHED", 500))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_outboxevent")
    OutboxEvent.objects.bulk_create(
        OutboxEvent(tenant="studio", aggregate_type="testapp.backlog", aggregate_id=f"b{i}", sequence=1,
                    event_type="e", created_at=at - timedelta(seconds=20_000 - i)) for i in range(20_000))
    with connection.cursor() as cursor:
        cursor.execute("VACUUM jobs_outboxevent")
    limit = 100
    sql, params = outbox.heads_sql(at=at, limit=limit)
    read = [(node["Node Type"], node.get("Index Name"), node["Actual Rows"] * node["Actual Loops"])
            for node in explained(sql, params)
            if node.get("Index Name") == "outbox_pending_order" or node["Node Type"] in ("Sort", "Hash")]
    assert read and all(rows <= 2 * limit for *_, rows in read), read
    assert outbox_relay(limit=limit) == limit  # (and the relay takes them, oldest first)
    assert not OutboxEvent.objects.filter(state="PENDING", aggregate_id__in=["b0", "b99"], attempts=0).exists()
