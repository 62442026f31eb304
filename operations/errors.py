"""Errors of the operations layer. Each is one of the engine's handler
failures (jobs.errors), so the worker already knows what it means for the job."""

from jobs.errors import AuthError, NeedsAttention


class DigestMismatch(NeedsAttention):
    """A job step asked to perform its operation with a different request
    (digest, provider or kind) than the one recorded for it, or the provider
    says our idempotency key was used for a different body. Nothing was sent;
    the job needs attention (→ NEEDS_ATTENTION)."""


class ConnectorPaused(AuthError):
    """The provider refused this tenant's credentials earlier; nothing is sent
    for (tenant, provider) until an operator clears the pause
    (→ NEEDS_ATTENTION, never retried in a loop)."""


class OperationStateError(Exception):
    """A human decision does not apply to the operation in its current state
    (e.g. marking an accepted operation as not sent). Nothing was written."""
