"""Races between real OS processes on the test database (SQLite serialises
claimers with BEGIN IMMEDIATE, PostgreSQL steps over locked rows with SKIP
LOCKED): every job done exactly once, stale writes fenced out, idempotent
enqueue."""

import multiprocessing

import pytest

from jobs.models import Job, JobEvent, JobSearch
from jobs.store import JobSpec, Store
from tests.support import in_processes

pytestmark = pytest.mark.django_db(transaction=True)


# Seconds since the epoch, long after any lease this test grants has expired.
STALE_AFTER = 4_000_000_000


def _drain(worker_id: str, stale_epoch_checks: bool) -> dict:
    from jobs.errors import Conflict

    store = Store()
    finished, conflicts = [], 0
    while True:
        job = store.claim_next(worker_id, ttl=60)
        if job is None:
            break
        epoch = job.lease_epoch
        if stale_epoch_checks:
            # Another slot of this same worker takes the job over once its
            # lease has expired (a clock far ahead): the epoch it was claimed
            # with is now stale, and a write with it must never land.
            epoch = store.claim(job.tenant, job.key, worker_id, now=STALE_AFTER, ttl=60)
            assert epoch == job.lease_epoch + 1
            try:
                store.finish(job.tenant, job.key, worker_id, job.lease_epoch)
            except Conflict:
                conflicts += 1
        store.finish(job.tenant, job.key, worker_id, epoch)
        finished.append(job.key)
    return {"finished": finished, "conflicts": conflicts}


def test_eight_processes_race_claim_next_and_each_job_is_done_exactly_once():
    Store().enqueue_many(JobSpec(f"tenant-{i % 3}", f"job-{i:04d}") for i in range(2000))
    results = in_processes(_drain, [(f"worker-{n}", n == 0) for n in range(8)])

    assert all(status == "ok" for status, _ in results), results
    finished = [key for _, r in results for key in r["finished"]]
    assert len(finished) == 2000
    assert len(set(finished)) == 2000  # nobody finished a job twice
    assert sum(1 for _, r in results if r["finished"]) > 1  # the work really was shared
    assert results and all(r["conflicts"] == len(r["finished"]) for _, r in results if r["conflicts"])
    assert Job.objects.filter(state="DONE").count() == 2000
    assert Job.objects.exclude(state="DONE").count() == 0
    # One row per attempt, each with its claim: every job's first attempt
    # (epoch 1) ended by its finish or, for worker-0's, by the takeover of
    # the same worker's other slot; the finish came from the job's holder.
    attempts = JobEvent.objects.exclude(claimed_at=None)
    takeovers = attempts.filter(kind="takeover")
    assert takeovers.count() == sum(r["conflicts"] for _, r in results) > 0
    assert set(takeovers.values_list("epoch", flat=True)) == {1}
    assert attempts.filter(epoch=1).count() == 2000
    assert attempts.count() == 2000 + takeovers.count()
    finishes = {(e.job_id, e.worker_id) for e in attempts.filter(kind="finish")}
    holders = set(Job.objects.values_list("id", "worker_id"))
    assert finishes == holders and len(finishes) == 2000


def _enqueue_same(_):
    job = Store().enqueue("studio", "send-quote-017", payload={"pid": multiprocessing.current_process().pid})
    return job.pk


def test_enqueueing_the_same_key_from_two_processes_yields_one_job():
    for _round in range(20):
        # History is not cascaded (it goes with its partition or by retention).
        JobEvent.objects.all().delete()
        JobSearch.objects.all().delete()
        Job.objects.all().delete()
        results = in_processes(_enqueue_same, [(n,) for n in range(2)], timeout=60)
        assert [s for s, _ in results] == ["ok", "ok"], results
        assert results[0][1] == results[1][1]
        assert Job.objects.filter(tenant="studio", key="send-quote-017").count() == 1
        assert JobEvent.objects.filter(kind="enqueue").count() == 1


def _enqueue_many_same(_):
    return Store().enqueue_many(JobSpec(f"tenant-{i % 2}", f"key-{i:03d}") for i in range(300))


def test_enqueue_many_of_the_same_keys_from_four_processes_creates_each_job_once():
    results = in_processes(_enqueue_many_same, [(n,) for n in range(4)], timeout=60)
    assert [s for s, _ in results] == ["ok"] * 4, results
    assert sum(created for _, created in results) == 300
    assert Job.objects.count() == 300
    assert JobSearch.objects.count() == 300
    assert JobEvent.objects.filter(kind="enqueue").count() == 300
    assert set(JobSearch.objects.values_list("job_id", flat=True)) == set(Job.objects.values_list("id", flat=True))
