"""A worker's finish (one statement on PostgreSQL, `jobs.claim`) takes no row
lock of its own: its update tests the fence (LEASED, the epoch it claimed,
its worker) on the row. When another transaction moves the fence first (a
recovery of the lease, here held open until the finish is seen waiting on
its lock), PostgreSQL tests the condition again on the newest version and
the finish writes nothing: the job is the recovery's."""

import time

import pytest

from jobs.models import Job, JobEvent
from jobs.states import State
from tests.support import held_open, in_thread

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("together", [False, True], ids=["finish_many", "finish_and_claim"])
def test_a_finish_that_waited_on_a_recovery_writes_nothing(store, together):
    store.enqueue("t1", "k1")
    store.enqueue("t1", "k2")
    [job] = store.claim_batch("w1", limit=1, ttl=30)

    def finish():
        if together:
            return store.finish_and_claim("w1", [(job, {"ok": True})], limit=1)[1]
        return store.finish_many("w1", [(job, {"ok": True})])

    # The recovery holds the row (the lease taken back, not yet committed)
    # until the finish waits on it, then commits.
    with held_open(lambda: store.recover_expired(now=time.time() + 3600)) as held:
        thread, outcome = in_thread(finish)
    thread.join(30)

    assert [r.key for r in held["result"]] == [job.key]
    assert "error" not in outcome, outcome.get("error")
    assert [lost.id for lost in outcome["result"]] == [job.id]
    row = Job.objects.get(pk=job.id)
    assert (row.state, row.finished_at, row.result) == (State.READY, None, None)
    assert not JobEvent.objects.filter(job_id=job.id, kind="finish").exists()
