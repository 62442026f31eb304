"""Batched claims and fairness across many tenants, on whichever database
the suite runs on, with the same semantics on SQLite and PostgreSQL: among a
thousand busy tenants one that gets a job starts within two claims and a large
backlog gets no more than its share, a batch is spread over tenants as single
claims are and respects the lease cap, and each job of a batch keeps its own
fence."""

import signal
import time
from collections import Counter

import pytest
from django.db import DatabaseError
from django.db.models.functions import Now
from django.test import override_settings

from jobs.models import Job, JobEvent
from jobs.clock import to_datetime
from jobs.states import State
from jobs.store import JobSpec, Store
from jobs.worker import Worker, WorkerConfig
from tests.support import wait_for


def _tenants(count: int, jobs_each: int) -> list[JobSpec]:
    return [JobSpec(f"t{n:04d}", f"j{i}") for n in range(count) for i in range(jobs_each)]


# ---------------------------------------------------------------- fairness with 1,000 tenants


@pytest.mark.django_db
def test_with_a_thousand_busy_tenants_a_tenant_that_gets_a_job_starts_within_two_claims(store):
    store.enqueue_many(_tenants(1000, 3))
    # Every tenant has a job running (a batch spreads over all of them).
    assert len({job.tenant for job in store.claim_batch("busy", limit=1000)}) == 1000
    store.enqueue("newcomer", "first")
    claimed = [store.claim_next("w").tenant for _ in range(2)]
    assert "newcomer" in claimed, claimed


@pytest.mark.django_db
def test_a_tenant_with_a_large_backlog_gets_no_more_than_its_share_among_a_thousand(store):
    store.enqueue_many(JobSpec("big", f"b{i}") for i in range(2000))
    store.enqueue_many(_tenants(1000, 2))
    served = Counter()
    for _ in range(500):
        job = store.claim_next("w")
        store.finish(job.tenant, job.key, "w", job.lease_epoch)
        served[job.tenant] += 1
    # Oldest-first would give the big tenant all 500; one tenant in 1,001
    # gets a small share, and the claims are spread over hundreds of tenants.
    assert served["big"] <= 50, served["big"]
    assert len(served) >= 300, len(served)


@pytest.mark.django_db
def test_a_batch_is_spread_over_tenants_like_single_claims(store):
    store.enqueue_many(_tenants(1000, 5))
    jobs = store.claim_batch("w", limit=50)
    assert len(jobs) == 50
    assert len({job.tenant for job in jobs}) == 50


@pytest.mark.django_db
def test_a_batch_takes_the_least_loaded_tenants_work_first(store):
    store.enqueue_many(JobSpec("big", f"b{i}") for i in range(20))
    for n in range(4):
        store.claim_next(f"x{n}", tenants=["big"])
    store.enqueue_many(JobSpec("small", f"s{i}") for i in range(3))
    tenants = [job.tenant for job in store.claim_batch("w", limit=6)]
    # "small" has nothing running, "big" four: small's three go first (its
    # loads 0, 1, 2 are below big's 4), then big's.
    assert sorted(tenants) == ["big", "big", "big", "small", "small", "small"]


@pytest.mark.django_db
@pytest.mark.parametrize("others", ["another action's work", "retries not due yet"])
def test_a_batch_is_full_when_the_other_tenants_with_ready_jobs_have_none_it_may_take(store, others):
    """A worker for one action (`--action`), or tenants whose READY jobs all
    wait for a retry: the batch is filled from the tenants that can give
    work, not cut to the share they would have had if every tenant could
    (it was a third: 35 of 100, with three tenants)."""
    store.enqueue_many(JobSpec("mail", f"m{i}", action="jobs.noop") for i in range(150))
    later = time.time() + 3600
    for tenant in ("books", "crm"):
        if others == "retries not due yet":
            store.enqueue_many(JobSpec(tenant, f"r{i}", run_at=later) for i in range(40))
        else:
            store.enqueue_many(JobSpec(tenant, f"r{i}", action="reports.build") for i in range(40))
    jobs = store.claim_batch("w", limit=100, actions=["jobs.noop"])
    assert len(jobs) == 100 and {job.tenant for job in jobs} == {"mail"}
    # In the claim order: the tenant's first hundred.
    assert sorted(job.key for job in jobs) == sorted(f"m{i}" for i in range(100))


