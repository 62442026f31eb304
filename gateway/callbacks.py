"""Outcome callbacks (DESIGN §15): an agent with a callback URL learns what
became of its proposals — `proposal.decided`, `proposal.done`,
`proposal.needs_attention`, `proposal.cancelled` — each delivered by an
engine job of its own, with an operation and a receipt.

Finding the events. The engine writes every transition of a job into its
history; the sweep (`callback_sweep`, a periodic task every worker runs)
reads, for each proposal it watches, the history rows after the last one it
saw (`AgentProposal.events_seen`; a job's rows are written under its row
lock, so none is skipped). A row becomes an event:

    approve / correct / reject           → proposal.decided
    → DONE (finished, resolved)          → proposal.done
    → NEEDS_ATTENTION                    → proposal.needs_attention
    → CANCELLED (rejected, cancelled)    → proposal.cancelled

The event id is derived from (tenant, key, history row, type), and the event
row, its delivery job (key `callback-<id>`) and the new `events_seen` commit
together: a sweep that dies half-way is repeated with the same ids, never
twice. The engine knows nothing of this: the sweep reads its history through
`jobs.selectors`, and a finish written by any path (a batch's statement
included) is seen the same way.

Delivering one. `gateway.deliver_callback` POSTs the event through the
operation protocol to provider `callback:<agent id>` (a connector per agent,
`connectors.webhook`): signed like the inbound webhooks (`X-Signature-Timestamp`,
`X-Signature: sha256=HMAC("<timestamp>.<body>")`), `Idempotency-Key: <event id>`,
redirects never followed, the resolved address checked at delivery. A 2xx is
the receipt; a timeout or 5xx is unknown and resent under the same key after
a backoff; a refusal goes to an operator. One receiver failing holds back
only its own deliveries (and a 401/403 pauses only its connector).
Deliveries are not ordered: each event carries its `created_at`.
"""

import json
import time
import uuid

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from connectors.http_exchange import ExchangeLimits
from connectors.registry import UnknownProvider, register_connector_family
from connectors.webhook import WebhookConnector
from jobs.actions import JobContext, action
from jobs.errors import NeedsAttention, PermanentError
from jobs.inbound import signature_for
from jobs.periodic import periodic_task
from jobs.retry import RetryPolicy
from jobs.selectors import DECISION_KINDS, events_after, job_by_key, jobs_by_keys
from jobs.states import TERMINAL, State
from jobs.store import Store
from jobs.validation import max_payload_bytes
from operations.protocol import operation_perform
from operations.selectors import receipts_for_job
from review.admin import TimelineItem

from .models import Agent, AgentProposal, CallbackEvent
from .schemas import timestamp
from .services import callback_allow_private, callback_require_https, proposal_view

DELIVER = "gateway.deliver_callback"
CALLBACK_KIND = "callback.deliver"
PROVIDER_PREFIX = "callback:"
EVENT_NAMESPACE = uuid.UUID("5b0c3c2e-2f44-4c1a-9a55-0d6b7c1f2e91")
# History rows one proposal's sweep reads at a time.
EVENTS_PER_SWEEP = 50
# A receiver may be down for a while: retries for two days, backing off to 10 min.
CALLBACK_RETRY = RetryPolicy(initial_interval=2.0, max_interval=600.0, max_attempts=20, max_elapsed=2 * 24 * 3600.0)

T = CallbackEvent.Type


def event_types(kind: str, to_state: str) -> list[str]:
    """The callback events one history row (its kind and the state it moved to) means."""
    types = [T.DECIDED] if kind in DECISION_KINDS else []
    types += {State.DONE: [T.DONE], State.NEEDS_ATTENTION: [T.NEEDS_ATTENTION],
              State.CANCELLED: [T.CANCELLED]}.get(to_state, [])
    return [str(t) for t in types]


def event_id(*, tenant: str, key: str, history_id: int, type_: str) -> uuid.UUID:
    return uuid.uuid5(EVENT_NAMESPACE, f"{tenant}\n{key}\n{history_id}\n{type_}")


def delivery_key(identity: uuid.UUID) -> str:
    """The key of the job delivering event `identity`: in the system's own
    namespace (`jobs.validation.SYSTEM_KEY_PREFIXES`), where no agent proposes."""
    return f"callback-{identity}"


def _bounded(view: dict) -> dict:
    """The proposal as the event carries it; a result too large for a job's
    payload is left out (the agent reads it with GET /api/v1/proposals/<key>)."""
    if len(json.dumps(view)) > max_payload_bytes() // 2 and view.get("outcome"):
        return {**view, "outcome": {**view["outcome"], "result": {"omitted": "too large; read the proposal"}}}
    return view


def _emit(watched: AgentProposal, job, row, type_: str, view: dict) -> bool:
    identity = event_id(tenant=watched.tenant, key=watched.job_key, history_id=row.id, type_=type_)
    if CallbackEvent.objects.filter(pk=identity).exists():
        return False
    body = {"id": str(identity), "type": type_, "created_at": timestamp(row.created_at), "proposal": view}
    delivery = delivery_key(identity)
    CallbackEvent.objects.create(id=identity, agent_id=watched.agent_id, proposal=watched, type=type_,
                                 job_key=delivery)
    Store().enqueue(watched.tenant, delivery, action=DELIVER, payload={"agent": watched.agent_id, "event": body},
                    actor="gateway:callbacks", reason=f"{type_} for {watched.job_key}")
    return True


