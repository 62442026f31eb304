"""Concurrent enqueues of the same keys on PostgreSQL take their locks in one
order — the search rows (`jobsearch_unique_tenant_key`) first, in (tenant,
key) order, then the jobs and, through their trigger, the tenant's ready row —
so two callers racing for the same keys wait for each other, never deadlock,
and the loser of a race gets the winner's job."""

import threading

import pytest
from jobs.models import Job, JobSearch
from jobs.store import JobSpec
from tests.support import held_open, in_thread, wait_for, waiting_on_locks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def keys_held(tenant: str, keys: list[str], *, until_waiting: int):
    """Another transaction holds the search rows of `keys` (inserted, not
    committed) until `until_waiting` backends wait on them, then rolls back:
    every waiter wakes at the same moment and the race is run."""
    def hold():
        for n, key in enumerate(keys):
            JobSearch.objects.create(job_id=-1 - n, tenant=tenant, key=key)

    return held_open(hold, until_waiting=until_waiting, rollback=True)


def test_two_bulk_enqueues_of_the_same_keys_in_opposite_orders_both_end_without_deadlock(store):
    keys = ["k1", "k2"]
    # k1 held: the forward enqueue waits on it first, holding nothing; the
    # backward one takes k2, then waits on k1 behind it.
    with keys_held("t", ["k1"], until_waiting=2):
        forward = in_thread(lambda: store.enqueue_many([JobSpec("t", k) for k in keys]))
        wait_for(lambda: waiting_on_locks() >= 1, what="the forward enqueue to wait on k1")
        backward = in_thread(lambda: store.enqueue_many([JobSpec("t", k) for k in reversed(keys)]))
    for thread, _ in (forward, backward):
        thread.join(60)

    outcomes = [outcome for _, outcome in (forward, backward)]
    assert [o.get("error") for o in outcomes] == [None, None]
    assert sorted(o["result"] for o in outcomes) in ([0, 2], [1, 1])
    assert sorted(Job.objects.values_list("key", flat=True)) == keys
    assert JobSearch.objects.count() == 2


def test_a_single_and_a_bulk_enqueue_of_one_key_racing_give_one_job_and_the_loser_gets_it(store):
    # A tenant without READY work: the job's insert adds the tenant's ready
    # row, which the other enqueue's job must wait for as well.
    for round_ in range(6):
        tenant = f"fresh-{round_}"
        with keys_held(tenant, ["k"], until_waiting=2):
            single = in_thread(lambda t=tenant: store.enqueue_once(t, "k", payload={"by": "once"}))
            bulk = in_thread(lambda t=tenant: store.enqueue_many([JobSpec(t, "a"), JobSpec(t, "k"),
                                                                  JobSpec(t, "z")]))
        for thread, _ in (single, bulk):
            thread.join(60)
        assert single[1].get("error") is None and bulk[1].get("error") is None, (single[1], bulk[1])
        job, created = single[1]["result"]
        winner = Job.objects.get(tenant=tenant, key="k")
        assert job.pk == winner.pk
        assert created == (winner.payload == {"by": "once"})
        assert bulk[1]["result"] == (2 if created else 3)
        assert sorted(Job.objects.filter(tenant=tenant).values_list("key", flat=True)) == ["a", "k", "z"]


def test_many_threads_enqueueing_overlapping_keys_in_any_order_create_each_job_once(store):
    keys = [f"k{i}" for i in range(8)]
    orders = [keys, keys[::-1], keys[3:] + keys[:3], keys[::2] + keys[1::2]]
    barrier = threading.Barrier(6)

    def bulk(order):
        barrier.wait(30)
        return store.enqueue_many([JobSpec("race", k) for k in order])

    def single(key):
        barrier.wait(30)
        job, created = store.enqueue_once("race", key)
        return job.pk, created

    racers = [in_thread(lambda o=o: bulk(o)) for o in orders] + [in_thread(lambda: single("k5")),
                                                                 in_thread(lambda: single("k0"))]
    for thread, _ in racers:
        thread.join(60)
    assert [o.get("error") for _, o in racers] == [None] * 6
    singles = [racers[4][1]["result"], racers[5][1]["result"]]
    assert sum(o["result"] for _, o in racers[:4]) + sum(created for _, created in singles) == len(keys)
    assert sorted(Job.objects.filter(tenant="race").values_list("key", flat=True)) == sorted(keys)
    by_key = dict(Job.objects.filter(tenant="race").values_list("key", "pk"))
    assert [pk for pk, _ in singles] == [by_key["k5"], by_key["k0"]]
