"""Exceptions that are part of the engine's contract (STYLE.md, "Errors").

Handlers raise `TransientError`, `PermanentError` or `AuthError` to tell the
worker what a failure means; the Store raises `Conflict` when a fenced write no
longer matches the job's lease and `InvalidTransition` when a state change is
not in the transition table.
"""


class JobError(Exception):
    """Base class for engine errors."""


class Conflict(JobError):
    """The fence `(job, lease_epoch, worker_id)` no longer matches: another
    worker took the job over, or it was recovered. Nothing was written."""


class InvalidTransition(JobError):
    """The requested state change is not in the transition table. Nothing was written."""


class JobNotFound(JobError):
    """No job with that identity exists."""


class UnknownAction(JobError):
    """A job names an action that no handler is registered for."""


class HandlerFailure(JobError):
    """Base for failures a handler reports on purpose."""


class TransientError(HandlerFailure):
    """Worth retrying later (a timeout, a 5xx, a lock). `retry_after` (seconds)
    overrides the backoff when the cause says when to come back (HTTP 429);
    `ceiling` (seconds) caps the backoff for this cause — a provider's own
    limit, tighter than the action's policy."""

    def __init__(self, message: str = "", *, retry_after: float | None = None, ceiling: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after
        self.ceiling = ceiling


class PermanentError(HandlerFailure):
    """Validation: retrying cannot help, a human must look (→ WAITING_REVIEW)."""


class NeedsAttention(HandlerFailure):
    """Only a human can decide what happens next (e.g. an external effect whose
    outcome cannot be reconciled): → NEEDS_ATTENTION with this reason, no retry."""


class AuthError(HandlerFailure):
    """Credentials were refused: never retried in a loop (→ NEEDS_ATTENTION)."""


class Deferred(HandlerFailure):
    """The job may not do its work yet — a limit's window is full, a pause
    holds it — so it waits instead of failing: WAITING_EXTERNAL with this
    reason until `wake_at` (or until whoever holds it resumes it), and the
    attempt it was claimed for is handed back, as `release` does. For code
    deep in a handler's call (the operation protocol) that cannot return a
    `Wait` itself; nothing is retried and nothing counts as a failure.

    `held`, when given, answers whether what holds the job still does; it is
    asked in the transaction that records the wait, after the job's row is
    locked (`Store.defer`), so a hold lifted while the worker still held
    the job hands it back READY instead of leaving it to wait."""

    def __init__(self, reason: str, *, wake_at=None, held=None):
        super().__init__(reason)
        self.reason = reason
        self.wake_at = wake_at
        self.held = held
