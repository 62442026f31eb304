"""Inbound events: something arriving from outside resumes the job waiting for
it (DESIGN §7).

HTTP: `POST /hooks/<provider>/events` (view in `jobs.views`).

Authentication — HMAC-SHA256 with a per-provider secret from the setting
`INBOUND_WEBHOOK_SECRETS` (environment: `INBOUND_WEBHOOK_SECRETS="sim=abc"`):

    X-Signature-Timestamp: <unix seconds, an integer>
    X-Signature: sha256=<hex HMAC-SHA256(secret, b"<timestamp>." + raw body)>

The signature is compared in constant time. A timestamp further than
`INBOUND_MAX_SKEW_SECONDS` (default 300) from this server's clock, either way,
is refused as stale: a captured request cannot be replayed later.

Tenant binding — a provider's secret lets it act only for the tenants the
setting `INBOUND_PROVIDER_TENANTS` binds it to (environment:
`INBOUND_PROVIDER_TENANTS="sim=demo|studio,mailer=*"`; `*` = any tenant); a
provider with a secret but no entry may act for no tenant. And an event only
resumes a job that waits on *that* provider (`Wait.external(...,
provider="sim")`): an authentic event of one provider can never end a wait
for another's, nor touch another tenant's job. Such an event is kept
UNMATCHED, with the reason, for an operator. The binding is checked before
the event's tenant is recorded: an event naming a tenant its provider may not
act for is kept without a tenant (only those who see every tenant see it),
never under the tenant it names.

Body — one JSON object:

    {"id": "evt_123",                       # the provider's event id: dedupe key
     "type": "message.reply",               # what happened
     "tenant": "studio",                    # needed to correlate by job key
     "correlation": {"job_key": "send-quote-017"} | {"client_reference": "…"},
     "data": {...}}                         # attached to the job's history

`id` and `type` are required non-empty strings; `tenant` is an optional
string; `correlation` and `data` are optional objects. The body must be
strict JSON (no NaN or Infinity), nested at most 64 levels, with no NUL
character in any string.

Outcomes (HTTP status, JSON body):

    202 {"status": "applied"}     recorded; the waiting job is READY again
    202 {"status": "unmatched"}   recorded and flagged for an operator: it
                                  correlates to no job waiting for an external
                                  event (never dropped)
    200 {"status": "duplicate"}   this provider event id was recorded before;
                                  acknowledged, nothing applied again
    400 {"error": …}              stale timestamp, or a malformed body
    401 {"error": …}              missing or invalid signature or timestamp,
                                  or a provider with no configured secret —
                                  answered exactly as a bad signature, so
                                  the answer does not reveal which provider
                                  names exist; the log says which it was

Nothing is recorded or applied unless the request is authentic, fresh and
well-formed.

Correlation: the built-in correlator matches `correlation.job_key` (with
`tenant`) to a job. Other apps add theirs with `register_correlator` — e.g.
one matching `correlation.client_reference` to the external call whose id
it is, and so to that call's job. The first correlator that
names a job wins.

Applying, in one transaction: the job row is locked; a job in
WAITING_EXTERNAL is resumed (→ READY) with the event in its history, and its
pending timers are cancelled — "a reply or a timer, whichever comes first".
A job in any other state (a timer already woke it, it finished …) leaves the
event UNMATCHED with the reason in `note`.
"""

import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from durable.numbers import NumberRefused, whole_number

from .clock import to_datetime
from .errors import JobError
from .models import InboundEvent, Job
from .states import State
from .store import Store
from .timers import timer_cancel_for_job
from .validation import json_problem

log = logging.getLogger("jobs.inbound")

# What a request that fails authentication is told, whatever the cause.
_NOT_AUTHENTIC = "invalid signature: expected sha256=<hex HMAC-SHA256 of '<timestamp>.' + body>"

__all__ = [
    "JobRef",
    "InboundReceipt",
    "InboundRejected",
    "UnknownProvider",
    "BadSignature",
    "StaleRequest",
    "MalformedEvent",
    "InboundError",
    "signature_for",
    "register_correlator",
    "inbound_event_receive",
    "inbound_event_resolve",
]

