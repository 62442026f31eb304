"""Store behaviour on a real database (SQLite or PostgreSQL)."""

import pytest

from jobs import interventions
from jobs.clock import to_datetime as at
from jobs.errors import Conflict, InvalidTransition, JobNotFound
from jobs.models import Job, JobEvent, JobSearch
from jobs.store import JobSpec

pytestmark = pytest.mark.django_db


def snapshot(tenant="studio", key="q-1"):
    job = Job.objects.get(tenant=tenant, key=key)
    row = {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields if f.attname != "updated_at"}
    return row, JobEvent.objects.filter(job=job).count()


def test_enqueue_twice_yields_one_job_and_one_history_row(store):
    first = store.enqueue("studio", "q-1", payload={"n": 1})
    second = store.enqueue("studio", "q-1", payload={"n": 2})
    assert first.pk == second.pk
    assert Job.objects.filter(tenant="studio", key="q-1").count() == 1
    assert second.payload == {"n": 1}
    assert JobEvent.objects.filter(job=first, kind="enqueue").count() == 1


def test_same_key_in_two_tenants_is_two_jobs(store):
    store.enqueue("studio", "q-1")
    store.enqueue("bakery", "q-1")
    assert Job.objects.filter(key="q-1").count() == 2


def test_enqueue_many_creates_only_new_keys(store):
    store.enqueue("studio", "k-0")
    created = store.enqueue_many([JobSpec("studio", f"k-{i}", payload={"i": i}) for i in range(50)])
    assert created == 49
    assert Job.objects.filter(tenant="studio").count() == 50
    assert Job.objects.get(key="k-7").payload == {"i": 7}
    assert JobEvent.objects.filter(kind="enqueue").count() == 50


def test_enqueue_many_keeps_the_first_of_a_key_given_twice_and_numbers_jobs_in_the_order_given(store):
    specs = [JobSpec("studio", "b", payload={"n": 1}), JobSpec("studio", "a", payload={"n": 2}),
             JobSpec("studio", "b", payload={"n": 3}), JobSpec("bakery", "b", payload={"n": 4}),
             JobSpec("studio", "c", payload={"n": 5})]
    assert store.enqueue_many(specs) == 4
    jobs = list(Job.objects.order_by("id").values_list("tenant", "key", "payload"))
    assert jobs == [("studio", "b", {"n": 1}), ("studio", "a", {"n": 2}), ("bakery", "b", {"n": 4}),
                    ("studio", "c", {"n": 5})]
    # Each job has its one search row (the key's uniqueness) and one creation event.
    assert sorted(JobSearch.objects.values_list("job_id", "tenant", "key")) == sorted(
        Job.objects.values_list("id", "tenant", "key"))
    assert JobEvent.objects.filter(kind="enqueue").count() == 4
    assert store.enqueue_many(specs) == 0
    assert Job.objects.count() == 4


def test_enqueue_many_over_several_chunks_of_one_transaction_takes_each_chunk_once(store, monkeypatch):
    """Chunks of one caller's transaction: each chunk's jobs are its own
    (PostgreSQL copies a chunk into a session table the statement empties),
    a key repeated in a later chunk or already there is left alone, and the
    ids follow the order given across chunks."""
    from django.db import transaction

    import jobs.store

    monkeypatch.setattr(jobs.store, "_ENQUEUE_CHUNK", 3)
    store.enqueue("studio", "k-4")
    keys = ["k-1", "k-2", "k-3", "k-2", "k-4", "k-5", "k-1", "k-6"]
    with transaction.atomic():
        assert store.enqueue_many([JobSpec("studio", key, payload={"at": n}) for n, key in enumerate(keys)],
                                  actor="agent:bulk") == 5
        assert store.enqueue_many([JobSpec("studio", "k-7")]) == 1
    made = list(Job.objects.exclude(key="k-4").order_by("id").values_list("key", "payload", "proposed_by"))
    assert made == [("k-1", {"at": 0}, "agent:bulk"), ("k-2", {"at": 1}, "agent:bulk"),
                    ("k-3", {"at": 2}, "agent:bulk"), ("k-5", {"at": 5}, "agent:bulk"),
                    ("k-6", {"at": 7}, "agent:bulk"), ("k-7", {}, "")]
    assert sorted(JobSearch.objects.values_list("job_id", "key")) == sorted(Job.objects.values_list("id", "key"))
    events = JobEvent.objects.filter(kind="enqueue")
    assert sorted(events.values_list("job__key", "actor", "to_state")) == sorted(
        [(key, "agent:bulk", "READY") for key in ("k-1", "k-2", "k-3", "k-5", "k-6")]
        + [("k-4", "", "READY"), ("k-7", "", "READY")])


