"""Tenant fairness (DESIGN §5): one tenant's backlog cannot starve another."""

import signal

import pytest
from django.db import connection
from django.test import override_settings

from jobs.models import Job, JobEvent
from jobs.states import State
from jobs.store import JobSpec
from tests.support import ProcessOutput, wait_for


@pytest.mark.django_db
def test_least_loaded_tenant_is_served_first(store):
    store.enqueue_many(JobSpec("big", f"b-{i}") for i in range(50))
    for _ in range(3):
        store.claim_next("w", now=10)
    store.enqueue("small", "s-0")
    assert store.claim_next("w", now=10).tenant == "small"


@pytest.mark.django_db
def test_claims_alternate_between_tenants_while_their_jobs_run(store):
    store.enqueue_many(JobSpec("big", f"b-{i}") for i in range(200))
    store.enqueue_many(JobSpec("small", f"s-{i}") for i in range(10))
    # Nothing finishes: after each claim the claimed tenant is the more
    # loaded one, so the next claim goes to the other (least-loaded first);
    # only the tie at the start of each pair is a lottery.
    order = [store.claim_next("w", now=10).tenant for _ in range(24)]
    pairs = [order[i:i + 2] for i in range(0, 20, 2)]
    assert all(sorted(pair) == ["big", "small"] for pair in pairs), order
    assert order[20:] == ["big"] * 4  # the small tenant has run out of jobs


@pytest.mark.django_db
@override_settings(JOBS_TENANT_LEASE_CAP=2)
def test_a_tenant_at_its_lease_cap_waits_without_blocking_others(store):
    store.enqueue_many(JobSpec("big", f"b-{i}") for i in range(10))
    store.enqueue_many(JobSpec("small", f"s-{i}") for i in range(3))
    claimed = [store.claim_next(f"w{i}", now=10) for i in range(6)]
    tenants = [j.tenant if j else None for j in claimed]
    assert tenants.count("big") == 2 and tenants.count("small") == 2
    assert tenants[4:] == [None, None]
    finished = next(j for j in claimed if j and j.tenant == "big")
    store.finish(finished.tenant, finished.key, finished.worker_id, finished.lease_epoch, now=10)
    assert store.claim_next("w9", now=10).tenant == "big"


def _claims() -> list[tuple]:
    """(claim time, job id, tenant) of every attempt so far, in claim order:
    the ended ones from their history rows, the running ones from their job
    rows (`Job.claimed_at`)."""
    ended = JobEvent.objects.exclude(claimed_at=None).values_list("claimed_at", "job_id", "job__tenant")
    running = Job.objects.filter(state=State.LEASED).values_list("updated_at", "id", "tenant")
    return sorted([*ended, *running])


@pytest.mark.django_db(transaction=True)
def test_small_tenant_behind_ten_thousand_big_jobs_starts_within_forty_claims(store, manage):
    store.enqueue_many(JobSpec("big", f"big-{i:05d}", action="test.sleep", payload={"seconds": 0.01})
                       for i in range(10_000))
    workers = [ProcessOutput(manage.start("run_worker", "--worker-id", f"w{n}", "--poll-interval", "0.2"))
               for n in range(4)]
    try:
        for worker in workers:
            worker.wait_for("worker.start", timeout=60)  # all four are claiming (and handle SIGTERM)
        wait_for(lambda: Job.objects.exclude(state=State.READY).count() >= 20, timeout=60,
                 what="the big backlog to be under way")
        store.enqueue_many(JobSpec("small", f"small-{i}") for i in range(10))
        # Claims are counted from the small tenant's arrival: its enqueue
        # events, not a moment before it (on SQLite the enqueue may wait for
        # the write lock while the workers go on claiming big jobs). Each job
        # here runs once: one claim each.
        mark = JobEvent.objects.filter(kind="enqueue", job__tenant="small").order_by("-id").values_list(
            "created_at", flat=True).first()
        wait_for(lambda: Job.objects.filter(tenant="small", state="DONE").count() == 10, timeout=60,
                 what="the small tenant's ten jobs to run")
    finally:
        for worker in workers:
            worker.process.send_signal(signal.SIGTERM)
        outputs = [worker.finish(timeout=30) for worker in workers]
    # (SQLite: a claim's time is read before it waits for the write lock, so
    # a small job may carry a time a moment before its enqueue's: it counts.)
    claims_after = [tenant for claimed_at, _, tenant in _claims() if claimed_at > mark or tenant == "small"]
    positions = [i + 1 for i, tenant in enumerate(claims_after) if tenant == "small"]
    assert len(positions) == 10, claims_after[:60]
    assert max(positions) <= 40, positions
    assert [w.process.returncode for w in workers] == [0, 0, 0, 0], outputs


@pytest.mark.django_db
@override_settings(JOBS_TENANT_LEASE_CAP=1)
def test_with_most_tenants_at_their_cap_a_claim_still_finds_the_ones_under_it(store):
    """A claim looks at a sample of the tenants; when every sampled one is
    at its cap, it goes on to the others instead of coming back empty while
    a tenant could be served (measured before: empty from the 33rd claim of
    40 tenants)."""
    tenants = [f"t{i:02d}" for i in range(40)]
    store.enqueue_many(JobSpec(t, f"{t}-{k}") for t in tenants for k in range(2))
    claimed = [store.claim_next(f"w{i}", now=10) for i in range(40)]
    assert [i for i, job in enumerate(claimed) if job is None] == []
    assert sorted(job.tenant for job in claimed) == tenants
    assert store.claim_next("w-last", now=10) is None  # every tenant is at its cap


@pytest.mark.django_db
@override_settings(JOBS_TENANT_LEASE_CAP=1)
def test_under_a_cap_tenants_with_only_later_work_do_not_hide_the_ones_with_work_now(store):
    # The tenants with work now are not the newest (a claim always looks at
    # those), and a hundred others hold only work scheduled for later.
    store.enqueue_many(JobSpec(t, f"{t}-0") for t in ("now-a", "now-b"))
    store.enqueue_many(JobSpec(f"later-{i:03d}", "job-0", run_at=500) for i in range(100))
    claimed = [store.claim_next(f"w{i}", now=10) for i in range(3)]
    assert sorted(job.tenant for job in claimed if job) == ["now-a", "now-b"]
    assert claimed[2] is None


@pytest.mark.django_db
@pytest.mark.postgres
@override_settings(JOBS_TENANT_LEASE_CAP=2)
@pytest.mark.parametrize("batch", [1, 3])
def test_a_capped_claim_holds_the_locks_of_no_more_tenants_than_it_may_take_jobs(store, batch):
    """The cap's per-tenant locks are tried in the fair order until the
    batch size is held: a claim of one job that locked every candidate (six
    tenants here) made every concurrent claimer find them taken, and wait.
    (The test's transaction keeps the claim's locks until it ends.)"""
    for tenant in range(8):
        store.enqueue_many(JobSpec(f"t{tenant}", f"t{tenant}-{i}") for i in range(3))
    jobs = store.claim_batch("w", limit=batch)
    assert len(jobs) == batch
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        assert cursor.fetchone()[0] == batch
