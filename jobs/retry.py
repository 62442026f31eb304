"""Retry policy: the one place that decides what a failed attempt means.

Exponential backoff with full jitter (delay = uniform(0, min(cap, base·m^n))),
a ceiling per action (and per provider, through the action's policy), a
maximum number of attempts and a maximum elapsed recovery window measured
from the first attempt. Validation errors go to review at once; an
authentication failure goes to an operator at once and is never retried in a
loop (DESIGN §9).
"""

import math
import random
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple

from . import chance
from .states import State


class Failure(StrEnum):
    TRANSIENT = "transient"  # TransientError or an unexpected exception
    PERMANENT = "permanent"  # PermanentError: validation, a human must look
    AUTH = "auth"  # AuthError: credentials refused
    LOST_LEASE = "lost_lease"  # the worker went silent; found by recovery
    ATTENTION = "attention"  # the handler itself says an operator must decide


@dataclass(frozen=True)
class RetryPolicy:
    initial_interval: float = 1.0  # seconds
    multiplier: float = 2.0
    max_interval: float = 300.0  # the ceiling (a provider's, where it has one)
    max_attempts: int = 5
    max_elapsed: float = 24 * 3600.0  # the recovery window since the first attempt
    max_recoveries: int = 3  # expired leases before a job counts as poison

    def backoff_cap(self, attempt: int) -> float:
        """Upper bound of the delay after `attempt` (1-based) failed attempts."""
        exponent = max(0, attempt - 1)
        # min() before the power can overflow on absurd attempt counts.
        if self.multiplier > 1 and exponent > 64:
            return self.max_interval
        return min(self.max_interval, self.initial_interval * self.multiplier**exponent)

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full jitter: any delay in [0, cap] is equally likely, so a burst of
        failures spreads out instead of retrying in lock-step."""
        return (rng or chance.rng).uniform(0.0, self.backoff_cap(attempt))


DEFAULT_POLICY = RetryPolicy()


@dataclass(frozen=True)
class Decision:
    target: State
    reason: str
    delay: float | None = None  # seconds until the next attempt, for READY


def decide(
    *,
    failure: Failure,
    error: str,
    attempts: int,
    max_attempts: int,
    first_attempt_at: datetime | None,
    recoveries: int,
    now: datetime,
    policy: RetryPolicy = DEFAULT_POLICY,
    retry_after: float | None = None,
    ceiling: float | None = None,
    rng: random.Random | None = None,
) -> Decision:
    """What happens to a job whose attempt number `attempts` just failed.

    `retry_after` (the provider said when) replaces the backoff; `ceiling`
    (a provider's limit) caps it below the policy's own maximum. Every delay —
    a backoff or a provider's `retry_after`, however large — is capped by the
    ceiling and must fit in the recovery window, or the job goes to an
    operator; a value that is not a finite number of seconds is ignored."""
    ceiling = _seconds(ceiling)
    retry_after = _seconds(retry_after)
    if ceiling is not None and ceiling < policy.max_interval:
        policy = replace(policy, max_interval=ceiling)
    if failure is Failure.PERMANENT:
        return Decision(State.WAITING_REVIEW, f"rejected, needs review: {error}")
    if failure is Failure.AUTH:
        return Decision(State.NEEDS_ATTENTION, f"authentication refused, not retried: {error}")
    if failure is Failure.ATTENTION:
        return Decision(State.NEEDS_ATTENTION, error)
    if failure is Failure.LOST_LEASE and recoveries > policy.max_recoveries:
        return Decision(
            State.NEEDS_ATTENTION,
            f"lease expired {recoveries} times (limit {policy.max_recoveries}); "
            f"the job may crash or hang its worker: {error}",
        )
    if attempts >= max_attempts:
        return Decision(State.NEEDS_ATTENTION, f"gave up after {attempts} attempts: {error}")
    if retry_after is None:
        delay = policy.backoff(attempts, rng)
    else:
        # The provider's word, but never past its declared ceiling.
        delay = min(retry_after, ceiling) if ceiling is not None else retry_after
    # Seconds, not datetimes: a huge delay must be refused, not overflow.
    elapsed = (now - first_attempt_at).total_seconds() if first_attempt_at is not None else 0.0
    if elapsed + delay > policy.max_elapsed:
        return Decision(
            State.NEEDS_ATTENTION,
            f"recovery window of {policy.max_elapsed:g}s since the first attempt is exhausted: {error}",
        )
    return Decision(State.READY, f"attempt {attempts} failed, retrying in {delay:.2f}s: {error}", delay)


def _seconds(value) -> float | None:
    """A duration a handler or a provider gave, or None when it is not a
    number at all (then the policy's own backoff applies); never negative.
    Infinity stays infinite: no window can hold it, so the job goes to an
    operator."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return max(0.0, float(value))


class Classified(NamedTuple):
    failure: Failure
    retry_after: float | None = None
    ceiling: float | None = None


def classify(exc: BaseException) -> Classified:
    """What a handler's exception means for the retry policy. Anything not
    declared permanent or an authentication failure counts as transient."""
    from .errors import AuthError, NeedsAttention, PermanentError, TransientError

    if isinstance(exc, NeedsAttention):
        return Classified(Failure.ATTENTION)
    if isinstance(exc, AuthError):
        return Classified(Failure.AUTH)
    if isinstance(exc, PermanentError):
        return Classified(Failure.PERMANENT)
    if isinstance(exc, TransientError):
        return Classified(Failure.TRANSIENT, exc.retry_after, exc.ceiling)
    return Classified(Failure.TRANSIENT)