def test_a_key_is_found_through_its_search_row(store):
    job = store.enqueue("studio", "q-1")
    assert Job.objects.by_key("studio", "q-1").get() == job
    assert not Job.objects.by_key("bakery", "q-1").exists()
    assert list(Job.objects.by_keys("studio", ["q-1", "q-2"])) == [job]
    # The search row is the business key: without it there is no job of that key.
    JobSearch.objects.filter(job_id=job.pk).delete()
    assert not Job.objects.by_key("studio", "q-1").exists()


def test_a_job_deleted_through_the_orm_frees_its_key(store):
    first = store.enqueue("studio", "q-1")
    JobEvent.objects.filter(job_id=first.pk).delete()
    Job.objects.filter(pk=first.pk).delete()
    assert not JobSearch.objects.filter(job_id=first.pk).exists()
    again, created = store.enqueue_once("studio", "q-1")
    assert created and again.pk != first.pk


def test_job_without_run_at_is_eligible_whatever_clock_a_claim_passes(store):
    store.enqueue("studio", "q-1")
    assert store.claim("studio", "q-1", "w", now=5) == 1


def test_job_with_run_at_waits_until_then(store):
    store.enqueue("studio", "q-1", run_at=200)
    assert store.claim("studio", "q-1", "w", now=199) is None
    assert store.claim_next("w", now=199) is None
    assert store.claim("studio", "q-1", "w", now=200) == 1


def test_claim_next_orders_by_priority_then_due_time_then_id(store):
    store.enqueue("studio", "late", run_at=50)
    store.enqueue("studio", "plain-1")
    store.enqueue("studio", "urgent", priority=9)
    store.enqueue("studio", "plain-2")
    order = [store.claim_next("w", now=100).key for _ in range(4)]
    assert order == ["urgent", "plain-1", "plain-2", "late"]
    assert store.claim_next("w", now=100) is None


def test_claim_next_filters_by_tenant_and_action(store):
    store.enqueue("studio", "a", action="jobs.noop")
    store.enqueue("bakery", "b", action="other.thing")
    assert store.claim_next("w", tenants=["bakery"], actions=["jobs.noop"], now=1) is None
    job = store.claim_next("w", tenants=["bakery"], actions=["other.thing"], now=1)
    assert (job.tenant, job.key, job.state, job.lease_epoch, job.worker_id) == ("bakery", "b", "LEASED", 1, "w")


def test_claim_counts_the_attempt_and_remembers_the_first(store):
    store.enqueue("studio", "q-1")
    job = store.claim_next("w", now=100)
    assert job.attempts == 1
    store.fail("studio", "q-1", "w", 1, error="timeout", now=101)
    Job.objects.filter(key="q-1").update(next_attempt_at=None)
    again = store.claim_next("w", now=500)
    assert again.attempts == 2
    assert again.first_attempt_at.timestamp() == 100


# Both halves of the fence, for every write: tests/jobs/test_fence.py.


def test_writes_after_recovery_are_fenced_out_even_before_a_new_claim(store):
    store.enqueue("studio", "q-1")
    epoch = store.claim("studio", "q-1", "worker-a", now=100, ttl=30)
    store.recover_expired(now=200)
    assert Job.objects.get(key="q-1").state == "READY"
    with pytest.raises(Conflict):
        store.finish("studio", "q-1", "worker-a", epoch, now=201)


def test_unknown_job_is_not_found(store):
    with pytest.raises(JobNotFound):
        store.finish("studio", "nope", "w", 1)
    with pytest.raises(JobNotFound):
        store.resume("studio", "nope", reason="x")


