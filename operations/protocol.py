"""The operation protocol: one way for every handler to touch the outside world.

    from operations.protocol import operation_perform

    receipt = operation_perform(ctx, step="send", provider="sim-idempotent",
                                kind="email.send", request={"to": …, "subject": …, "body": …})

The job's lease fences the job table, not the provider (DESIGN §6). So:

1. The intent (`INTENDED`) is committed under the job's fence before any I/O;
   a worker that lost its lease cannot create one, and every later attempt of
   the step finds it. Its intent key — derived from the obligation (tenant,
   job key, step, request digest), never random — is the idempotency key and
   the client reference, so an intent recorded again after the database lost
   a commit is the same message to the provider. For a provider that can look
   messages up but not deduplicate, `OPERATIONS_LOOKUP_BEFORE_FIRST_SEND`
   names the providers whose first send of an intent is preceded by a lookup
   of its key (one more request per email).
2. The request is sent outside any transaction, exactly once per attempt (the
   connector never retries behind our back). What came back is recorded under
   the fence: a receipt (`ACCEPTED`); `UNKNOWN` when the request may have
   arrived (timeout, reset, 5xx) — never "failed"; `REJECTED` (validation,
   → review); `FAILED` when the provider confirmed it did not accept (refused
   connection, 429, 401/403). A 401/403 also pauses the connector for the
   tenant until an operator clears it.
3. An attempt that finds the intent `INTENDED` or `UNKNOWN` reconciles before
   it may send: lookup by client reference when the provider declares it;
   otherwise a resend with the same idempotency key when it declares that;
   otherwise (a bare provider) the operation needs investigation and the job
   an operator. Nothing is ever resent blind.
4. The same step asked to send a different request is `DigestMismatch`:
   nothing is sent.
5. A new intent is recorded only when the tenant's limits and pauses for the
   job's action allow it (`operations.limits.dispatch_gate`, under the same
   fence): otherwise the job waits (`Deferred`) and nothing is sent.
6. A handler asks `operation_settle(ctx, step=…)` before it re-checks
   whether the step should still happen (the invoice paid since, the quote
   answered): an intent that may have reached the provider is reconciled
   first, so the outcome names what the provider holds — never "not sent"
   for an email the provider accepted, never an operation left in doubt.

Failures are raised as the engine's handler errors, so the retry policy
decides what happens to the job: `TransientError` (retry; the retry
reconciles), `Deferred` (a limit or a pause: the job waits, its attempt
handed back), `PermanentError` (→ WAITING_REVIEW), `AuthError`/`ConnectorPaused`
(→ NEEDS_ATTENTION, never looped), `NeedsAttention`/`DigestMismatch`
(→ NEEDS_ATTENTION). A moved fence raises `jobs.errors.Conflict` and nothing
is recorded; the new lease holder reconciles.

Test-only fault injection: with `OPERATIONS_CRASH_AFTER_INTENDED=1` in the
environment (or the setting of that name true) the process exits with status
137 right after a new intent commits and before its request leaves — the
"crash between intent and dispatch" of the acceptance tests. Off by default;
never set it in production.
"""

import os
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import IntegrityError, transaction

from connectors.base import (
    Connector,
    ProviderAccepted,
    ProviderAuthFailed,
    ProviderError,
    ProviderIdempotencyMismatch,
    ProviderLookupAmbiguous,
    ProviderRejected,
    ProviderThrottled,
)
from connectors.registry import UnknownProvider, get_connector
from jobs.actions import JobContext
from jobs.clock import db_now
from jobs.errors import AuthError, NeedsAttention, PermanentError, TransientError

from .digest import intent_key, request_digest
from .errors import ConnectorPaused, DigestMismatch
from .limits import dispatch_gate
from .models import ConnectorPause, Operation, OperationEvent, OperationState, Receipt, ReceiptHow
from .selectors import connector_pause_active
from .states import operation_transition

__all__ = ["operation_perform", "operation_settle", "EMAIL_SEND", "CRASH_AFTER_INTENDED_ENV"]

EMAIL_SEND = "email.send"
CRASH_AFTER_INTENDED_ENV = "OPERATIONS_CRASH_AFTER_INTENDED"

S = OperationState


@dataclass
class _Plan:
    """What the fenced read of the intent decided, acted on after it commits
    (raising inside the fence would roll back the history it wrote)."""

    operation: Operation | None = None
    receipt: Receipt | None = None
    error: Exception | None = None
    created: bool = False
    reconcile: bool = False


