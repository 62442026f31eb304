"""The connector contract: what a provider can do, what it answered, how it failed.

The operations layer (DESIGN §6) decides what to do after a dispatch only from
the types defined here, so they are the whole contract between the two:

- ``Capabilities`` is a provider's *declaration* of what it supports. A
  connector never probes the provider to find out; reconciliation is planned
  from the declaration alone.
- ``ProviderAccepted`` is the receipt: the provider holds the message.
- Every failure is a ``ProviderError`` subclass whose type answers the one
  question that matters for side effects — *could the provider have accepted
  the message?*

  =============================  ==========================  =================
  exception                      may have been accepted?     what it means
  =============================  ==========================  =================
  ProviderOutcomeUnknown         yes                         reconcile first
  ProviderUnavailable            no (nothing was sent)       safe to send again
  ProviderRejected               no                          permanent, review
  ProviderAuthFailed             no                          needs a human
  ProviderThrottled              no                          wait retry_after
  ProviderIdempotencyConflict    the first request may be    transient, later
  ProviderIdempotencyMismatch    no (key reused, new body)   a bug, never send
  =============================  ==========================  =================

  ``ProviderUnavailable`` is deliberately *not* a subclass of
  ``ProviderOutcomeUnknown``: it is raised only when the connection could not
  be established, so no request byte left this process, and treating it as
  "unknown" would send an operation on a provider without lookup or
  idempotency to a human for nothing. Code that cannot tell the two apart can
  read ``may_have_been_accepted`` on any ``ProviderError``.

``NotSupported`` is not a provider answer but a caller error (asking for a
capability the provider did not declare), so it is not a ``ProviderError``.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

ACCEPTED = "accepted"

# The userinfo of a URL (`scheme://user:pass@`): up to the last "@" before
# the host's end, so an unencoded "@" in a password is covered too.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")


def redact_credentials(value: Any) -> Any:
    """`value` with the credentials of every URL in it replaced by `***`
    (`https://user:pass@host` → `https://***@host`): a string, or the strings
    inside lists and dicts (evidence). The one rule for what leaves a
    connector: a provider URL may carry credentials, and its errors and
    evidence are stored on operations and jobs and shown in the console."""
    if isinstance(value, str):
        return _URL_USERINFO.sub(r"\g<scheme>***@", value)
    if isinstance(value, Mapping):
        return {key: redact_credentials(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_credentials(item) for item in value]
    return value


@dataclass(frozen=True)
class Capabilities:
    """What a provider declares it supports.

    ``idempotency_key``: a resend carrying the same ``Idempotency-Key`` never
    creates a second message (the provider replays the first answer).
    ``lookup``: a message can be found again by the client's own reference, so
    a lost answer can be recovered without resending.
    ``retry_ceiling``: the longest a retry of a failed call should wait
    (seconds) — the provider's own ceiling on backoff; None leaves it to the
    action's retry policy.
    ``idempotency_retention``: how long (seconds) the provider remembers an
    idempotency key or a client reference. An operation UNKNOWN for longer
    can no longer be reconciled by a resend or a lookup with certainty; the
    consistency audit files it for a human. None: the audit's default (24 h).
    """

    idempotency_key: bool
    lookup: bool
    retry_ceiling: float | None = None
    idempotency_retention: float | None = None


@dataclass(frozen=True)
class ProviderAccepted:
    """The provider's receipt for a message it holds.

    ``evidence`` is JSON-serialisable (it is stored on the operation's
    receipt): the HTTP status code, the relevant response headers
    (``Request-Id``, ``Idempotent-Replayed``), the idempotency key sent, and
    the provider's response body. ``replayed`` is true when the provider
    answered a resend with the original response instead of accepting anew.
    """

    provider_reference: str
    accepted_at: datetime
    status: str = ACCEPTED
    evidence: dict[str, Any] = field(default_factory=dict)
    replayed: bool = False


class NotSupported(Exception):
    """The caller asked for a capability the connector does not declare.

    Raised before any I/O; it says nothing about the provider's state.
    """


class ProviderError(Exception):
    """Base of every failure a connector reports for a provider call.

    ``status`` is the HTTP status (``None`` when no response arrived),
    ``detail`` a human-readable reason, ``evidence`` a JSON-serialisable dict
    worth keeping on the operation. ``may_have_been_accepted`` tells whether
    the message may now exist at the provider.
    """

    may_have_been_accepted = False

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        evidence: Mapping[str, Any] | None = None,
    ) -> None:
        # Every provider error passes here on its way to storage: no URL
        # credentials in what is kept (`redact_credentials`).
        detail = redact_credentials(detail)
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.evidence: dict[str, Any] = redact_credentials(dict(evidence or {}))

    def __str__(self) -> str:
        prefix = f"HTTP {self.status}: " if self.status is not None else ""
        return f"{prefix}{self.detail}"


class ProviderOutcomeUnknown(ProviderError):
    """The request may have reached the provider and we do not know its fate.

    Raised for a read timeout, a connection reset or dropped mid-exchange, a
    5xx answer, or a success answer that cannot be read. The message MAY have
    been accepted: the caller must reconcile (lookup, or resend with the same
    idempotency key) and must never treat this as a failure.
    """

    may_have_been_accepted = True


class ProviderUnavailable(ProviderError):
    """The provider could not be reached; no request byte was sent.

    Raised only when establishing the connection failed (refused, connect
    timeout, unresolvable host), so the message was definitely not accepted
    and sending again is safe.
    """


class ProviderRejected(ProviderError):
    """The provider refused the request permanently (4xx validation and the like).

    Sending the same request again will be refused again; a human must change
    something. ``detail`` carries the provider's reason.
    """


class ProviderAuthFailed(ProviderError):
    """The provider refused our credentials (401/403).

    Retrying cannot help until someone fixes the credentials.
    """


class ProviderThrottled(ProviderError):
    """The provider asked us to slow down (429); nothing was accepted.

    ``retry_after`` is the delay in seconds the provider asked for (its
    ``Retry-After`` header, or a default when it sent none).
    """

    def __init__(
        self,
        detail: str,
        *,
        retry_after: float,
        status: int | None = 429,
        evidence: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail, status=status, evidence=evidence)
        self.retry_after = retry_after


class ProviderIdempotencyConflict(ProviderError):
    """Another request with the same idempotency key is still in progress (409).

    Transient: the first request may yet be accepted, so retry later with the
    same key and the provider will replay its answer.
    """

    may_have_been_accepted = True


class ProviderIdempotencyMismatch(ProviderError):
    """The idempotency key was already used for a different request body (422).

    Nothing was sent for this request. It means an operation id was reused
    with a different digest — a bug upstream, never a reason to send.
    """


class ProviderLookupAmbiguous(ProviderError):
    """A lookup found more than one message carrying our client reference.

    The provider holds duplicates (sent twice, or a provider bug): which one
    is this operation's receipt is a question for a human, never a guess.
    ``evidence["matches"]`` lists what the provider returned.
    """

    may_have_been_accepted = True


class Connector(abc.ABC):
    """A provider adapter.

    Implementations make exactly one attempt per call — no hidden retries —
    and report the outcome as a ``ProviderAccepted`` or a ``ProviderError``
    subclass, so retries and reconciliation stay visible in the operations
    layer.
    """

    name: str
    capabilities: Capabilities

    @abc.abstractmethod
    def send(
        self,
        request: Mapping[str, Any],
        *,
        idempotency_key: str,
        client_reference: str,
    ) -> ProviderAccepted:
        """Ask the provider to accept ``request`` once.

        ``idempotency_key`` is passed to the provider only when
        ``capabilities.idempotency_key`` is declared; ``client_reference`` is
        always sent so a provider with lookup can find the message again.
        Raises a ``ProviderError`` subclass on any failure.
        """

    @abc.abstractmethod
    def lookup(self, client_reference: str) -> ProviderAccepted | None:
        """Find the message the provider accepted for ``client_reference``.

        Returns ``None`` when the provider holds no such message. Raises
        ``NotSupported`` (before any I/O) when ``capabilities.lookup`` is not
        declared, and a ``ProviderError`` subclass when the lookup itself
        fails.
        """
