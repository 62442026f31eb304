"""No handler outcome and no failing write may kill a worker's slot or its
heartbeat, nor run a handler again. An outcome the engine refuses (a result
that is not JSON, a wait into a state it cannot reach, a delay past the
recovery window) sends its job to an operator once; text the database cannot
store is escaped; a provider's Retry-After is capped by its ceiling.

Handlers here are scripted per job: the payload names a behaviour in
SCRIPTS, so one in-process worker can be fed any outcome at all.
"""

import math
import threading
from datetime import UTC, datetime

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.actions import Wait, action
from jobs.errors import AuthError, NeedsAttention, PermanentError, TransientError
from jobs.models import Job
from jobs.retry import Failure, RetryPolicy, decide
from jobs.states import State
from jobs.worker import Worker, WorkerConfig
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPTS: dict[str, object] = {}  # script name → what the handler returns or raises
RUNS: dict[str, int] = {}  # job key → how many times its handler ran
_runs_lock = threading.Lock()


@action("test.scripted", retry=RetryPolicy(initial_interval=0.01, max_interval=0.05, max_attempts=1))
def scripted(ctx):
    with _runs_lock:
        RUNS[ctx.key] = RUNS.get(ctx.key, 0) + 1
    outcome = SCRIPTS[ctx.payload["script"]]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def script(store, key: str, outcome, **enqueue) -> None:
    SCRIPTS[key] = outcome
    store.enqueue("studio", key, action="test.scripted", payload={"script": key}, **enqueue)


def job(key: str) -> Job:
    return Job.objects.get(tenant="studio", key=key)


def run_until_idle(**config) -> Worker:
    worker = Worker(WorkerConfig(until_idle=True, poll_interval=0.05, **config))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    # The failure this guards against: a slot thread dies, the job stays
    # LEASED and --until-idle never comes back.
    assert not thread.is_alive(), "the worker never became idle: a slot or the heartbeat died"
    return worker


BAD_OUTCOMES = {
    "wait-into-done": (Wait("DONE", "finished, I promise"), "cannot move a job to DONE"),
    "wait-into-nonsense": (Wait("SOMEWHERE", "elsewhere"), "SOMEWHERE"),
    "wake-at-as-text": (Wait.external("reply", wake_at="2030-01-01T00:00:00Z"), "wake_at must be a datetime"),
    "wake-at-beyond-9999": (Wait.external("reply", wake_at=1e20), "wake_at"),
    "result-with-nan": ({"total": math.nan}, "total is nan"),
    "result-with-infinity": ({"ratio": [1, math.inf]}, "ratio[1] is inf"),
    "result-with-nul": ({"note": "a\x00b"}, "NUL"),
    "result-not-json": ({"when": datetime(2030, 1, 1, tzinfo=UTC)}, "not JSON"),
    "retry-after-1e15": (TransientError("slow down", retry_after=1e15), "recovery window"),
}


@pytest.mark.parametrize("batch", [1, 4], ids=["single", "batch"])
@pytest.mark.parametrize("name", list(BAD_OUTCOMES))
def test_an_outcome_the_engine_refuses_needs_attention_once_and_the_worker_keeps_claiming(store, name, batch):
    outcome, says = BAD_OUTCOMES[name]
    name = f"{name}-{batch}"
    script(store, name, outcome, max_attempts=5)
    store.enqueue("studio", "afterwards")
    worker = run_until_idle(worker_id="w1", batch=batch)
    refused = job(name)
    assert refused.state == State.NEEDS_ATTENTION
    assert says in refused.last_error
    # Recorded once, by the worker that ran it: the handler ran once, no lease expired.
    assert RUNS[name] == 1
    assert list(refused.events.values_list("kind", flat=True)) == ["enqueue", "fail"]
    assert refused.events.get(kind="fail").claimed_at is not None
    assert job("afterwards").state == State.DONE
    assert worker.stats["lost"] == 0 and worker.stats["unrecorded"] == 0


def test_an_error_message_with_a_nul_byte_is_recorded_once_with_the_byte_escaped(store):
    script(store, "nul-error", PermanentError("recipient 'bo\x00b' is invalid"))
    run_until_idle(worker_id="w1")
    refused = job("nul-error")
    assert refused.state == State.WAITING_REVIEW
    assert "recipient 'bo\\x00b' is invalid" in refused.wait_reason
    assert RUNS["nul-error"] == 1


def test_a_handler_calling_sys_exit_fails_its_job_and_the_slot_goes_on(store):
    script(store, "exits", SystemExit(3))
    store.enqueue("studio", "afterwards")
    run_until_idle(worker_id="w1")
    assert job("exits").state == State.NEEDS_ATTENTION and "SystemExit" in job("exits").last_error
    assert job("afterwards").state == State.DONE


def test_an_exception_whose_message_cannot_be_printed_still_gives_a_readable_reason(store):
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")

    script(store, "unprintable", Unprintable())
    run_until_idle(worker_id="w1")
    assert "Unprintable: <unprintable message>" in job("unprintable").last_error