def test_renew_extends_the_lease_so_it_cannot_be_taken_over(store):
    store.enqueue("studio", "q-1")
    epoch = store.claim("studio", "q-1", "worker-a", now=100, ttl=30)
    store.renew("studio", "q-1", "worker-a", epoch, ttl=30, now=125)
    assert store.claim("studio", "q-1", "worker-b", now=140) is None
    assert store.claim("studio", "q-1", "worker-b", now=156) == epoch + 1


def test_renew_many_extends_each_lease_held_under_its_fence_and_no_other(store, monkeypatch):
    monkeypatch.setattr("jobs.store.RENEW_CHUNK", 2)  # PostgreSQL: three statements for the five jobs below
    for key in ("held-1", "held-2", "held-3", "finished", "claimed-again", "other-worker"):
        store.enqueue("studio", key)
    for key in ("held-1", "held-2", "held-3", "finished", "claimed-again"):
        store.claim("studio", key, "worker-a", now=100, ttl=30)
    store.claim("studio", "other-worker", "worker-b", now=100, ttl=30)
    as_claimed = {job.key: job for job in Job.objects.filter(tenant="studio")}
    store.finish("studio", "finished", "worker-a", as_claimed["finished"].lease_epoch, now=110)
    # worker-a's lease ran out and worker-a claimed the job again: its copy
    # as first claimed holds epoch 1, a lease that no longer exists.
    assert store.claim("studio", "claimed-again", "worker-a", now=131, ttl=30) == 2
    before = {key: snapshot(key=key) for key in ("finished", "claimed-again", "other-worker")}

    renewed = store.renew_many("worker-a", list(as_claimed.values()), ttl=30, now=125)

    assert renewed == {as_claimed[key].id for key in ("held-1", "held-2", "held-3")}
    leases = dict(Job.objects.filter(tenant="studio").values_list("key", "lease_until"))
    assert {key: leases[key] for key in ("held-1", "held-2", "held-3")} == dict.fromkeys(("held-1", "held-2",
                                                                                         "held-3"), at(155))
    # Another epoch, another worker, a finished attempt: not a lease held
    # under those fences, untouched (and no history row for anyone).
    assert {key: snapshot(key=key) for key in before} == before
    assert not JobEvent.objects.filter(kind="renew").exists()
    assert store.renew_many("worker-a", [], ttl=30, now=125) == set()


def test_a_renewal_keeps_the_claim_s_time_which_the_attempt_s_row_records(store):
    store.enqueue("studio", "q-1")
    epoch = store.claim("studio", "q-1", "worker-a", now=100, ttl=30)
    store.renew("studio", "q-1", "worker-a", epoch, ttl=30, now=125)
    job = Job.objects.get(key="q-1")
    # A LEASED row's updated_at is its claim's time: the renewal moved the lease only.
    assert (job.claimed_at, job.updated_at, job.lease_until) == (at(100), at(100), at(155))
    store.finish("studio", "q-1", "worker-a", epoch, now=140)
    finish = JobEvent.objects.get(job=job, kind="finish")
    assert (finish.claimed_at, finish.created_at, finish.epoch) == (at(100), at(140), epoch)
    # Finished, the row is no attempt's any more; its last claim is in the history.
    assert Job.objects.get(key="q-1").claimed_at is None


def test_wait_persists_the_condition_and_resume_makes_it_ready(store):
    store.enqueue("studio", "q-1")
    epoch = store.claim("studio", "q-1", "w", now=100)
    store.wait("studio", "q-1", "w", epoch, reason="customer reply", now=101)
    job = Job.objects.get(key="q-1")
    assert (job.state, job.wait_reason, job.lease_until) == ("WAITING_EXTERNAL", "customer reply", None)
    assert store.claim_next("w2", now=10_000) is None
    store.resume("studio", "q-1", reason="reply received", actor="inbound", now=102)
    assert store.claim_next("w2", now=103).key == "q-1"


