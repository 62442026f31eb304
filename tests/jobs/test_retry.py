"""Retry policy: pure logic, no database."""

import random
from datetime import UTC, datetime, timedelta

from jobs.errors import AuthError, NeedsAttention, PermanentError, TransientError
from jobs.retry import Failure, RetryPolicy, classify, decide

NOW = datetime(2026, 11, 30, tzinfo=UTC)
POLICY = RetryPolicy(initial_interval=1, multiplier=2, max_interval=60, max_attempts=10, max_elapsed=3600)


def test_full_jitter_delays_stay_within_zero_and_the_cap():
    rng = random.Random(7)
    for attempt in range(1, 15):
        cap = POLICY.backoff_cap(attempt)
        assert cap == min(60, 2 ** (attempt - 1))
        for _ in range(200):
            assert 0 <= POLICY.backoff(attempt, rng) <= cap


def test_delays_grow_with_attempts_until_the_ceiling():
    rng = random.Random(1)
    means = [sum(POLICY.backoff(a, rng) for _ in range(2000)) / 2000 for a in range(1, 9)]
    assert all(later > earlier for earlier, later in zip(means[:6], means[1:7]))
    assert means[-1] < 60


def test_jitter_spreads_jobs_that_failed_together():
    rng = random.Random(3)
    delays = [POLICY.backoff(4, rng) for _ in range(50)]
    assert len({round(d, 6) for d in delays}) == 50


def test_absurd_attempt_counts_do_not_overflow():
    assert POLICY.backoff_cap(10_000) == 60


def _decide(failure, attempts=1, first=NOW, **kw):
    return decide(failure=failure, error="boom", attempts=attempts, max_attempts=POLICY.max_attempts,
                  first_attempt_at=first, recoveries=kw.pop("recoveries", 0), now=kw.pop("now", NOW),
                  policy=POLICY, **kw)


def test_transient_failure_retries_with_a_delay():
    d = _decide(Failure.TRANSIENT, attempts=3, rng=random.Random(0))
    assert d.target == "READY" and 0 <= d.delay <= 4


def test_retry_after_from_the_provider_wins_over_backoff():
    d = _decide(Failure.TRANSIENT, attempts=1, retry_after=17.0)
    assert (d.target, d.delay) == ("READY", 17.0)


def test_elapsed_window_exhausted_needs_attention():
    d = _decide(Failure.TRANSIENT, attempts=2, first=NOW - timedelta(seconds=3599), retry_after=5)
    assert d.target == "NEEDS_ATTENTION"
    assert "recovery window" in d.reason


def test_attempts_exhausted_need_attention():
    assert _decide(Failure.TRANSIENT, attempts=10).target == "NEEDS_ATTENTION"


def test_validation_goes_to_review_and_auth_to_an_operator_at_once():
    assert _decide(Failure.PERMANENT).target == "WAITING_REVIEW"
    auth = _decide(Failure.AUTH)
    assert auth.target == "NEEDS_ATTENTION" and "not retried" in auth.reason


def test_a_job_that_keeps_losing_its_lease_is_poison():
    assert _decide(Failure.LOST_LEASE, recoveries=3).target == "READY"
    assert _decide(Failure.LOST_LEASE, recoveries=4).target == "NEEDS_ATTENTION"


def test_exceptions_are_classified():
    assert classify(AuthError("x")) == (Failure.AUTH, None, None)
    assert classify(PermanentError("x")) == (Failure.PERMANENT, None, None)
    assert classify(TransientError("x", retry_after=3, ceiling=9)) == (Failure.TRANSIENT, 3, 9)
    assert classify(NeedsAttention("x")) == (Failure.ATTENTION, None, None)
    assert classify(KeyError("surprise")) == (Failure.TRANSIENT, None, None)


def test_a_providers_ceiling_caps_the_backoff_below_the_actions_policy():
    rng = random.Random(5)
    delays = [_decide(Failure.TRANSIENT, attempts=9, ceiling=5.0, rng=rng).delay for _ in range(200)]
    assert max(delays) <= 5.0 and max(delays) > 2.5
    # A ceiling looser than the policy changes nothing.
    assert _decide(Failure.TRANSIENT, attempts=9, ceiling=10_000, rng=random.Random(1)).delay <= 60