@pytest.mark.django_db
def test_a_batch_filled_from_the_tenants_that_can_give_work_still_shares_it_among_them(store):
    store.enqueue_many(JobSpec(tenant, f"{tenant}{i}") for tenant in ("a", "b") for i in range(60))
    store.enqueue_many(JobSpec(tenant, f"r{i}", action="reports.build") for tenant in ("c", "d")
                       for i in range(10))
    tenants = Counter(job.tenant for job in store.claim_batch("w", limit=100, actions=["jobs.noop"]))
    assert tenants == {"a": 50, "b": 50}


# ---------------------------------------------------------------- batched claims and finishes


@pytest.mark.django_db
@pytest.mark.parametrize("size", [1, 3])
def test_a_batch_s_finish_records_each_attempt_s_claim_not_its_renewal(store, size):
    store.enqueue_many(JobSpec("a", f"k{i}") for i in range(size))
    jobs = store.claim_batch("w", limit=size, now=10, ttl=30)
    for job in jobs:
        store.renew(job.tenant, job.key, "w", job.lease_epoch, ttl=30, now=25)
    assert store.finish_many("w", [(job, None) for job in jobs], now=40) == []
    finishes = JobEvent.objects.filter(kind="finish", worker_id="w")
    assert list(finishes.values_list("claimed_at", "created_at")) == [(to_datetime(10), to_datetime(40))] * size


@pytest.mark.django_db
def test_each_job_of_a_batch_has_its_own_epoch_fence_and_claim(store):
    store.enqueue_many(JobSpec("a", f"k{i}") for i in range(5))
    store.claim_next("other", now=10)  # k-something at epoch 1, held by someone else
    jobs = store.claim_batch("w", limit=10, now=10)
    assert len(jobs) == 4
    assert all(job.state == State.LEASED and job.lease_epoch == 1 and job.worker_id == "w" for job in jobs)
    # Each claim is on its job row until its attempt ends (no history row
    # yet): its time is the row's updated_at.
    assert [job.claimed_at for job in Job.objects.filter(worker_id="w", state=State.LEASED)] == [to_datetime(10)] * 4
    assert not JobEvent.objects.filter(worker_id="w").exists()
    # One job's fence moves (recovered and re-claimed elsewhere): finishing
    # the batch writes the others and reports that one, untouched.
    moved = jobs[0]
    Job.objects.filter(pk=moved.pk).update(lease_epoch=7, worker_id="thief")
    lost = store.finish_many("w", [(job, {"ok": job.key}) for job in jobs], now=10)
    assert [job.pk for job in lost] == [moved.pk]
    assert Job.objects.get(pk=moved.pk).state == State.LEASED
    done = Job.objects.filter(pk__in=[job.pk for job in jobs[1:]])
    assert all(job.state == State.DONE and job.result == {"ok": job.key} for job in done)
    assert JobEvent.objects.filter(kind="finish", worker_id="w").count() == 3


@pytest.mark.django_db
@pytest.mark.parametrize("moved_to", [{"lease_epoch": 2}, {"worker_id": "thief"}],
                         ids=["same_worker_newer_epoch", "other_worker_same_epoch"])
def test_finish_many_checks_both_halves_of_each_jobs_fence(store, moved_to):
    store.enqueue_many(JobSpec("a", f"k{i}") for i in range(3))
    jobs = store.claim_batch("w", limit=3, now=10)
    Job.objects.filter(pk=jobs[0].pk).update(**moved_to)
    lost = store.finish_many("w", [(job, {"ok": True}) for job in jobs], now=10)
    assert [job.pk for job in lost] == [jobs[0].pk]
    stale = Job.objects.get(pk=jobs[0].pk)
    assert (stale.state, stale.result) == (State.LEASED, None)
    assert not stale.events.filter(kind="finish").exists()