def test_wait_for_review_and_wake_up_time(store):
    store.enqueue("studio", "q-1")
    epoch = store.claim("studio", "q-1", "w", now=100)
    store.wait("studio", "q-1", "w", epoch, state="WAITING_REVIEW", reason="check terms", wake_at=300, now=101)
    assert store.wake_due(now=299) == 0
    assert store.wake_due(now=300) == 1
    assert Job.objects.get(key="q-1").state == "READY"


def test_wait_into_a_non_waiting_state_is_invalid_and_writes_nothing(store):
    store.enqueue("studio", "q-1")
    epoch = store.claim("studio", "q-1", "w", now=100)
    before = snapshot()
    with pytest.raises(InvalidTransition):
        store.wait("studio", "q-1", "w", epoch, state="DONE", reason="x", now=101)
    assert snapshot() == before


def test_resume_of_a_job_that_is_not_waiting_is_invalid_and_writes_nothing(store):
    store.enqueue("studio", "q-1")
    before = snapshot()
    with pytest.raises(InvalidTransition):
        store.resume("studio", "q-1", reason="stray reply")
    assert snapshot() == before


def test_transient_failure_retries_later_with_the_error_recorded(store):
    store.enqueue("studio", "q-1")
    epoch = store.claim("studio", "q-1", "w", now=100)
    decision = store.fail("studio", "q-1", "w", epoch, error="provider timeout", now=101)
    job = Job.objects.get(key="q-1")
    assert job.state == "READY"
    assert "provider timeout" in job.last_error
    assert 0 <= job.next_attempt_at.timestamp() - 101 <= decision.delay + 1e-3
    assert job.events.last().kind == "fail"


def test_permanent_failure_goes_to_review_with_its_reason(store):
    store.enqueue("studio", "q-1")
    epoch = store.claim("studio", "q-1", "w", now=100)
    store.fail("studio", "q-1", "w", epoch, error="recipient has no @", failure="permanent", now=101)
    job = Job.objects.get(key="q-1")
    assert job.state == "WAITING_REVIEW"
    assert "recipient has no @" in job.wait_reason


def test_exhausted_attempts_need_attention(store):
    store.enqueue("studio", "q-1", max_attempts=2)
    for attempt, now in ((1, 100), (2, 1000)):
        Job.objects.filter(key="q-1").update(next_attempt_at=None)
        epoch = store.claim("studio", "q-1", "w", now=now)
        store.fail("studio", "q-1", "w", epoch, error=f"boom {attempt}", now=now + 1)
    job = Job.objects.get(key="q-1")
    assert job.state == "NEEDS_ATTENTION"
    assert "gave up after 2 attempts" in job.last_error


def test_recover_expired_is_bounded(store):
    store.enqueue_many([JobSpec("studio", f"k-{i}") for i in range(25)])
    for _ in range(25):
        store.claim_next("w", now=100, ttl=10)
    recovered = store.recover_expired(limit=10, now=200)
    assert len(recovered) == 10
    assert Job.objects.filter(state="READY").count() == 10
    assert Job.objects.filter(state="LEASED").count() == 15


def test_recover_does_not_touch_live_leases(store):
    store.enqueue("studio", "q-1")
    store.claim("studio", "q-1", "w", now=100, ttl=30)
    assert store.recover_expired(now=129) == []
    assert Job.objects.get(key="q-1").state == "LEASED"


def test_recover_sends_jobs_past_max_attempts_to_attention(store):
    store.enqueue("studio", "spent", max_attempts=1)
    store.enqueue("studio", "fresh", max_attempts=3)
    store.claim("studio", "spent", "w", now=100, ttl=10)
    store.claim("studio", "fresh", "w", now=100, ttl=10)
    outcome = {r.key: r.to_state for r in store.recover_expired(now=200)}
    assert outcome == {"spent": "NEEDS_ATTENTION", "fresh": "READY"}
    assert "did not renew" in Job.objects.get(key="spent").last_error