def operation_perform(
    ctx: JobContext,
    *,
    step: str,
    provider: str,
    request: dict,
    kind: str = EMAIL_SEND,
) -> Receipt:
    """Perform the operation of this job step at most once, and return its receipt.

    Guarantees: the intent is committed under the job's fence before any I/O;
    a step whose earlier attempt may have reached the provider reconciles
    before it sends again, and never resends to a provider that can neither
    look the message up nor deduplicate it; an operation already `ACCEPTED`
    returns its receipt without any I/O. `request` is stored as is, so it must
    not contain secrets (credentials belong to the connector).

    Raises `Deferred` (a limit or a pause holds the new intent back; the job
    waits), `TransientError` (retry later; the retry reconciles first),
    `PermanentError` (the provider rejected the request, or the provider name
    is unknown), `AuthError` (credentials refused; the connector is now paused
    for the tenant), `ConnectorPaused`, `NeedsAttention` (the outcome cannot be
    reconciled by machine), `DigestMismatch` (a different request for the same
    step; nothing sent) and `jobs.errors.Conflict` (the lease moved; nothing
    recorded).
    """
    digest = request_digest(request)
    try:
        connector = get_connector(provider)
    except UnknownProvider as exc:
        raise PermanentError(f"cannot perform {kind}: {exc}") from exc

    plan = _begin(ctx, step=step, provider=provider, kind=kind, request=request, digest=digest)
    if plan.error is not None:
        raise plan.error
    if plan.receipt is not None:
        return plan.receipt
    operation = plan.operation
    if plan.created:
        _fault_crash_after_intended()
        if _looks_up_before_first_send(connector):
            # The intent may be one the database forgot it had sent (a lost
            # commit): a provider that cannot deduplicate is asked first.
            receipt = _found_before_first_send(ctx, connector, operation)
            if receipt is not None:
                return receipt
    if plan.reconcile:
        receipt = _reconcile(ctx, connector, operation)
        if receipt is not None:
            return receipt
    return _dispatch(ctx, connector, operation)


def operation_settle(ctx: JobContext, *, step: str) -> Receipt | None:
    """What the provider holds of this job step, found out before the
    handler decides anything else — the rule every action follows: an
    operation that may have reached the provider is reconciled before any
    business re-check ("is the invoice still unpaid?") may decide the outcome.

    Returns the step's receipt when the provider holds it (recorded now by a
    lookup, or earlier), and None when nothing of the step can be at the
    provider: no intent was ever recorded, the provider confirmed it did not
    accept it (FAILED, REJECTED), or a lookup made after the last request
    could have landed finds nothing — the operation is then recorded FAILED
    (safe to send, never left in doubt), so a handler that no longer wants to
    send strands nothing. A provider that offers idempotency keys but no
    lookup can only be asked by the same request under the same key: it
    answers with the message it holds or accepts it now (at most one exists
    either way). A provider offering neither needs a human.

    Raises what `operation_perform` raises for reconciliation:
    `TransientError` (the provider cannot say yet; the retry asks again),
    `NeedsAttention`, `AuthError`/`ConnectorPaused`, `PermanentError` (an
    unknown provider) and `jobs.errors.Conflict`.
    """
    operation = Operation.objects.filter(job_id=ctx.job.pk, step=step).select_related("receipt").first()
    if operation is None or operation.state in (S.FAILED, S.REJECTED):
        return None
    if operation.state == S.ACCEPTED:
        return operation.receipt
    if operation.state == S.NEEDS_INVESTIGATION:
        raise NeedsAttention(_under_investigation(operation))
    try:
        connector = get_connector(operation.provider)
    except UnknownProvider as exc:
        raise PermanentError(f"cannot reconcile {_describe(operation)}: {exc}") from exc
    pause = connector_pause_active(tenant=ctx.tenant, provider=operation.provider)
    if pause is not None:
        raise ConnectorPaused(_paused_reason(pause))
    receipt = _reconcile(ctx, connector, operation, miss_means_not_held=True)
    if receipt is not None or operation.state == S.FAILED:
        return receipt
    # Only a resend under the same key can tell (recorded INTENDED above).
    return _dispatch(ctx, connector, operation)


# ---------------------------------------------------------------- 1. the intent