@pytest.mark.django_db
def test_claim_batch_refuses_a_limit_below_one(store):
    with pytest.raises(ValueError, match="at least 1"):
        store.claim_batch("w", limit=0)


@pytest.mark.django_db
@override_settings(JOBS_TENANT_LEASE_CAP=2)
def test_a_batch_respects_the_lease_cap(store):
    store.enqueue_many(JobSpec("a", f"a{i}") for i in range(10))
    store.enqueue_many(JobSpec("b", f"b{i}") for i in range(10))
    store.claim_next("w0", tenants=["a"])
    tenants = Counter(job.tenant for job in store.claim_batch("w", limit=10))
    assert tenants == {"a": 1, "b": 2}


@pytest.mark.django_db(transaction=True)
def test_run_worker_with_batch_runs_every_outcome_and_writes_each_under_its_fence(store, manage):
    store.enqueue_many(JobSpec(f"t{i % 3}", f"ok-{i}") for i in range(60))
    store.enqueue("t0", "fails", action="test.fail", payload={"kind": "permanent"})
    store.enqueue("t1", "waits", action="test.wait")
    result = manage.run("run_worker", "--batch", "10", "--until-idle", "--worker-id", "batcher", timeout=120)
    assert "claimed=62 done=60" in result.stdout, result.stdout
    assert Job.objects.filter(key__startswith="ok-", state=State.DONE).count() == 60
    assert Job.objects.get(key="waits").state == State.WAITING_EXTERNAL
    assert Job.objects.get(key="fails").state != State.LEASED
    finishes = JobEvent.objects.filter(kind="finish")
    assert finishes.count() == 60 and set(finishes.values_list("epoch", flat=True)) == {1}


@pytest.mark.django_db(transaction=True)
def test_a_batch_worker_killed_mid_batch_loses_nothing_each_job_is_recovered_alone(store, manage):
    store.enqueue_many(JobSpec("t", f"slow-{i}", action="test.sleep", payload={"seconds": 0.3}) for i in range(8))
    # (A 2 s lease: a 1 s one could expire on a loaded machine while the
    # worker is still alive, and be recovered before the kill.)
    worker = manage.start("run_worker", "--batch", "8", "--lease-ttl", "2", "--worker-id", "doomed")
    wait_for(lambda: JobEvent.objects.filter(kind="finish").exists(), timeout=60, what="a first job of the batch")
    worker.send_signal(signal.SIGKILL)
    worker.communicate(timeout=30)
    assert Job.objects.filter(state=State.LEASED, worker_id="doomed").exists()  # the rest of the batch
    wait_for(lambda: not Job.objects.filter(state=State.LEASED, lease_until__gt=Now()).exists(), timeout=60,
             what="the dead worker's leases to expire (by the database's clock)")
    result = manage.run("run_worker", "--until-idle", "--worker-id", "rescuer", "--poll-interval", "0.2",
                        timeout=120)
    assert "recovered=" in result.stdout
    states = sorted(Job.objects.values_list("key", "state", "worker_id", "lease_until"))
    assert Job.objects.filter(state=State.DONE).count() == 8, (states, result.stdout[-3000:])
    recovered = JobEvent.objects.filter(kind="recover")
    # Each job the dead worker still held was taken back on its own.
    assert recovered.count() == recovered.values("job").distinct().count() >= 1
    assert not JobEvent.objects.filter(kind="finish", worker_id="doomed", job__in=recovered.values("job")).exists()


