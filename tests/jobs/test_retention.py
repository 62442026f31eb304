"""Retention: finished work past the cutoff goes, in batches; unfinished work
and everything live refers to stays."""

import signal
import time

import pytest
from django.core.management import call_command
from django.db import connection

from jobs import interventions
from jobs.models import InboundEvent, Job, JobEvent, Timer
from jobs.retention import retention_sweep, rows_after
from jobs.selectors import FINISHED
from operations.models import ConnectorPause, Operation, OperationEvent, OperationState, Receipt
from tests.factories import (
    ConnectorPauseFactory,
    InboundEventFactory,
    OperationFactory,
    ReceiptFactory,
    TimerFactory,
)
from tests.support import explained

pytestmark = pytest.mark.django_db

DAY = 86400.0


def finished(store, key, *, days_ago, state="DONE", payload=None, tenant="studio"):
    at = time.time() - days_ago * DAY
    store.enqueue(tenant, key, payload=payload or {"body": f"secret of {key}"}, now=at)
    if state == "CANCELLED":
        interventions.job_cancel(tenant=tenant, key=key, reason="no longer wanted", actor="op", now=at)
    else:
        epoch = store.claim(tenant, key, "w1", now=at)
        store.finish(tenant, key, "w1", epoch, result={"ok": True}, now=at)
    return Job.objects.get(tenant=tenant, key=key)


def operation(job, state=OperationState.ACCEPTED, *, receipt=True):
    op = OperationFactory(job=job, provider="sim-idempotent", request={"to": "a@example.com", "body": "the email body"},
                          state=state)
    OperationEvent.objects.create(operation=op, kind="dispatch", to_state=state)
    if receipt:
        ReceiptFactory(operation=op, provider_reference="msg_1")
    return op


def test_retention_deletes_only_finished_work_past_the_cutoff_in_batches_and_keeps_what_live_work_refers_to(store):
    old = [finished(store, f"old-{n}", days_ago=40) for n in range(5)]
    old_cancelled = finished(store, "old-cancelled", days_ago=40, state="CANCELLED")
    for job in old[:2]:
        operation(job)
    finished(store, "recent", days_ago=3)
    # Unfinished work, however old.
    store.enqueue("studio", "old-ready", now=time.time() - 90 * DAY)
    store.enqueue("studio", "old-attention", now=time.time() - 90 * DAY)
    interventions.job_escalate(tenant="studio", key="old-attention", reason="stuck", actor="op", now=time.time() - 90 * DAY)
    waiting = store.enqueue("studio", "old-waiting", now=time.time() - 90 * DAY)
    epoch = store.claim("studio", "old-waiting", "w1", now=time.time() - 90 * DAY)
    store.wait("studio", "old-waiting", "w1", epoch, reason="customer reply", now=time.time() - 90 * DAY)
    operation(waiting, OperationState.ACCEPTED)
    # Finished, but something live still refers to it.
    with_timer = finished(store, "old-with-pending-timer", days_ago=40)
    TimerFactory(job=with_timer, reason="remind")
    with_unmatched = finished(store, "old-with-unmatched-inbound", days_ago=40)
    InboundEventFactory(event_id="e-1", job=with_unmatched)
    in_doubt = finished(store, "old-with-operation-in-doubt", days_ago=40)
    operation(in_doubt, OperationState.UNKNOWN, receipt=False)
    paused = finished(store, "old-named-by-a-pause", days_ago=40)
    ConnectorPauseFactory(provider="sim-idempotent", operation=operation(paused, OperationState.FAILED, receipt=False))

    report = retention_sweep(retention_days=30, redact_after_days=7, batch_size=2)

    gone = {j.pk for j in [*old, old_cancelled]}
    assert not Job.objects.filter(pk__in=gone).exists()
    assert not JobEvent.objects.filter(job_id__in=gone).exists()
    assert not Operation.objects.filter(job_id__in=gone).exists() and not Receipt.objects.filter(
        operation__job_id__in=gone).exists()
    assert set(Job.objects.values_list("key", flat=True)) == {
        "recent", "old-ready", "old-attention", "old-waiting", "old-with-pending-timer",
        "old-with-unmatched-inbound", "old-with-operation-in-doubt", "old-named-by-a-pause"}
    assert Operation.objects.filter(job=waiting).get().request["body"] == "the email body"
    assert Timer.objects.filter(job=with_timer, state="PENDING").exists()
    assert InboundEvent.objects.filter(job=with_unmatched).exists()
    assert ConnectorPause.objects.get().operation.job_id == paused.pk
    assert report.deleted["jobs.Job"] == 6 and report.deleted["operations.Receipt"] == 2
    assert report.deleted["jobs.JobEvent"] >= 6 * 2
    assert report.kept == 4
    assert report.batches > 2  # 10 finished jobs past the cutoff, 2 per batch
    # The kept ones are not deleted by a second sweep either; nothing else goes.
    again = retention_sweep(retention_days=30, redact_after_days=7, batch_size=2)
    assert again.deleted["jobs.Job"] == 0 and again.kept == 4
    assert Job.objects.filter(key="recent").exists()