def _begin(ctx: JobContext, *, step: str, provider: str, kind: str, request: dict, digest: str) -> _Plan:
    with ctx.under_fence() as job:
        # Dispatch times are compared by whichever worker reconciles later
        # (the settle window): the database's clock, as for leases.
        now = db_now()
        # The job row is locked, so no other attempt of this step can read or
        # create the operation until this transaction ends.
        operation = Operation.objects.filter(job_id=job.pk, step=step).first()
        if operation is not None:
            mismatch = _mismatch(operation, provider=provider, kind=kind, digest=digest)
            if mismatch:
                reason = (
                    f"{_describe(operation)}: step {step!r} of {ctx.tenant}/{ctx.key} was asked to send {mismatch}, "
                    f"which is not its recorded intent {operation.id}; nothing was sent. Compare the job's "
                    f"payload with the operation's request, then cancel the job or resolve the operation."
                )
                _record(ctx, operation, "digest_mismatch", reason=reason,
                        detail={"recorded_digest": operation.request_digest, "requested_digest": digest,
                                "requested_provider": provider, "requested_kind": kind},
                        last_error=reason)
                return _Plan(error=DigestMismatch(reason))
            if operation.state == S.ACCEPTED:
                # The receipt was recorded but the job was not finished (a crash
                # in between): nothing to send.
                return _Plan(receipt=operation.receipt)
        pause = connector_pause_active(tenant=ctx.tenant, provider=provider)
        if pause is not None:
            return _Plan(error=ConnectorPaused(_paused_reason(pause)))
        if operation is None:
            # A new effect: limits and pauses decide first (operations.limits;
            # the limit's row lock is taken after the fence's).
            deferred = dispatch_gate(job)
            if deferred is not None:
                return _Plan(error=deferred)
            operation = Operation.objects.create(
                tenant=ctx.tenant, job=job, step=step, provider=provider, kind=kind, action=job.action,
                intent_key=intent_key(tenant=ctx.tenant, job_key=job.key, step=step, digest=digest),
                request_digest=digest, request=request, state=S.INTENDED,
                attempts=1, last_dispatched_at=now,
            )
            _event(ctx, operation, "intend", "", S.INTENDED,
                   reason=f"intent recorded before dispatch (attempt 1 of {kind} via {provider})")
            return _Plan(operation=operation, created=True)
        if operation.state in (S.FAILED, S.REJECTED):
            # The provider confirmed it did not accept: sending again is safe.
            _record(ctx, operation, "dispatch", to_state=S.INTENDED,
                    reason=f"sending again (attempt {operation.attempts + 1}); the provider did not accept "
                           f"the previous one",
                    attempts=operation.attempts + 1, last_dispatched_at=now, last_error="")
            return _Plan(operation=operation)
        if operation.state in (S.INTENDED, S.UNKNOWN):
            return _Plan(operation=operation, reconcile=True)
        # NEEDS_INVESTIGATION: only a human can say what became of it.
        return _Plan(error=NeedsAttention(_under_investigation(operation)))


def _under_investigation(operation: Operation) -> str:
    return (f"{_describe(operation)} (operation {operation.id}) is under investigation: {operation.last_error} "
            f"Record what the provider shows (mark it sent with evidence, or confirm it was not sent) "
            f"before this job can go on.")


def _mismatch(operation: Operation, *, provider: str, kind: str, digest: str) -> str:
    if operation.provider != provider:
        return f"to provider {provider!r} instead of {operation.provider!r}"
    if operation.kind != kind:
        return f"a {kind!r} instead of {operation.kind!r}"
    if operation.request_digest != digest:
        return f"a different request (digest {digest[:12]}… instead of {operation.request_digest[:12]}…)"
    return ""


def _fault_crash_after_intended() -> None:
    """Test-only fault injection (see the module docstring); off by default."""
    if os.environ.get(CRASH_AFTER_INTENDED_ENV) == "1" or getattr(settings, CRASH_AFTER_INTENDED_ENV, False):
        os._exit(137)


# ---------------------------------------------------------------- 3. reconciliation