def test_operator_retry_resolve_and_cancel(store):
    store.enqueue("studio", "q-1", max_attempts=1)
    epoch = store.claim("studio", "q-1", "w", now=100)
    store.fail("studio", "q-1", "w", epoch, error="auth", failure="auth", now=101)
    interventions.job_retry(tenant="studio", key="q-1", reason="key rotated", actor="ops@example.com")
    job = Job.objects.get(key="q-1")
    assert (job.state, job.attempts) == ("READY", 0)
    interventions.job_cancel(tenant="studio", key="q-1", reason="customer withdrew", actor="ops@example.com")
    with pytest.raises(InvalidTransition):
        interventions.job_resolve(tenant="studio", key="q-1", reason="late", actor="ops@example.com")
    events = list(Job.objects.get(key="q-1").events.values_list("kind", "actor"))
    assert events[-2:] == [("retry", "ops@example.com"), ("cancel", "ops@example.com")]


def test_finish_stores_the_result(store):
    store.enqueue("studio", "q-1")
    epoch = store.claim("studio", "q-1", "w", now=100)
    store.finish("studio", "q-1", "w", epoch, result={"sent": True}, now=101)
    job = Job.objects.get(key="q-1")
    assert (job.state, job.result, job.lease_until) == ("DONE", {"sent": True}, None)
    assert job.finished_at.timestamp() == 101


def test_fail_with_classifies_the_handlers_exception_and_honours_a_providers_ceiling(store):
    from jobs.errors import TransientError

    store.enqueue("studio", "q-1", max_attempts=50)
    Job.objects.filter(key="q-1").update(attempts=20)  # the policy's own cap (300 s) would allow minutes
    epoch = store.claim("studio", "q-1", "w", now=100)
    decision = store.fail_with("studio", "q-1", "w", epoch, TransientError("HTTP 503", ceiling=2.0), now=101)
    job = Job.objects.get(key="q-1")
    assert job.state == "READY" and decision.delay <= 2.0
    assert job.next_attempt_at.timestamp() <= 103
    assert "TransientError: HTTP 503" in job.last_error


def test_a_worker_s_rows_about_its_own_attempt_name_it_once_and_others_name_who_acted(store):
    """Every attempt's row carried its worker's id twice (worker_id and
    actor). A worker's own finish, batch finish, wait, failure and release
    leave `actor` empty; a takeover, a recovery and a person keep theirs.
    `by` reads who it was either way."""
    for key in ("one", "batched", "waits", "fails", "released", "taken", "recovered"):
        store.enqueue("studio", key)
    epoch = {key: store.claim("studio", key, "w-1", now=100, ttl=30)
             for key in ("one", "batched", "waits", "fails", "released", "recovered")}
    store.finish("studio", "one", "w-1", epoch["one"], now=101)
    store.finish_many("w-1", [(Job.objects.get(key="batched"), {"n": 1})], now=101)
    store.wait("studio", "waits", "w-1", epoch["waits"], reason="a reply", now=101)
    store.fail("studio", "fails", "w-1", epoch["fails"], error="boom", now=101)
    store.release("studio", "released", "w-1", epoch["released"], reason="stopping", now=101)
    store.claim("studio", "taken", "w-1", now=100, ttl=30)
    store.claim("studio", "taken", "w-2", now=140, ttl=600)
    store.recover_expired(now=200)
    store.resume("studio", "waits", reason="reply received", actor="inbound:sim", now=210)

    def ended(key):
        return JobEvent.objects.filter(job__key=key).exclude(kind="enqueue").values_list(
            "kind", "worker_id", "actor")[0]

    assert {key: ended(key) for key in ("one", "batched", "waits", "fails", "released", "taken", "recovered")} == {
        "one": ("finish", "w-1", ""),
        "batched": ("finish", "w-1", ""),
        "waits": ("wait", "w-1", ""),
        "fails": ("fail", "w-1", ""),
        "released": ("release", "w-1", ""),
        "taken": ("takeover", "w-1", "w-2"),
        "recovered": ("recover", "w-1", "recovery"),
    }
    resumed = JobEvent.objects.get(job__key="waits", kind="resume")
    assert (resumed.actor, resumed.by) == ("inbound:sim", "inbound:sim")
    assert [e.by for e in JobEvent.objects.filter(job__key="taken").order_by("id")] == ["", "w-2"]
    assert JobEvent.objects.get(job__key="one", kind="finish").by == "w-1"