def test_bodies_of_finished_work_are_redacted_before_it_is_deleted(store):
    job = finished(store, "last-week", days_ago=10)
    op = operation(job)
    fresh = finished(store, "yesterday", days_ago=1)
    live = store.enqueue("studio", "live", payload={"body": "keep me"}, now=time.time() - 10 * DAY)

    report = retention_sweep(retention_days=30, redact_after_days=7)

    job.refresh_from_db()
    op.refresh_from_db()
    assert job.redacted_at is not None and "body" not in job.payload and job.payload["redacted"] is True
    assert "body" not in op.request and op.request_digest == "d" * 64
    assert job.result == {"ok": True} and job.events.exists()  # history stays
    fresh.refresh_from_db()
    live.refresh_from_db()
    assert fresh.payload["body"] and live.payload == {"body": "keep me"}
    assert report.redacted == {"jobs.Job.payload": 1, "operations.Operation.request": 1}
    assert retention_sweep(retention_days=30, redact_after_days=7).redacted == {}


def test_deletion_takes_redacted_and_unredacted_jobs_past_retention_alike(store):
    """The two halves of the finished jobs (each with its own index) are
    both deleted once past retention, as one phase, oldest first within
    each."""
    redacted = [finished(store, f"redacted-{n}", days_ago=40 + n) for n in range(3)]
    retention_sweep(retention_days=60, redact_after_days=7)
    assert all(Job.objects.get(pk=job.pk).redacted_at is not None for job in redacted)
    whole = [finished(store, f"whole-{n}", days_ago=35 + n) for n in range(3)]
    recent = finished(store, "recent", days_ago=10)

    # Pages of two: a page never spans the halves; the second half is read
    # after the first ran out.
    report = retention_sweep(retention_days=30, redact_after_days=None, batch_size=2, pause_ratio=0)

    assert report.deleted["jobs.Job"] == 6 and report.stopped_by == "done"
    assert list(Job.objects.values_list("key", flat=True)) == [recent.key]
    assert not JobEvent.objects.filter(job_id__in=[job.pk for job in redacted + whole]).exists()


def test_jobs_finished_at_one_instant_are_each_visited_once_in_pages_of_one(store, settings):
    """A batch's finish gives its jobs one `finished_at`: the pages after a
    key go on through that instant's ties by id, and the kept ones (a
    pending timer) do not stop the walk or come round again."""
    settings.JOBS_RETENTION_BATCH_SECONDS = 0  # every page one job
    jobs = [finished(store, f"batch-{n}", days_ago=40) for n in range(6)]
    Job.objects.filter(pk__in=[job.pk for job in jobs]).update(finished_at=jobs[0].finished_at)
    for job in jobs[1::2]:
        TimerFactory(job=job, reason="remind")

    report = retention_sweep(retention_days=30, redact_after_days=None, batch_size=1, pause_ratio=0)

    assert (report.deleted["jobs.Job"], report.kept, report.batches) == (3, 3, 6)
    assert set(Job.objects.values_list("key", flat=True)) == {job.key for job in jobs[1::2]}


