"""`enqueue` and `enqueue_many` validate input with one function and name
the bad field; nothing is written for a refused job. Input the engine could
not store or run as asked (NaN or NUL in the payload, an over-long key, a
date past year 9999, no attempts allowed, a 50 MB payload) is refused at the
door, and one bad spec refuses its whole batch."""

import math

import pytest

from jobs.models import Job, JobEvent
from jobs.store import JobSpec

pytestmark = pytest.mark.django_db(transaction=True)

BAD = {
    "max_attempts -1": ({"max_attempts": -1}, "max_attempts"),
    "max_attempts 0": ({"max_attempts": 0}, "max_attempts"),
    "NaN in the payload": ({"payload": {"amount": math.nan}}, "payload: amount is nan"),
    "Infinity in the payload": ({"payload": {"xs": [math.inf]}}, "payload: xs[0] is inf"),
    "NUL in the payload": ({"payload": {"note": "a\x00"}}, "payload: note contains a NUL"),
    "an object JSON cannot hold": ({"payload": {"tags": {"a", "b"}}}, "payload: tags is a set"),
    "a payload that is no object": ({"payload": [1, 2]}, "payload must be a JSON object"),
    "an over-long key": ({"key": "k" * 201}, "key is 201 characters long (at most 200)"),
    "an over-long tenant": ({"tenant": "t" * 65}, "tenant is 65 characters long (at most 64)"),
    "an over-long action": ({"action": "a" * 101}, "action is 101 characters long (at most 100)"),
    "an empty key": ({"key": ""}, "key must be a non-empty string"),
    "a run_at that is text": ({"run_at": "tomorrow"}, "run_at must be a datetime"),
    "a run_at past year 9999": ({"run_at": 1e20}, "run_at"),
    "a priority out of range": ({"priority": 10**6}, "priority"),
}


def attempt(store, many: bool, **fields):
    job = {"tenant": "studio", "key": "k1", "action": "jobs.noop", **fields}
    if many:
        return store.enqueue_many([JobSpec(tenant="studio", key="fine"), JobSpec(**job)])
    tenant, key = job.pop("tenant"), job.pop("key")
    return store.enqueue(tenant, key, **job)


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_naming_the_field_and_nothing_is_written(store, case, many):
    fields, says = BAD[case]
    with pytest.raises(ValueError, match=None) as refused:
        attempt(store, many, **fields)
    assert says in str(refused.value)
    if many:
        assert "job 1 (" in str(refused.value)  # which spec of the batch
    # One bad spec refuses the whole batch.
    assert not Job.objects.exists() and not JobEvent.objects.exists()


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_a_50_mb_payload_is_refused(store, many):
    with pytest.raises(ValueError, match=r"payload is \d+ bytes as JSON \(at most 262144"):
        attempt(store, many, payload={"blob": "x" * (50 * 1024 * 1024)})
    assert not Job.objects.exists()


def test_the_payload_cap_is_a_setting(store, settings):
    settings.JOBS_MAX_PAYLOAD_BYTES = 100
    store.enqueue("studio", "small", payload={"text": "x" * 50})
    with pytest.raises(ValueError, match="at most 100, setting JOBS_MAX_PAYLOAD_BYTES"):
        store.enqueue("studio", "large", payload={"text": "x" * 100})


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_good_input_is_stored_the_same_way_by_both(store, many):
    attempt(store, many, payload={"amount": 1.5, "lines": [{"sku": "A"}]}, max_attempts=1, priority=3)
    job = Job.objects.get(key="k1")
    assert (job.payload, job.max_attempts, job.priority) == ({"amount": 1.5, "lines": [{"sku": "A"}]}, 1, 3)
    # Without max_attempts the action's policy decides (5 for jobs.noop).
    attempt(store, many, key="k2")
    assert Job.objects.get(key="k2").max_attempts == 5