class CountsRenewals(Store):
    def __init__(self):
        super().__init__()
        # The state of each job renewed on its own, as its renewal began.
        self.one_by_one, self.together = [], []

    def renew(self, tenant, key, *args, **kwargs):
        self.one_by_one.append(Job.objects.filter(tenant=tenant, key=key).values_list("state", flat=True).first())
        return super().renew(tenant, key, *args, **kwargs)

    def renew_many(self, worker_id, jobs, **kwargs):
        self.together.append(len(jobs))
        return super().renew_many(worker_id, jobs, **kwargs)


def _run_a_batch_of_sleepers(store, double: Store, jobs: int):
    """A batch of `jobs` that runs for two to three leases' length: each job
    waiting its turn, or done and not yet written, lives on the heartbeat's
    renewals. Returns the worker and the DONE jobs."""
    store.enqueue_many(JobSpec("t", f"slow-{i}", action="test.sleep", payload={"seconds": 0.15})
                       for i in range(jobs))
    worker = Worker(WorkerConfig(worker_id="w", batch=jobs, lease_ttl=0.3, until_idle=True, poll_interval=0.05),
                    store=double)
    worker.run()
    return worker, Job.objects.filter(state=State.DONE)


@pytest.mark.django_db(transaction=True)
def test_a_batch_worker_s_heartbeat_renews_the_leases_it_holds_together_not_one_by_one(store):
    counting = CountsRenewals()
    worker, done = _run_a_batch_of_sleepers(store, counting, 6)
    assert sorted(done.values_list("lease_epoch", "recoveries", "worker_id").distinct()) == [(1, 0, "w")]
    assert done.count() == 6 and worker.stats["lost"] == 0
    # One statement per heartbeat for all the jobs held then, none for a
    # job on its own — but a job whose success the slot wrote between the
    # heartbeat's look at what it holds and that statement: the statement
    # leaves it alone (its fence moved) and `renew` finds why, its own
    # outcome (seen on a loaded CI host, for the two jobs of a write).
    assert set(counting.one_by_one) <= {State.DONE}
    assert len(counting.together) >= 3 and max(counting.together) > 1


class RefusesRenewingTogether(CountsRenewals):
    def renew_many(self, worker_id, jobs, **kwargs):
        self.together.append(len(jobs))
        raise DatabaseError("the statement was refused")


@pytest.mark.django_db(transaction=True)
def test_when_renewing_together_fails_the_heartbeat_says_so_and_renews_each_lease_on_its_own(store, caplog):
    refusing = RefusesRenewingTogether()
    _, done = _run_a_batch_of_sleepers(store, refusing, 4)
    assert sorted(done.values_list("lease_epoch", "recoveries").distinct()) == [(1, 0)] and done.count() == 4
    assert refusing.together and len(refusing.one_by_one) >= len(refusing.together)
    failed = [r.fields for r in caplog.records if getattr(r, "fields", {}).get("event") == "worker.renew_failed"]
    assert len(failed) == len(refusing.together)
    assert "the statement was refused" in failed[0]["error"] and failed[0]["jobs"] == refusing.together[0]


# ---------------------------------------------------------------- finish and claim in one step


@pytest.mark.django_db
@pytest.mark.parametrize("moved_to", [{"lease_epoch": 2}, {"worker_id": "thief"}],
                         ids=["same_worker_newer_epoch", "other_worker_same_epoch"])
def test_finish_and_claim_writes_each_fenced_finish_and_claims_the_next(store, moved_to):
    store.enqueue_many(JobSpec("a", f"k{i}") for i in range(5))
    jobs = store.claim_batch("w", limit=3, now=10)
    Job.objects.filter(pk=jobs[0].pk).update(**moved_to)
    claimed, lost = store.finish_and_claim("w", [(job, {"ok": job.key}) for job in jobs], limit=2, now=11)
    assert [job.pk for job in lost] == [jobs[0].pk]
    stale = Job.objects.get(pk=jobs[0].pk)
    assert (stale.state, stale.result) == (State.LEASED, None)
    assert not stale.events.filter(kind="finish").exists()
    for job in jobs[1:]:
        done = Job.objects.get(pk=job.pk)
        assert (done.state, done.result) == (State.DONE, {"ok": job.key})
        # The attempt's one row, carrying its claim.
        assert done.events.filter(kind="finish", epoch=job.lease_epoch, worker_id="w",
                                  claimed_at=job.claimed_at).count() == 1
    # The two jobs left were claimed, each with its own claim on its row.
    assert sorted(job.key for job in claimed) == ["k3", "k4"]
    assert all(Job.objects.get(pk=job.pk).state == State.LEASED and Job.objects.get(pk=job.pk).claimed_at
               for job in claimed)