@pytest.mark.postgres
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the plan of PostgreSQL's partial index")
def test_a_page_after_a_key_reads_the_index_from_that_key_on(store):
    """Not the rows before it, filtered out one by one: with the key far
    into the finished rows, every page of a sweep would read them all."""
    jobs = [finished(store, f"old-{n}", days_ago=40 + n / 100) for n in range(300)]
    *_, key, newest = sorted(jobs, key=lambda job: job.finished_at)
    rows = Job.objects.filter(state__in=FINISHED, redacted_at__isnull=True)
    page = rows_after(rows, (key.finished_at, key.pk)).order_by("finished_at", "id").values_list("id")[:10]
    nodes = explained(*page.query.sql_with_params(),
                      settings=("SET LOCAL enable_seqscan = off", "SET LOCAL enable_bitmapscan = off"))
    # The range starts at the key: its own entry is the one row filtered out.
    assert [(node["Node Type"], node.get("Index Name")) for node in nodes
            if node.get("Index Name") == "job_finished_unredacted"] == [("Index Scan", "job_finished_unredacted")]
    assert [node["Rows Removed by Filter"] for node in nodes if "Rows Removed by Filter" in node] == [1], nodes
    assert [job_id for (job_id,) in rows_after(rows, (key.finished_at, key.pk)).values_list("id")] == [newest.pk]


def test_a_batch_limit_counts_the_deletion_of_both_halves_as_one_phase(store):
    for n in range(2):
        finished(store, f"redacted-{n}", days_ago=40)
    retention_sweep(retention_days=60, redact_after_days=7)
    for n in range(2):
        finished(store, f"whole-{n}", days_ago=40)

    report = retention_sweep(retention_days=30, redact_after_days=None, batch_size=2, max_batches=1,
                             pause_ratio=0)

    assert (report.deleted["jobs.Job"], report.stopped_by) == (2, "max_batches")
    # The redacted half goes first; the rest is the next sweep's.
    assert set(Job.objects.values_list("key", flat=True)) == {"whole-0", "whole-1"}


def test_prune_command_reports_what_it_removed(store, capsys):
    finished(store, "old", days_ago=40)
    call_command("prune", "--days", "30")
    out = capsys.readouterr().out
    assert "1 jobs.Job" in out and not Job.objects.exists()


def _in_doubt(job):
    operation(job, OperationState.UNKNOWN, receipt=False)


def _pending_timer(job):
    TimerFactory(job=job, reason="remind")


def _unmatched_inbound(job):
    InboundEventFactory(event_id=f"e-{job.pk}", job=job)


def _named_by_a_pause(job):
    ConnectorPauseFactory(provider="sim-idempotent", operation=operation(job, OperationState.FAILED, receipt=False))


@pytest.mark.parametrize("refers", [_in_doubt, _pending_timer, _unmatched_inbound, _named_by_a_pause],
                         ids=["operation in doubt", "pending timer", "unmatched inbound event", "pause in force"])
def test_redaction_keeps_the_bodies_something_live_still_refers_to(store, refers):
    # The operator deciding an operation in doubt must still see what was
    # asked of the provider: redaction obeys deletion's "referred to" rule.
    job = finished(store, "last-week", days_ago=10)
    refers(job)
    plain = finished(store, "last-week-plain", days_ago=10)

    report = retention_sweep(retention_days=30, redact_after_days=7)

    job.refresh_from_db()
    plain.refresh_from_db()
    assert job.redacted_at is None and job.payload == {"body": "secret of last-week"}
    assert all(op.request["body"] == "the email body" for op in Operation.objects.filter(job=job))
    assert plain.redacted_at is not None  # the rule keeps only what is referred to
    assert report.redacted["jobs.Job.payload"] == 1 and report.kept_unredacted == 1