def _sweep_one(watched_id: int) -> int:
    with transaction.atomic():
        rows = AgentProposal.objects.select_related("agent", "proposal").filter(pk=watched_id, watching=True)
        if connection.vendor == "postgresql":
            # Concurrent sweeps (every worker runs one) take different proposals.
            rows = rows.select_for_update(skip_locked=True, of=("self",))
        watched = rows.first()
        if watched is None:
            return 0
        job = job_by_key(tenant=watched.tenant, key=watched.job_key)
        emitted, finished = 0, True
        if job is not None:
            history = events_after(job.pk, after=watched.events_seen, limit=EVENTS_PER_SWEEP)
            view = None
            for row in history:
                for type_ in event_types(row.kind, row.to_state):
                    view = view or _bounded(proposal_view(job, watched.proposal))
                    emitted += _emit(watched, job, row, type_, view)
                watched.events_seen = row.id
            finished = job.state in TERMINAL and len(history) < EVENTS_PER_SWEEP
        # Watched while the job lives and the agent listens; a job gone
        # (retention) or finished and fully read ends it.
        watched.watching = bool(watched.agent.callback_url) and not finished
        watched.checked_at = timezone.now()
        watched.save(update_fields=["events_seen", "watching", "checked_at"])
        return emitted


@periodic_task("gateway.callbacks", every=1.0)
def callback_sweep(*, worker_id: str = "callbacks", limit: int = 100) -> int:
    """Look at up to `limit` watched proposals, least recently checked first
    (partial index `agentproposal_watching`), and turn their new history
    rows into callback events with their delivery jobs. Returns how many
    events it created (not how many proposals it looked at, so a worker
    with `--until-idle` stops once nothing new happens)."""
    watched = (AgentProposal.objects.filter(watching=True).order_by("checked_at", "id")
               .values_list("id", flat=True)[:limit])
    return sum(_sweep_one(watched_id) for watched_id in list(watched))


@action(DELIVER, retry=CALLBACK_RETRY, timeout=120)
def deliver_callback(ctx: JobContext) -> dict:
    """Deliver one outcome event to its agent's callback URL (see the module)."""
    agent = Agent.objects.filter(pk=ctx.payload.get("agent")).first()
    event = ctx.payload.get("event") or {}
    if agent is None or not agent.callback_url:
        return {"delivered": False, "event": event.get("id"), "reason": "the agent has no callback URL any more"}
    try:
        receipt = operation_perform(ctx, step="deliver", provider=f"{PROVIDER_PREFIX}{agent.pk}",
                                    kind=CALLBACK_KIND, request=event)
    except PermanentError as exc:
        # A receiver that refuses (4xx, a redirect, an address not allowed):
        # an operator looks — fixes the URL, then retries — not a reviewer.
        raise NeedsAttention(f"callback {event.get('id')} to agent {agent.name} was refused: {exc}") from exc
    return {"delivered": True, "event": event.get("id"), "reference": receipt.provider_reference}


def callback_connector(name: str) -> WebhookConnector:
    """The connector of provider `callback:<agent id>`: the agent's current
    URL, signed with its current secret (the secret never enters the
    operation's stored request)."""
    agent_id = name[len(PROVIDER_PREFIX):]
    agent = Agent.objects.filter(pk=int(agent_id)).first() if agent_id.isdigit() else None
    if agent is None or not agent.callback_url:
        raise UnknownProvider(f"{name}: no agent with a callback URL")
    secret = agent.callback_secret

    def sign(body: bytes) -> dict:
        stamp = str(int(time.time()))
        return {"X-Signature-Timestamp": stamp, "X-Signature": signature_for(secret=secret, timestamp=stamp, body=body)}

    connect = float(getattr(settings, "GATEWAY_CALLBACK_CONNECT_TIMEOUT", 2.0))
    read = float(getattr(settings, "GATEWAY_CALLBACK_READ_TIMEOUT", 5.0))
    limits = ExchangeLimits(connect, read, connect + 2 * read, 64 * 1024)
    return WebhookConnector(name, agent.callback_url, sign, limits=limits, allow_private=callback_allow_private(),
                            require_https=callback_require_https())


def timeline_items(job, *, since=None, until=None, limit: int = 200) -> list[TimelineItem]:
    """The callbacks about `job` (a proposal's), for its evidence timeline:
    each event with its delivery's state and receipt."""
    watched = AgentProposal.objects.filter(tenant=job.tenant, job_key=job.key).first()
    if watched is None:
        return []
    events = CallbackEvent.objects.filter(proposal=watched).select_related("proposal__agent")
    if since is not None:
        events = events.filter(created_at__gte=since)
    if until is not None:
        events = events.filter(created_at__lt=until)
    events = list(events.order_by("-created_at")[:limit])
    deliveries = jobs_by_keys(tenant=job.tenant, keys=[e.job_key for e in events])
    items = []
    for event in events:
        delivery = deliveries.get(event.job_key)
        if delivery is None:
            detail, state = "delivery job gone (retention)", "?"
        else:
            state = delivery.state
            receipts = receipts_for_job(delivery.pk) if state == State.DONE else []
            detail = (f"receipt {receipts[0].provider_reference} ({receipts[0].how})" if receipts
                      else delivery.last_error or delivery.wait_reason or "")
        items.append(TimelineItem(at=event.created_at, kind="callback",
                                  title=f"callback {event.type} to agent {event.proposal.agent.name}: {state}",
                                  detail=f"event {event.id}; {detail}",
                                  link="admin:jobs_job_change" if delivery else "",
                                  pk=delivery.pk if delivery else None))
    return items


register_connector_family(PROVIDER_PREFIX, callback_connector)
