"""A job's timeline tells what happened in the order it happened: a claim
that had to wait for the approval releasing the job is listed after it."""

import pytest

from console.timeline import timeline_page
from jobs import store as store_module
from jobs.store import Store

from .test_review_policy import approve, proposed

pytestmark = pytest.mark.django_db


def test_a_claim_that_waited_for_the_approval_is_listed_after_it(people, monkeypatch):
    job = proposed()
    real = store_module._atomic_unless_postgres

    def approval_holds_the_lock_meanwhile():
        # The worker has begun its claim and is about to take the write
        # lock; the reviewer's approval holds it first and commits.
        approve(job, people["reviewer"])
        return real()

    monkeypatch.setattr(store_module, "_atomic_unless_postgres", approval_holds_the_lock_meanwhile)
    store = Store()
    claimed = store.claim_next("w1", actions=["connectors.send_email"], ttl=60)
    monkeypatch.setattr(store_module, "_atomic_unless_postgres", real)
    assert claimed is not None and claimed.pk == job.pk
    store.finish(job.tenant, job.key, "w1", claimed.lease_epoch)

    entries, _ = timeline_page(job)
    titles = [e.title for e in entries]  # newest first
    claim = next(i for i, t in enumerate(titles) if t.startswith("claim:"))
    approval = next(i for i, t in enumerate(titles) if t.startswith("approve:"))
    assert claim < approval, titles
    assert entries[claim].at >= entries[approval].at