def test_when_deletion_stops_at_its_batch_limit_redaction_leaves_the_rows_due_for_deletion(store):
    due_for_deletion = [finished(store, f"old-{n}", days_ago=40) for n in range(5)]
    for job in due_for_deletion:
        operation(job)
    recent = finished(store, "last-week", days_ago=10)

    report = retention_sweep(retention_days=30, redact_after_days=7, batch_size=2, max_batches=1)

    assert report.deleted["jobs.Job"] == 2
    left = Job.objects.filter(key__startswith="old-")
    assert left.count() == 3
    # Not rewritten on their way out: the next sweep deletes them.
    assert all(job.redacted_at is None and job.payload["body"] for job in left)
    assert all(op.request["body"] == "the email body" for op in Operation.objects.filter(job__in=left))
    recent.refresh_from_db()
    assert recent.redacted_at is not None
    assert report.redacted["jobs.Job.payload"] == 1
    retention_sweep(retention_days=30, redact_after_days=7, batch_size=2)
    assert not Job.objects.filter(key__startswith="old-").exists()


# ---------------------------------------------------------------- a sweep that keeps up: no batch cap, paced, told


def test_a_sweep_runs_past_the_old_cap_of_200_batches_until_the_work_runs_out(store, settings):
    # A target of 0 s keeps every batch at one job: 230 batches.
    settings.JOBS_RETENTION_BATCH_SECONDS = 0
    for n in range(230):
        finished(store, f"old-{n}", days_ago=40)
    report = retention_sweep(retention_days=30, redact_after_days=7, batch_size=1, pause_ratio=0)
    assert (report.deleted["jobs.Job"], report.batches, report.stopped_by) == (230, 230, "done")
    assert not Job.objects.exists()


def test_batches_grow_while_they_are_quick(store, settings):
    settings.JOBS_RETENTION_BATCH_SECONDS = 3600
    for n in range(20):
        finished(store, f"old-{n}", days_ago=40)
    report = retention_sweep(retention_days=30, redact_after_days=7, batch_size=1, pause_ratio=0)
    # 1, 2, 4, 8, then the 5 left.
    assert (report.deleted["jobs.Job"], report.batches) == (20, 5)


def test_a_sweep_reports_its_progress_and_why_it_ended(store):
    for n in range(3):
        finished(store, f"old-{n}", days_ago=40)
    lines = []
    report = retention_sweep(retention_days=30, redact_after_days=7, progress=lines.append, pause_ratio=0)
    assert any("deleting 3 of 3 job(s)" in line and "jobs/s" in line and "about 0 left" in line for line in lines)
    assert report.stopped_by == "done" and report.as_dict()["stopped_by"] == "done"


def test_a_spent_budget_or_a_stop_signal_ends_the_sweep_and_leaves_the_rest(store):
    import threading

    for n in range(3):
        finished(store, f"old-{n}", days_ago=40)
    report = retention_sweep(retention_days=30, redact_after_days=7, budget_seconds=1e-9)
    assert report.stopped_by == "budget" and "time budget" in report.summary()
    stop = threading.Event()
    stop.set()
    report = retention_sweep(retention_days=30, redact_after_days=7, stop=stop)
    assert report.stopped_by == "signal" and "stopped by a signal" in report.summary()
    assert Job.objects.count() == 3
    assert retention_sweep(retention_days=30, redact_after_days=7).deleted["jobs.Job"] == 3


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_prune_process_stopped_by_a_signal_says_what_it_did(store, manage, signum):
    for n in range(4):
        finished(store, f"old-{n}", days_ago=40)
    # One job a batch, then a long pause: the signal arrives in the pause.
    prune = manage.start("prune", "--days", "30", "--batch-size", "1", "--pause-ratio", "5000",
                         "--progress-every", "3600")
    seen = []
    for line in prune.stdout:
        seen.append(line)
        if "deleting 1 of 4 job(s)" in line:
            break
    prune.send_signal(signum)
    out = "".join(seen) + prune.communicate(timeout=60)[0]
    assert prune.returncode == 0, out
    assert "deleted 1 jobs.Job" in out and "stopped by a signal" in out
    assert Job.objects.count() == 3