@pytest.mark.django_db
def test_finish_and_claim_with_nothing_left_still_writes_the_finishes(store):
    store.enqueue("a", "only")
    job = store.claim_next("w", now=10)
    claimed, lost = store.finish_and_claim("w", [(job, None)], limit=1, now=11)
    assert (claimed, lost) == ([], [])
    assert Job.objects.get(pk=job.pk).state == State.DONE


@pytest.mark.django_db
def test_finish_and_claim_refuses_a_result_that_is_not_json_and_writes_nothing(store):
    store.enqueue_many(JobSpec("a", f"k{i}") for i in range(2))
    job = store.claim_next("w", now=10)
    with pytest.raises(ValueError, match="result"):
        store.finish_and_claim("w", [(job, {"x": float("nan")})], limit=1, now=11)
    assert Job.objects.get(pk=job.pk).state == State.LEASED
    assert Job.objects.filter(state=State.READY).count() == 1


@pytest.mark.django_db
@override_settings(JOBS_TENANT_LEASE_CAP=1)
def test_finish_and_claim_under_a_lease_cap_frees_the_slot_before_claiming(store):
    # The capped claim's statements do not count the jobs being finished
    # (the second writes them), so the tenant's slot is free for the next.
    store.enqueue_many(JobSpec("a", f"k{i}") for i in range(2))
    job = store.claim_next("w", now=10)
    assert store.claim_next("w2", now=10) is None  # at its cap
    claimed, lost = store.finish_and_claim("w", [(job, None)], limit=1, now=11)
    assert lost == [] and [j.key for j in claimed] == ["k1"]


# ---------------------------------------------------------------- the jobs a claim returns


def _fields(job: Job) -> dict:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


@pytest.mark.django_db
def test_a_claimed_job_is_the_model_the_orm_loads_and_saves_as_an_update(store):
    store.enqueue("t", "k", payload={"n": [1, "two"]}, priority=3)
    [job] = store.claim_batch("w", limit=1)
    loaded = Job.objects.get(pk=job.pk)
    assert _fields(job) == _fields(loaded)
    # Timestamps in the same zone object the ORM gives (a claim reads them
    # with psycopg's compiled loader on PostgreSQL, then puts them in it).
    stamps = [f.attname for f in Job._meta.concrete_fields if f.get_internal_type() == "DateTimeField"]
    assert job.created_at is not None and job.lease_until is not None
    assert [repr(getattr(job, name)) for name in stamps] == [repr(getattr(loaded, name)) for name in stamps]
    assert (job._state.adding, job._state.db) == (False, loaded._state.db)
    assert job.payload == {"n": [1, "two"]} and job.lease_epoch == 1 and job.worker_id == "w"
    job.last_error = "noted"
    job.save(update_fields=["last_error"])  # an UPDATE of the row, not an INSERT
    assert Job.objects.get(pk=job.pk).last_error == "noted" and Job.objects.count() == 1


@pytest.mark.django_db
def test_an_init_signal_receiver_sees_the_jobs_a_claim_builds(store):
    from django.db.models.signals import post_init

    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.key)

    store.enqueue_many([JobSpec("t", "a"), JobSpec("t", "b")])
    post_init.connect(receiver, sender=Job)
    try:
        claimed = store.claim_batch("w", limit=2)
    finally:
        post_init.disconnect(receiver, sender=Job)
    assert sorted(seen) == sorted(job.key for job in claimed) == ["a", "b"]
