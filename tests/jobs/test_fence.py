"""The fence has two halves — the lease epoch and the worker id — and each
must hold on its own (DESIGN §4).

Production meets "same worker id, old epoch": the slots of one worker process
share its id (`jobs/worker.py`), so when a slot's lease expires and another
slot of the same process takes the job over, only the epoch tells the two
apart. "Other worker id, current epoch" is a write from a process that never
held this lease. Both must raise `Conflict` and change nothing, for every
write a worker makes: the job's own (renew, finish, wait, fail, release),
writes to other rows under `under_fence`, and the operation records of
`operations.protocol`.
"""

from datetime import UTC, datetime

import pytest

from connectors.base import ProviderAccepted, ProviderOutcomeUnknown
from jobs.actions import JobContext
from jobs.errors import Conflict
from jobs.models import Job, JobEvent
from operations import protocol
from operations.models import Operation, OperationEvent, Receipt
from tests.operations.support import EMAIL, SEND_EMAIL

pytestmark = pytest.mark.django_db

TENANT, KEY = "studio", "q-1"
HOLDER, OTHER = "host:4242:slot-shared", "host:9999:elsewhere"
# The two halves: (worker id, epoch) relative to the current holder's fence.
HALVES = {
    "same_worker_old_epoch": lambda epoch: (HOLDER, epoch - 1),
    "other_worker_current_epoch": lambda epoch: (OTHER, epoch),
}


def taken_over_by_the_same_worker(store) -> int:
    """HOLDER claimed the job at epoch 1, its lease expired, and another slot
    of the same process (same worker id) took it over at epoch 2."""
    store.enqueue(TENANT, KEY)
    first = store.claim(TENANT, KEY, HOLDER, now=100, ttl=30)
    current = store.claim(TENANT, KEY, HOLDER, now=131, ttl=30)
    assert (first, current) == (1, 2)
    return current


def everything():
    """The job's row and every history row the fence protects."""
    job = Job.objects.get(tenant=TENANT, key=KEY)
    row = {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}
    return (
        row,
        list(JobEvent.objects.values_list("id", "kind", "epoch", "worker_id").order_by("id")),
        list(Operation.objects.values_list("id", "state", "attempts", "last_error", "updated_at").order_by("id")),
        list(OperationEvent.objects.values_list("id", "kind").order_by("id")),
        list(Receipt.objects.values_list("id", flat=True)),
    )


WRITES = {
    "renew": lambda s, w, e: s.renew(TENANT, KEY, w, e, ttl=30, now=140),
    "finish": lambda s, w, e: s.finish(TENANT, KEY, w, e, result={"sent": True}, now=140),
    "wait_external": lambda s, w, e: s.wait(TENANT, KEY, w, e, reason="reply", now=140),
    "wait_review": lambda s, w, e: s.wait(TENANT, KEY, w, e, state="WAITING_REVIEW", reason="check", now=140),
    "fail_transient": lambda s, w, e: s.fail(TENANT, KEY, w, e, error="boom", now=140),
    "fail_permanent": lambda s, w, e: s.fail(TENANT, KEY, w, e, error="bad", failure="permanent", now=140),
    "fail_with": lambda s, w, e: s.fail_with(TENANT, KEY, w, e, RuntimeError("boom"), now=140),
    "release": lambda s, w, e: s.release(TENANT, KEY, w, e, reason="shutdown", now=140),
}


@pytest.mark.parametrize("half", HALVES)
@pytest.mark.parametrize("write", WRITES)
def test_a_write_outside_the_current_fence_raises_conflict_and_changes_nothing(store, write, half):
    current = taken_over_by_the_same_worker(store)
    worker, epoch = HALVES[half](current)
    before = everything()

    with pytest.raises(Conflict):
        WRITES[write](store, worker, epoch)

    assert everything() == before
    # The holder's own write still lands: the refusal was about the fence.
    WRITES[write](store, HOLDER, current)
    assert everything() != before


@pytest.mark.parametrize("half", HALVES)
def test_under_fence_refuses_a_stale_fence_before_the_block_runs(store, half):
    current = taken_over_by_the_same_worker(store)
    worker, epoch = HALVES[half](current)
    ran = []

    with pytest.raises(Conflict):
        with store.under_fence(TENANT, KEY, worker, epoch):
            ran.append(True)

    assert ran == []
    with store.under_fence(TENANT, KEY, HOLDER, current) as job:
        assert (job.lease_epoch, job.worker_id) == (current, HOLDER)


# ---------------------------------------------------------------- operation records


def email_job_with_an_intent(store):
    """An email job whose first attempt (HOLDER, epoch 1) recorded its intent
    and died; the same worker id took it over at epoch 2."""
    store.enqueue(TENANT, KEY, action=SEND_EMAIL, payload={**EMAIL, "provider": "sim-idempotent"})
    store.claim(TENANT, KEY, HOLDER, now=100, ttl=30)
    first = JobContext(job=Job.objects.get(tenant=TENANT, key=KEY), worker_id=HOLDER, store=store)
    plan = protocol._begin(first, step="send", provider="sim-idempotent", kind=protocol.EMAIL_SEND,
                           request=EMAIL, digest=protocol.request_digest(EMAIL))
    assert plan.created
    assert store.claim(TENANT, KEY, HOLDER, now=131, ttl=30) == 2
    return plan.operation


def context(half) -> JobContext:
    worker, epoch = HALVES[half](Job.objects.get(tenant=TENANT, key=KEY).lease_epoch)
    job = Job.objects.get(tenant=TENANT, key=KEY)
    job.lease_epoch = epoch  # the context a slot kept from its (older) claim
    return JobContext(job=job, worker_id=worker, store=None)


ACCEPTED = ProviderAccepted(provider_reference="msg_1", accepted_at=datetime(2026, 1, 1, tzinfo=UTC))
UNKNOWN = ProviderOutcomeUnknown("timed out", status=None)
OPERATION_WRITES = {
    "intent": lambda ctx, op: protocol.operation_perform(ctx, step="send-again", provider="sim-idempotent",
                                                         request=EMAIL),
    "receipt": lambda ctx, op: protocol._accept(ctx, op, ACCEPTED, how="direct"),
    "outcome": lambda ctx, op: protocol._fail(ctx, op, UNKNOWN, to_state="UNKNOWN", kind="unknown", reason="t/o"),
    "resend": lambda ctx, op: protocol._prepare_resend(ctx, op, kind="lookup_miss", reason="nothing found"),
    "lookup_failed": lambda ctx, op: protocol._lookup_failed(ctx, _Named(), op, UNKNOWN),
    "investigate": lambda ctx, op: protocol._investigate(ctx, _Named(), op, cause="no answer"),
}


class _Named:
    name = "sim-idempotent"


@pytest.mark.parametrize("half", HALVES)
@pytest.mark.parametrize("write", OPERATION_WRITES)
def test_an_operation_record_outside_the_current_fence_raises_conflict_and_changes_nothing(store, write, half):
    operation = email_job_with_an_intent(store)
    stale = context(half)
    stale.store = store
    before = everything()

    with pytest.raises(Conflict):
        OPERATION_WRITES[write](stale, operation)

    assert everything() == before
