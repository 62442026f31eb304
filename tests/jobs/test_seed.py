"""The contract from the seed (DESIGN §4), verbatim, on whichever database runs."""

import pytest


@pytest.mark.django_db
def test_seed_snippet_runs_unchanged():
    from jobs.store import Store, Conflict

    store = Store()
    store.enqueue("studio", "send-quote-017")
    epoch_a = store.claim("studio", "send-quote-017", "worker-a", now=100, ttl=30)
    assert epoch_a == 1
    assert store.claim("studio", "send-quote-017", "worker-b", now=110) is None
    epoch_b = store.claim("studio", "send-quote-017", "worker-b", now=131)
    assert epoch_b == 2
    try:
        store.finish("studio", "send-quote-017", "worker-a", epoch_a, now=132)
        raise AssertionError("old worker should have been fenced out")
    except Conflict:
        pass
    store.finish("studio", "send-quote-017", "worker-b", epoch_b, now=132)


@pytest.mark.django_db
def test_seed_history_shows_each_attempt_once_with_its_claim_and_how_it_ended():
    from jobs.models import Job
    from jobs.store import Conflict, Store

    store = Store()
    store.enqueue("studio", "send-quote-017")
    store.claim("studio", "send-quote-017", "worker-a", now=100, ttl=30)
    store.claim("studio", "send-quote-017", "worker-b", now=131)
    with pytest.raises(Conflict):
        store.finish("studio", "send-quote-017", "worker-a", 1, now=132)
    store.finish("studio", "send-quote-017", "worker-b", 2, now=132)

    job = Job.objects.get(tenant="studio", key="send-quote-017")
    assert job.state == "DONE"
    # One row per attempt, written when it ended, with the claim it began
    # with: worker-a's attempt (claimed at 100) ended by worker-b's takeover,
    # worker-b's (claimed at 131) by its finish.
    assert [(e.kind, e.to_state, e.epoch, e.worker_id, e.actor, e.claimed_at and e.claimed_at.timestamp())
            for e in job.events.all()] == [
        ("enqueue", "READY", 0, "", "", None),
        ("takeover", "LEASED", 1, "worker-a", "worker-b", 100),
        ("finish", "DONE", 2, "worker-b", "", 131),
    ]
    assert [e.by for e in job.events.all()] == ["", "worker-b", "worker-b"]
    # Finished, the job row keeps the last worker; the claim's time is in
    # the attempt's row only (`Job.claimed_at` is a LEASED row's).
    assert job.claimed_at is None and job.worker_id == "worker-b"