Status = InboundEvent.Status


# ---------------------------------------------------------------- errors: each has its HTTP status


class InboundRejected(JobError):
    """The request was refused; nothing was recorded."""

    http_status = 400


class UnknownProvider(InboundRejected):
    # 401 like a bad signature: a stranger cannot probe which providers exist.
    http_status = 401


class BadSignature(InboundRejected):
    http_status = 401


class StaleRequest(InboundRejected):
    http_status = 400


class MalformedEvent(InboundRejected):
    http_status = 400


class InboundError(JobError):
    """An operator action on an inbound event is not possible."""


# ---------------------------------------------------------------- correlation


@dataclass(frozen=True)
class JobRef:
    tenant: str
    key: str


Correlator = Callable[..., JobRef | None]
_correlators: list[Correlator] = []


def register_correlator(correlator: Correlator) -> Correlator:
    """Add `correlator(*, provider, tenant, correlation, data) -> JobRef |
    None`, tried after the built-in job-key correlator, in registration
    order. Usable as a decorator; registering the same function twice is a
    no-op."""
    if correlator not in _correlators:
        _correlators.append(correlator)
    return correlator


def _by_job_key(*, provider: str, tenant: str, correlation: dict, data: dict) -> JobRef | None:
    key = correlation.get("job_key")
    if isinstance(key, str) and key and tenant:
        return JobRef(tenant, key)
    return None


# ---------------------------------------------------------------- receiving


@dataclass(frozen=True)
class InboundReceipt:
    status: str  # "applied" | "unmatched" | "duplicate"
    event: InboundEvent