def test_one_vanished_job_does_not_stop_the_heartbeat_of_the_others(store):
    store.enqueue("studio", "vanishes", action="test.sleep", payload={"seconds": 30})
    store.enqueue("studio", "long", action="test.sleep", payload={"seconds": 3.0})
    worker = Worker(WorkerConfig(worker_id="w1", concurrency=2, lease_ttl=0.6, until_idle=True, poll_interval=0.05))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    wait_for(lambda: Job.objects.filter(state="LEASED").count() == 2, what="both jobs leased")
    # An operator deletes one running job: its renewal raises JobNotFound.
    Job.objects.filter(key="vanishes").delete()
    thread.join(timeout=30)
    assert not thread.is_alive()
    # Five TTLs went by: had the heartbeat died, the lease would have expired,
    # been recovered and the handler's result discarded.
    long = job("long")
    assert (long.state, long.lease_epoch, long.recoveries) == ("DONE", 1, 0)
    assert worker.stats["recovered"] == 0


# ---------------------------------------------------------------- the retry policy's delays


def test_a_providers_retry_after_is_capped_by_its_ceiling():
    now = datetime(2026, 11, 30, tzinfo=UTC)
    decision = decide(failure=Failure.TRANSIENT, error="429", attempts=1, max_attempts=5, first_attempt_at=now,
                      recoveries=0, now=now, retry_after=99999999999999.0, ceiling=60.0)
    assert (decision.target, decision.delay) == (State.READY, 60.0)


@pytest.mark.parametrize("retry_after", [99999999999999.0, 1e300, math.inf])
def test_a_retry_after_beyond_the_recovery_window_goes_to_an_operator_without_overflow(retry_after):
    now = datetime(9000, 1, 1, tzinfo=UTC)
    decision = decide(failure=Failure.TRANSIENT, error="429", attempts=1, max_attempts=5, first_attempt_at=None,
                      recoveries=0, now=now, retry_after=retry_after)
    assert decision.target == State.NEEDS_ATTENTION and "recovery window" in decision.reason


@pytest.mark.parametrize("retry_after", [math.nan, -5.0, "soon"])
def test_a_retry_after_that_is_no_duration_falls_back_to_the_backoff(retry_after):
    now = datetime(2026, 11, 30, tzinfo=UTC)
    decision = decide(failure=Failure.TRANSIENT, error="x", attempts=1, max_attempts=5, first_attempt_at=now,
                      recoveries=0, now=now, retry_after=retry_after)
    assert decision.target == State.READY and 0 <= decision.delay <= 1.0


# ---------------------------------------------------------------- any outcome at all

text = st.text(max_size=12)  # includes NUL and lone surrogates
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
odd_values = st.sampled_from([object(), {1, 2}, b"bytes", datetime(2030, 1, 1), (1, 2), {1: "int key"}])
wake_ats = st.none() | st.sampled_from(["2030-01-01", math.nan, math.inf, 1e20, -1e20, 4102444800.0, True])
seconds = st.none() | st.floats() | st.sampled_from([1e15, 99999999999999, -1, "5"])
exceptions = st.one_of(
    st.builds(TransientError, text, retry_after=seconds, ceiling=seconds),
    st.builds(PermanentError, text),
    st.builds(AuthError, text),
    st.builds(NeedsAttention, text),
    st.builds(ValueError, text),
    st.builds(SystemExit, st.integers()),
    st.builds(RecursionError),
)
waits = st.builds(Wait, st.sampled_from(list(State) + ["NOPE"]), text, wake_ats, st.one_of(st.just(""), text))
outcomes = st.one_of(json_like, odd_values, exceptions, waits)

SETTLED = {State.DONE, State.WAITING_EXTERNAL, State.WAITING_REVIEW, State.NEEDS_ATTENTION}


def test_a_worker_survives_any_handler_outcome_and_keeps_claiming(store):
    """Property: whatever a handler returns or raises, its job gets a settled
    outcome after one run, and the same worker goes on to claim the next."""
    worker = Worker(WorkerConfig(worker_id="prop", concurrency=1, poll_interval=0.05))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    counter = iter(range(10**6))
    try:

        @settings(max_examples=60 if connection.vendor == "postgresql" else 40, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(outcome=outcomes)
        def check(outcome):
            key = f"prop-{next(counter)}"
            script(store, key, outcome, max_attempts=1)
            settled = wait_for(lambda: job(key).state in SETTLED and job(key), timeout=30,
                               what=f"job {key} to settle after {outcome!r:.80}")
            assert RUNS[key] == 1
            assert settled.events.exclude(claimed_at=None).count() == 1  # one attempt, one row
            assert thread.is_alive()

        check()
    finally:
        worker.request_stop("test over")
        thread.join(timeout=30)
    assert worker.stats["lost"] == 0 and worker.stats["unrecorded"] == 0