def _reconcile(ctx: JobContext, connector: Connector, operation: Operation, *,
               miss_means_not_held: bool = False) -> Receipt | None:
    """Find out whether the provider holds an in-doubt operation.

    Returns its receipt when the provider holds it; returns None once a
    resend has been recorded under the fence and is safe (the provider
    deduplicates by key, or a lookup shows it holds nothing); raises
    otherwise. Plans only from the connector's declared capabilities.

    With `miss_means_not_held` (`operation_settle`: the handler has yet to
    decide whether to send at all) a lookup that finds nothing, once any
    request could have landed, records the operation FAILED instead of
    preparing a resend.
    """
    capabilities = connector.capabilities
    if capabilities.lookup:
        try:
            found = connector.lookup(operation.intent_key)
        except ProviderError as exc:
            raise _lookup_failed(ctx, connector, operation, exc) from exc
        if found is not None:
            return _accept(ctx, operation, found, how=ReceiptHow.LOOKUP)
        if miss_means_not_held or not capabilities.idempotency_key:
            # A request started moments ago may still be on its way in; only
            # a miss after that window means "not accepted". (This narrows
            # the race, it cannot close it: only an idempotency key does —
            # and it does not help a handler that may decide not to send.)
            wait = _settle_remaining(connector, operation)
            if wait > 0:
                raise _transient(
                    connector,
                    f"{_describe(operation)}: lookup found nothing yet, but the last request started "
                    f"{_settle_seconds(connector) - wait:.1f}s ago and may still arrive; looking again in {wait:.1f}s",
                    retry_after=wait,
                )
        if miss_means_not_held:
            with ctx.under_fence():
                operation.refresh_from_db()
                _record(ctx, operation, "lookup_miss", to_state=S.FAILED,
                        reason=f"lookup at {connector.name} found no message for {operation.intent_key} after any request "
                               f"could have landed: the provider does not hold it (safe to send again)",
                        last_error="")
            return None
        _prepare_resend(ctx, operation, kind="lookup_miss",
                        reason=f"lookup at {connector.name} found no message for {operation.intent_key}; sending it "
                               f"(attempt {operation.attempts + 1})")
        return None
    if capabilities.idempotency_key:
        _prepare_resend(ctx, operation, kind="resend_same_key",
                        reason=f"resending with the same idempotency key {operation.intent_key} "
                               f"(attempt {operation.attempts + 1}); {connector.name} deduplicates by it")
        return None
    raise _investigate(ctx, connector, operation, cause=_doubt_cause(operation))


def _looks_up_before_first_send(connector: Connector) -> bool:
    return (connector.capabilities.lookup and not connector.capabilities.idempotency_key
            and connector.name in getattr(settings, "OPERATIONS_LOOKUP_BEFORE_FIRST_SEND", ()))


def _found_before_first_send(ctx: JobContext, connector: Connector, operation: Operation) -> Receipt | None:
    """The provider's message of this intent, if it holds one already (sent
    under the same key before the database lost the commit recording it)."""
    try:
        found = connector.lookup(operation.intent_key)
    except ProviderError as exc:
        raise _lookup_failed(ctx, connector, operation, exc) from exc
    return None if found is None else _accept(ctx, operation, found, how=ReceiptHow.LOOKUP)


def _doubt_cause(operation: Operation) -> str:
    if operation.state == S.UNKNOWN and operation.last_error:
        return operation.last_error
    return (f"the attempt that recorded the intent at {_when(operation.last_dispatched_at or operation.created_at)} "
            f"stopped before any answer was recorded (the worker may have died before or after sending)")


def _prepare_resend(ctx: JobContext, operation: Operation, *, kind: str, reason: str) -> None:
    # Recorded (and the fence checked) before the request leaves again.
    with ctx.under_fence():
        operation.refresh_from_db()
        _record(ctx, operation, kind, to_state=S.INTENDED, reason=reason, attempts=operation.attempts + 1,
                last_dispatched_at=db_now(), last_error="")


def _settle_seconds(connector: Connector) -> float:
    configured = getattr(settings, "OPERATIONS_LOOKUP_SETTLE_SECONDS", None)
    if configured is not None:
        return float(configured)
    total = getattr(connector, "total_timeout", None)
    if total:
        return float(total)  # no exchange of this connector can last longer
    connect = getattr(connector, "connect_timeout", settings.PROVIDER_CONNECT_TIMEOUT)
    read = getattr(connector, "read_timeout", settings.PROVIDER_READ_TIMEOUT)
    # Connecting, then sending and reading, each bounded by the read timeout.
    return float(connect) + 2 * float(read)


def _settle_remaining(connector: Connector, operation: Operation) -> float:
    started = operation.last_dispatched_at or operation.created_at
    elapsed = (db_now() - started).total_seconds()
    return max(0.0, _settle_seconds(connector) - elapsed)