def signature_for(*, secret: str, timestamp: str | int, body: bytes) -> str:
    """The `X-Signature` header value a provider sends for `body` at `timestamp`."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def inbound_event_receive(
    *,
    provider: str,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    now: float | None = None,
) -> InboundReceipt:
    """Authenticate, record once and apply an event from `provider`.

    Guarantees: nothing is stored unless the signature is valid, the
    timestamp fresh and the body well-formed; a provider event id is
    recorded once and applied at most once (a concurrent redelivery waits
    for the first and is reported as a duplicate); an authentic event is
    never dropped — it resumes its waiting job or is kept UNMATCHED for an
    operator. Recording, resuming and cancelling the job's timers commit
    together.

    Raises `UnknownProvider`, `BadSignature`, `StaleRequest` or
    `MalformedEvent` (each carries its `http_status`).
    """
    secret = (getattr(settings, "INBOUND_WEBHOOK_SECRETS", None) or {}).get(provider)
    if not secret:
        log.warning("inbound.unknown_provider", extra={"fields": {
            "event": "inbound.unknown_provider", "provider": provider,
            "reason": "no webhook secret is configured for this provider (INBOUND_WEBHOOK_SECRETS)"}})
        # The same checks against a secret nobody holds: the answer is the one
        # a known provider's forged request gets, header for header.
        _verify(secret=secrets.token_hex(32), timestamp=timestamp, signature=signature, body=body)
        raise UnknownProvider(_NOT_AUTHENTIC)
    sent_at = _verify(secret=secret, timestamp=timestamp, signature=signature, body=body)
    # The provider's timestamp is wall-clock time: compare with this server's
    # (a timestamp of more digits than any clock is simply not fresh).
    skew = float("inf") if sent_at is None else abs((time.time() if now is None else now) - sent_at)
    allowed = getattr(settings, "INBOUND_MAX_SKEW_SECONDS", 300)
    if skew > allowed:
        raise StaleRequest(
            f"X-Signature-Timestamp {timestamp[:20]} is {skew:.0f}s from this server's clock (at most {allowed}s allowed)"
        )
    message = _parse(body)
    # The event is filed under the tenant it names only when this provider
    # may act for it: that tenant's operators see its events, and a valid
    # secret must not let one provider plant events before another's.
    tenant = message["tenant"] if message["tenant"] and _may_act_for(provider, message["tenant"]) else ""

    with transaction.atomic(durable=True):
        existing = InboundEvent.objects.filter(provider=provider, event_id=message["id"]).first()
        if existing is not None:
            return InboundReceipt("duplicate", existing)
        try:
            with transaction.atomic():
                event = InboundEvent.objects.create(
                    provider=provider,
                    event_id=message["id"],
                    event_type=message["type"],
                    tenant=tenant,
                    correlation=message["correlation"],
                    body=message,
                    state=Status.UNMATCHED,
                    received_at=to_datetime(now) or timezone.now(),
                )
        except IntegrityError:
            # A concurrent redelivery recorded it first (we waited for its commit).
            return InboundReceipt("duplicate", InboundEvent.objects.get(provider=provider, event_id=message["id"]))
        _apply(event, message, now=now)
    return InboundReceipt("applied" if event.state == Status.APPLIED else "unmatched", event)


def _verify(*, secret: str, timestamp: str | None, signature: str | None, body: bytes) -> int | None:
    """The signed timestamp (None: more digits than any clock has), once the signature matches."""
    if not timestamp or not signature:
        raise BadSignature("the X-Signature-Timestamp and X-Signature headers are required")
    try:
        sent_at = whole_number(timestamp, minimum=0)
    except NumberRefused:
        if not (timestamp.isascii() and timestamp.isdigit()):
            raise BadSignature("X-Signature-Timestamp must be an integer number of unix seconds, "
                               "in digits 0-9") from None
        sent_at = None
    expected = signature_for(secret=secret, timestamp=timestamp, body=body)
    if not hmac.compare_digest(expected.encode(), signature.strip().encode()):
        log.warning("inbound.bad_signature", extra={"fields": {"event": "inbound.bad_signature"}})
        raise BadSignature(_NOT_AUTHENTIC)
    return sent_at


def _parse(body: bytes) -> dict:
    try:
        message = json.loads(body, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise MalformedEvent(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise MalformedEvent("the body is not valid JSON: nested too deeply") from None
    if not isinstance(message, dict):
        raise MalformedEvent("the body must be a JSON object")
    problem = json_problem(message)
    if problem:
        raise MalformedEvent(f"the body cannot be stored: {problem}")
    for name, limit in (("id", 200), ("type", 100)):
        value = message.get(name)
        if not isinstance(value, str) or not value.strip():
            raise MalformedEvent(f"'{name}' is required and must be a non-empty string")
        if len(value) > limit:
            raise MalformedEvent(f"'{name}' is longer than {limit} characters")
    tenant = message.get("tenant", "")
    if tenant is None:
        tenant = ""
    if not isinstance(tenant, str) or len(tenant) > 64:
        raise MalformedEvent("'tenant' must be a string of at most 64 characters")
    for name in ("correlation", "data"):
        value = message.get(name, {})
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise MalformedEvent(f"'{name}' must be a JSON object")
        message[name] = value
    message["tenant"] = tenant
    return message


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def provider_tenants(provider: str) -> set[str]:
    """The tenants `provider` may act for (`{"*"}` = any), from the setting
    `INBOUND_PROVIDER_TENANTS`; none when it has no entry."""
    bound = (getattr(settings, "INBOUND_PROVIDER_TENANTS", None) or {}).get(provider) or []
    if isinstance(bound, str):
        bound = bound.split("|")
    return {tenant.strip() for tenant in bound if tenant.strip()}


def _may_act_for(provider: str, tenant: str) -> bool:
    tenants = provider_tenants(provider)
    return "*" in tenants or tenant in tenants


def _apply(event: InboundEvent, message: dict, *, now: float | None) -> None:
    """Correlate and resume (inside the recording transaction)."""
    ref, notes = None, []
    if message["tenant"] and event.tenant != message["tenant"]:
        notes += [_unbound(event.provider, message["tenant"]), "recorded without a tenant"]
    for correlator in [_by_job_key, *_correlators]:
        try:
            # A correlator that fails is noted, not fatal: the event is kept.
            with transaction.atomic():
                ref = correlator(provider=event.provider, tenant=message["tenant"],
                                 correlation=message["correlation"], data=message["data"])
        except Exception as exc:  # noqa: BLE001 - any correlator failure leaves the event for an operator
            notes.append(f"correlator {getattr(correlator, '__qualname__', correlator)} failed: {exc!r}")
            continue
        if ref is not None:
            break
    if ref is None:
        _unmatched(event, "; ".join([*notes, f"no job matches the correlation {message['correlation']}"]))
        return
    if not _may_act_for(event.provider, ref.tenant):
        # Checked before the job is even read: nothing of another tenant's
        # job is linked or revealed to this provider.
        _unmatched(event, "; ".join(dict.fromkeys([*notes, _unbound(event.provider, ref.tenant)])))
        return
    event.tenant = ref.tenant  # bound: the event belongs to the tenant of the job it correlates to
    # Lock order: the job, then its timers (a timer sweep never waits for a
    # job's lock, so this cannot deadlock with it).
    job = Job.objects.select_for_update().by_key(ref.tenant, ref.key).first()
    if job is None:
        _unmatched(event, f"no job {ref.tenant}/{ref.key}")
        return
    event.job = job
    if job.state != State.WAITING_EXTERNAL:
        _unmatched(event, f"job {job.tenant}/{job.key} is {job.state}, not waiting for an external event "
                          "(a timer or an earlier event may have resumed it first)")
        return
    if job.wait_provider != event.provider:
        waits_on = f"provider {job.wait_provider!r}" if job.wait_provider else "no provider's event"
        _unmatched(event, f"job {job.tenant}/{job.key} waits on {waits_on}, not on {event.provider!r}")
        return
    Store().resume(
        job.tenant,
        job.key,
        reason=f"{event.provider} event {event.event_type} received",
        actor=f"inbound:{event.provider}",
        detail={"inbound_event": event.pk, "provider": event.provider, "event_id": event.event_id,
                "type": event.event_type, "data": message["data"]},
        now=now,
    )
    cancelled = timer_cancel_for_job(
        job_id=job.pk, reason=f"inbound event {event.provider}:{event.event_id} resumed the job first", now=now
    )
    event.state = Status.APPLIED
    event.note = f"resumed {job.tenant}/{job.key}" + (f"; cancelled {cancelled} pending timer(s)" if cancelled else "")
    event.save(update_fields=["state", "tenant", "job", "note"])


def _unbound(provider: str, tenant: str) -> str:
    return (f"provider {provider!r} may not act for tenant {tenant!r} "
            f"(INBOUND_PROVIDER_TENANTS binds it to {sorted(provider_tenants(provider)) or 'none'})")


def _unmatched(event: InboundEvent, note: str) -> None:
    event.state = Status.UNMATCHED
    event.note = note
    event.save(update_fields=["state", "tenant", "job", "note"])


# ---------------------------------------------------------------- operators


def inbound_event_resolve(*, event_pk: int, actor: str, note: str, now: datetime | None = None) -> InboundEvent:
    """An operator clears the flag on an UNMATCHED event, saying what was
    done about it. Raises `InboundError` unless the event is UNMATCHED."""
    with transaction.atomic(durable=True):  # a human decision: never nested
        event = InboundEvent.objects.select_for_update().filter(pk=event_pk).first()
        if event is None:
            raise InboundError(f"no inbound event {event_pk}")
        if event.state != Status.UNMATCHED:
            raise InboundError(f"inbound event {event_pk} is {event.state}; only UNMATCHED events are resolved")
        event.state = Status.RESOLVED
        event.resolved_at = now or timezone.now()
        event.resolved_by = actor
        event.note = f"{event.note}\nresolved by {actor}: {note}".strip()
        event.save(update_fields=["state", "resolved_at", "resolved_by", "note"])
    return event