def _lookup_failed(ctx: JobContext, connector: Connector, operation: Operation, exc: ProviderError) -> Exception:
    """What a failed lookup means: the message's fate stays unknown, so the
    operation keeps its state; only the reason to come back later differs."""
    if isinstance(exc, ProviderAuthFailed):
        return _pause(ctx, connector, operation, exc, during="a lookup")
    if isinstance(exc, ProviderLookupAmbiguous):
        # Several messages carry this reference: which one is the receipt
        # (and whether the customer got it twice) is for a human to say.
        return _investigate(ctx, connector, operation, cause=f"lookup of {operation.intent_key} was ambiguous: {exc}",
                            detail=_evidence(exc))
    cause = f"lookup of {operation.intent_key} at {connector.name} failed ({exc})"
    with ctx.under_fence():
        operation.refresh_from_db()
        _record(ctx, operation, "lookup_failed", reason=cause, detail=_evidence(exc), last_error=cause)
    if isinstance(exc, ProviderThrottled):
        return _transient(connector, cause, retry_after=exc.retry_after)
    return _transient(connector, f"{_describe(operation)} is still unreconciled: {cause}")


def _investigate(ctx: JobContext, connector: Connector, operation: Operation, *, cause: str,
                 detail: dict | None = None) -> NeedsAttention:
    if detail is None:
        why = (f"{connector.name} offers neither lookup nor idempotency keys, so it is not sent again "
               f"automatically (that could deliver it twice)")
    else:
        why = "no machine can tell which message is this operation's, so none is adopted"
    reason = (
        f"{_describe(operation)} may or may not have been accepted by {connector.name}: {cause}. "
        f"{why}. Check the provider for client reference {operation.intent_key}, then mark the "
        f"operation sent (with the provider's reference) or confirm it was not sent."
    )
    with ctx.under_fence():
        operation.refresh_from_db()
        _record(ctx, operation, "investigate", to_state=S.NEEDS_INVESTIGATION, reason=reason, detail=detail,
                last_error=reason)
    return NeedsAttention(reason)


# ---------------------------------------------------------------- 2. dispatch


def _dispatch(ctx: JobContext, connector: Connector, operation: Operation) -> Receipt:
    # Outside any transaction: a slow provider must not hold the job's lock.
    try:
        accepted = connector.send(operation.request, idempotency_key=operation.intent_key,
                                  client_reference=operation.intent_key)
    except ProviderError as exc:
        raise _dispatch_failed(ctx, connector, operation, exc) from exc
    how = ReceiptHow.IDEMPOTENT_REPLAY if accepted.replayed else ReceiptHow.DIRECT
    return _accept(ctx, operation, accepted, how=how)


def _accept(ctx: JobContext, operation: Operation, accepted: ProviderAccepted, *, how: str) -> Receipt:
    detail = {"provider_reference": accepted.provider_reference, "how": how}
    reason = f"accepted by {operation.provider} as {accepted.provider_reference} ({how})"
    with ctx.under_fence():
        operation.refresh_from_db()
        if operation.state == S.ACCEPTED:
            return operation.receipt
        receipt = Receipt.objects.create(
            operation=operation, provider_reference=accepted.provider_reference,
            accepted_at=accepted.accepted_at, how=how, evidence=accepted.evidence, recorded_by=ctx.worker_id,
        )
        _record(ctx, operation, "accept", to_state=S.ACCEPTED, reason=reason, detail=detail, last_error="")
    return receipt


def _dispatch_failed(ctx: JobContext, connector: Connector, operation: Operation, exc: ProviderError) -> Exception:
    """Record what a failed send means for the operation; return what to raise."""
    if isinstance(exc, ProviderAuthFailed):
        return _pause(ctx, connector, operation, exc, during="sending")
    if isinstance(exc, ProviderIdempotencyMismatch):
        reason = (f"{connector.name} says idempotency key {operation.intent_key} was already used for a different request "
                  f"({exc}); nothing was sent. The recorded request and what the provider holds disagree.")
        with ctx.under_fence():
            operation.refresh_from_db()
            _record(ctx, operation, "digest_mismatch", to_state=S.NEEDS_INVESTIGATION, reason=reason,
                    detail=_evidence(exc), last_error=reason)
        return DigestMismatch(reason)
    if exc.may_have_been_accepted:
        return _outcome_unknown(ctx, connector, operation, exc)
    if isinstance(exc, ProviderRejected):
        reason = f"{connector.name} rejected {_describe(operation)}: {exc}"
        _fail(ctx, operation, exc, to_state=S.REJECTED, kind="reject", reason=reason)
        return PermanentError(reason)
    reason = f"{connector.name} did not accept {_describe(operation)}: {exc}"
    _fail(ctx, operation, exc, to_state=S.FAILED, kind="fail", reason=reason)
    if isinstance(exc, ProviderThrottled):
        return _transient(connector, reason, retry_after=exc.retry_after)
    return _transient(connector, reason)


def _outcome_unknown(ctx: JobContext, connector: Connector, operation: Operation, exc: ProviderError) -> Exception:
    cause = f"the request may have reached {connector.name} but no answer says what became of it ({exc})"
    capabilities = connector.capabilities
    if not (capabilities.lookup or capabilities.idempotency_key):
        # Waiting cannot help a provider that can never tell us: ask a human now.
        with ctx.under_fence():
            operation.refresh_from_db()
            _record(ctx, operation, "unknown", to_state=S.UNKNOWN, reason=cause, detail=_evidence(exc),
                    last_error=cause)
        return _investigate(ctx, connector, operation, cause=cause)
    reason = f"{_describe(operation)}: outcome unknown, reconciling before any resend: {cause}"
    _fail(ctx, operation, exc, to_state=S.UNKNOWN, kind="unknown", reason=reason)
    return _transient(connector, reason)


def _transient(connector: Connector, reason: str, *, retry_after: float | None = None) -> TransientError:
    """A retryable failure, its backoff capped by the provider's declared ceiling."""
    return TransientError(reason, retry_after=retry_after, ceiling=connector.capabilities.retry_ceiling)


def _fail(ctx: JobContext, operation: Operation, exc: ProviderError, *, to_state: str, kind: str, reason: str) -> None:
    with ctx.under_fence():
        operation.refresh_from_db()
        _record(ctx, operation, kind, to_state=to_state, reason=reason, detail=_evidence(exc), last_error=reason)


def _pause(
    ctx: JobContext, connector: Connector, operation: Operation, exc: ProviderError, *, during: str
) -> AuthError:
    """Credentials refused: pause (tenant, provider) so no other job keeps
    knocking with them, and send this job to an operator."""
    reason = (f"{connector.name} refused the credentials of tenant {ctx.tenant} while {during} ({exc}); "
              f"connector paused until an operator fixes the credentials and clears the pause")
    with ctx.under_fence():
        operation.refresh_from_db()
        # A refused send was not accepted; a refused lookup leaves the
        # operation as much in doubt as before.
        to_state = S.FAILED if during == "sending" else ""
        _record(ctx, operation, "auth_refused", to_state=to_state, reason=reason, detail=_evidence(exc),
                last_error=reason)
        try:
            with transaction.atomic():
                ConnectorPause.objects.create(tenant=ctx.tenant, provider=connector.name, status_code=exc.status,
                                              reason=reason, operation=operation)
        except IntegrityError:
            pass  # another job of this tenant paused it first; one pause is enough
    return AuthError(reason)


def _paused_reason(pause: ConnectorPause) -> str:
    status = f"HTTP {pause.status_code}" if pause.status_code else "refused credentials"
    return (f"connector {pause.provider} paused for tenant {pause.tenant} since {_when(pause.paused_at)} by "
            f"{status}; nothing was sent. An operator must fix the credentials and clear the pause, "
            f"then retry this job.")


# ---------------------------------------------------------------- history


def _record(ctx: JobContext, operation: Operation, kind: str, *, to_state: str = "", reason: str = "",
            detail: dict | None = None, **changes) -> None:
    """Change the operation under the caller's fence and append its event."""
    operation_transition(operation, kind, to_state=to_state, actor=ctx.worker_id, epoch=ctx.epoch,
                         reason=reason, detail=detail, **changes)


def _event(ctx: JobContext, operation: Operation, kind: str, from_state: str, to_state: str, *, reason: str = "",
           detail: dict | None = None) -> None:
    OperationEvent.objects.create(operation=operation, kind=kind, from_state=from_state, to_state=to_state,
                                  actor=ctx.worker_id, epoch=ctx.epoch, reason=reason, detail=detail or {})


def _evidence(exc: ProviderError) -> dict:
    return {"error": type(exc).__name__, "status": exc.status, "detail": exc.detail, **exc.evidence}


def _describe(operation: Operation) -> str:
    to = operation.request.get("to") if isinstance(operation.request, dict) else None
    if operation.kind == EMAIL_SEND and to:
        return f"email to {to}"
    return f"{operation.kind} operation"


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
