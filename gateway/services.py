"""The gateway's services (DESIGN §15): agents and their keys, and what an
agent may do — list its actions, propose, read its proposals.

The HTTP API (`gateway.api`) and the MCP server (`gateway.mcp`) are thin
shells over the same functions here, so they answer alike: a refusal is a
`problems.Refused` carrying the contract's status.

A proposal goes through `company.services.proposal_submit`: the tenant's
policy, not the agent, decides whether it waits for a reviewer. It is
idempotent by business key (the same action and payload again: the existing
proposal, `created: false`; other content under the key: 409) and limited
per agent — proposals per minute and per rolling day, counted from the
agent's own rows under its row lock, so concurrent requests cannot slip past.
"""

import base64
import math
import re
from datetime import timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Subquery
from django.urls import reverse
from django.utils import timezone

from company.models import Proposal, Tenant
from company.services import proposal_submit, tenant_policy
from connectors.webhook import address_problem, url_problem
from jobs.actions import action_spec, schema_actions
from jobs.payloads import PayloadInvalid, payload_json_schema, payload_validate
from jobs.selectors import job_by_key, jobs_by_keys, last_decision
from jobs.states import TERMINAL, State
from jobs.validation import SYSTEM_KEY_PREFIXES, job_validate, system_key
from operations.limits import Hold, action_paused, dispatch_holds_release
from operations.selectors import receipts_for_job

from .keys import IssuedKey, callback_secret_generate, key_generate, key_parse, secret_matches
from .models import Agent, AgentProposal, ApiKey
from .problems import Refused, field_errors, unauthorized
from .schemas import ProposalIn, timestamp

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
PAGE_SIZE = 50
# Rows a list with a state filter looks at per page: a bounded scan, so a
# page may hold fewer items than PAGE_SIZE and still have a `next`.
LIST_SCAN_BUDGET = 1000
# `last_used_at` is written at most this often per key (not on every request).
LAST_USED_RESOLUTION = timedelta(seconds=60)


class AgentError(ValueError):
    """An agent or key change that cannot be made (bad name, unknown action,
    a refused callback URL, an unknown key). Nothing was written."""


def agent_cause(agent: Agent) -> str:
    """What holds an agent's jobs at dispatch while it is paused (operations.limits)."""
    return f"agent:{agent.pk}"


# ---------------------------------------------------------------- agents and keys


def _callback_url_checked(url: str) -> str:
    url = (url or "").strip()
    if not url:
        return ""
    problem = url_problem(url, require_https=callback_require_https())
    if problem:
        raise AgentError(f"callback URL: {problem}")
    host = urlsplit(url).hostname or ""
    literal = host.strip("[]")
    if not callback_allow_private():
        # An address written into the URL is refused now; a name is checked
        # where it resolves at each delivery (connectors.webhook).
        try:
            problem = address_problem(literal)
        except ValueError:
            problem = "a loopback name" if literal.lower() in ("localhost", "localhost.localdomain") else None
        if problem:
            raise AgentError(f"callback URL: {problem}; refused (GATEWAY_CALLBACK_ALLOW_PRIVATE allows it for "
                             f"development)")
    return url


def _actions_checked(actions: list[str] | None) -> list[str] | None:
    if actions is None:
        return None
    names = sorted({a.strip() for a in actions if a.strip()})
    known = set(schema_actions())
    unknown = [a for a in names if a not in known]
    if unknown:
        raise AgentError(f"not proposable (unknown, or declares no payload schema): {', '.join(unknown)}; "
                         f"proposable: {', '.join(sorted(known)) or 'none'}")
    return names


def _limit_checked(name: str, value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise AgentError(f"{name} must be a whole number of 0 or more")
    return value


@transaction.atomic
def agent_create(*, tenant: Tenant, name: str, actor: str, actions: list[str] | None = None,
                 callback_url: str = "", proposals_per_minute: int | None = None,
                 proposals_per_day: int | None = None) -> tuple[Agent, IssuedKey]:
    """A new agent of `tenant` and its first key (shown once: `IssuedKey.key`).
    `actions=None` lets it propose every action that declares a payload
    schema. A callback URL gets a generated signing secret. Raises `AgentError`."""
    if not NAME_PATTERN.match(name or ""):
        raise AgentError("the name must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if Agent.objects.filter(tenant=tenant, name=name).exists():
        raise AgentError(f"tenant {tenant.slug} already has an agent named {name}")
    url = _callback_url_checked(callback_url)
    agent = Agent.objects.create(
        tenant=tenant, name=name, actions=_actions_checked(actions), callback_url=url,
        callback_secret=callback_secret_generate() if url else "", created_by=actor,
        proposals_per_minute=_limit_checked("proposals_per_minute", proposals_per_minute),
        proposals_per_day=_limit_checked("proposals_per_day", proposals_per_day),
    )
    return agent, agent_key_issue(agent=agent, actor=actor)


@transaction.atomic
def agent_key_issue(*, agent: Agent, actor: str) -> IssuedKey:
    """A new key for `agent`; the returned `key` is the only copy there will be."""
    issued = key_generate()
    ApiKey.objects.create(agent=agent, prefix=issued.prefix, secret_hash=issued.secret_hash, created_by=actor)
    return issued


@transaction.atomic
def agent_key_revoke(*, agent: Agent, prefix: str, actor: str) -> ApiKey:
    """Revoke the agent's key with this prefix (from now on it answers 401).
    Revoking a revoked key changes nothing. Raises `AgentError` for a prefix
    the agent has no key with."""
    key = ApiKey.objects.select_for_update().filter(agent=agent, prefix=(prefix or "").strip()).first()
    if key is None:
        raise AgentError(f"agent {agent.name} has no key with prefix {prefix!r:.20}")
    if key.revoked_at is None:
        key.revoked_at, key.revoked_by = timezone.now(), actor
        key.save(update_fields=["revoked_at", "revoked_by"])
    return key


@transaction.atomic
def agent_pause(*, agent: Agent, reason: str, actor: str) -> Agent:
    """The kill switch: the agent's new proposals are refused (423) and its
    jobs not yet dispatched are held at dispatch (operations.limits)."""
    agent = Agent.objects.select_for_update().get(pk=agent.pk)
    agent.paused, agent.paused_reason = True, (reason or "").strip()
    agent.save(update_fields=["paused", "paused_reason"])
    return agent


@transaction.atomic
def agent_unpause(*, agent: Agent, actor: str) -> Agent:
    """Lift the pause (the held jobs are released by `agent_holds_release`)."""
    agent = Agent.objects.select_for_update().get(pk=agent.pk)
    agent.paused, agent.paused_reason = False, ""
    agent.save(update_fields=["paused", "paused_reason"])
    return agent


def agent_holds_release(*, agent: Agent, actor: str, note: str = "") -> int:
    """Resume the agent's jobs its pause held (each in its own transaction)."""
    return dispatch_holds_release(tenant=agent.tenant.slug, cause=agent_cause(agent), actor=actor,
                                  reason=f"agent {agent.name} resumed by {actor}{': ' + note if note else ''}")


def agent_hold(job) -> Hold | None:
    """Dispatch guard (operations.limits): a job an agent proposed is held
    while that agent is paused (one lookup by the job's business key)."""
    row = AgentProposal.objects.select_related("agent").filter(tenant=job.tenant, job_key=job.key).first()
    if row is None or not row.agent.paused:
        return None
    why = f" ({row.agent.paused_reason})" if row.agent.paused_reason else ""
    return Hold(agent_cause(row.agent), f"held: agent {row.agent.name} of tenant {job.tenant} is paused{why}; "
                                        f"nothing was sent. It goes on when an operator resumes the agent.")


def callback_allow_private() -> bool:
    return bool(getattr(settings, "GATEWAY_CALLBACK_ALLOW_PRIVATE", False))


def callback_require_https() -> bool:
    return bool(getattr(settings, "GATEWAY_CALLBACK_REQUIRE_HTTPS", True))


# ---------------------------------------------------------------- authentication


def agent_authenticate(authorization: str | None) -> Agent:
    """The agent whose active key is in `Authorization: Bearer <key>`, or
    `Refused(401)`. Records when the key was last used (at most once a minute)."""
    scheme, _, token = (authorization or "").partition(" ")
    parsed = key_parse(token.strip()) if scheme.lower() == "bearer" else None
    if parsed is None:
        raise unauthorized()
    prefix, secret = parsed
    key = ApiKey.objects.select_related("agent", "agent__tenant").filter(prefix=prefix).first()
    if key is None or key.revoked_at is not None or not secret_matches(secret, key.secret_hash):
        raise unauthorized()
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key.agent


def agent_from_key(key: str) -> Agent:
    """`agent_authenticate` for a bare key (the MCP server's DURABLE_AGENT_KEY)."""
    return agent_authenticate(f"Bearer {key}")


# ---------------------------------------------------------------- actions


def agent_actions(agent: Agent) -> list[str]:
    """The actions `agent` may propose now: its list (or every action with
    a payload schema), of those still registered with one."""
    proposable = schema_actions()
    return proposable if agent.actions is None else [a for a in agent.actions if a in proposable]


def actions_list(agent: Agent) -> list[dict]:
    """`GET /api/v1/actions`: each action, whether the tenant's policy sends
    it to a reviewer, and its payload's JSON Schema."""
    runs_alone = set(tenant_policy(agent.tenant).runs_without_review)
    return [{"name": name, "description": action_spec(name).description, "needs_review": name not in runs_alone,
             "payload_schema": payload_json_schema(name)} for name in agent_actions(agent)]


# ---------------------------------------------------------------- proposals


def _per(agent_limit: int | None, setting: str, default: int) -> int:
    return agent_limit if agent_limit is not None else int(getattr(settings, setting, default))


def proposal_limit_refusal(agent: Agent, now) -> Refused | None:
    """429 when a new proposal would pass the agent's per-minute or rolling
    per-day limit; `Retry-After` is when the oldest counted one leaves. A
    limit of 0 allows none: 429 without `Retry-After`, as waiting never helps."""
    counted, zero = [], None
    for limit, window, what in (
        (_per(agent.proposals_per_minute, "GATEWAY_PROPOSALS_PER_MINUTE", 60), 60, "per minute"),
        (_per(agent.proposals_per_day, "GATEWAY_PROPOSALS_PER_DAY", 5000), 86400, "per rolling 24 h"),
    ):
        if limit == 0:
            zero = Refused(429, "rate-limited", f"agent {agent.name}'s limit {what} is 0: it allows it no proposals "
                                                f"until an operator raises it")
            break
        counted.append((limit, window, what))
    # The `limit`-th newest proposal of each window, if there is one, in one
    # statement: agentproposal_agent_created walked newest first, `limit`
    # entries at most per window.
    nth_newest = {f"w{i}": Subquery(AgentProposal.objects.filter(agent_id=agent.pk,
                                                                 created_at__gt=now - timedelta(seconds=window))
                                    .order_by("-created_at").values("created_at")[limit - 1 : limit])
                  for i, (limit, window, _) in enumerate(counted)}
    fulls = Agent.objects.filter(pk=agent.pk).annotate(**nth_newest).values_list(*nth_newest).first() if counted else ()
    for (limit, window, what), full_since in zip(counted, fulls or [None] * len(counted)):
        if full_since is not None:
            opens = full_since + timedelta(seconds=window)
            wait = max(1, math.ceil((opens - now).total_seconds()))
            return Refused(429, "rate-limited", f"agent {agent.name} may make {limit} proposals {what}; try again "
                                                f"in {wait} s", retry_after=wait)
    return zero


def _refuse_unless_proposable(agent: Agent, action: str) -> None:
    if agent.paused:
        why = f" ({agent.paused_reason})" if agent.paused_reason else ""
        raise Refused(423, "agent-paused", f"agent {agent.name} is paused by an operator{why}; nothing is proposed")
    spec = action_spec(action)
    if spec is None or spec.schema is None:
        raise Refused(422, "validation-error", f"unknown action {action!r}",
                      errors=[{"loc": ["body", "action"], "msg": "unknown action (GET /api/v1/actions lists yours)",
                               "type": "unknown_action"}])
    if action not in agent_actions(agent):
        raise Refused(403, "action-not-allowed", f"agent {agent.name} may not propose {action}")
    if action_paused(tenant=agent.tenant.slug, action=action):
        raise Refused(423, "action-paused", f"action {action} is paused for tenant {agent.tenant.slug}")


def _same_content(job, proposal: Proposal | None, action: str, payload: dict) -> bool:
    # A reviewer's correction changes the job's payload, not what was proposed.
    original = proposal.payload if proposal is not None else job.payload
    return job.action == action and original == payload


def proposal_propose(*, agent: Agent, proposal: ProposalIn) -> tuple[dict, bool]:
    """Propose work for the agent's tenant; returns (the proposal, created).

    Raises `Refused`: 423 paused (agent or action), 422 unknown action or a
    payload its schema refuses, 403 an action the agent may not propose, 409
    the key holds other content, 429 over a limit (with `retry_after`).
    """
    _refuse_unless_proposable(agent, proposal.action)
    if system_key(proposal.key):
        raise Refused(422, "validation-error", f"key {proposal.key!r}: reserved for the system's own jobs",
                      errors=[{"loc": ["body", "key"], "type": "reserved_key",
                               "msg": f"keys beginning {', '.join(SYSTEM_KEY_PREFIXES)} are the system's own"}])
    try:
        payload = payload_validate(proposal.action, proposal.payload)
    except PayloadInvalid as exc:
        raise Refused(422, "validation-error", f"the payload does not match {proposal.action}'s schema",
                      errors=field_errors(exc.errors, prefix=("body", "payload"))) from None
    tenant = agent.tenant
    subject = proposal.subject
    subject_fields = {"subject_type": subject.type, "subject_id": str(subject.id),
                      "subject_version": subject.version} if subject else {}
    try:
        # What the engine would refuse (size, unstorable text), refused now.
        job_validate(tenant=tenant.slug, key=proposal.key, action=proposal.action, payload=payload, priority=0,
                     run_at=None, max_attempts=None, default_max_attempts=1, **subject_fields)
    except ValueError as exc:
        raise Refused(422, "validation-error", str(exc)) from None
    with transaction.atomic():
        # The agent's row lock serialises its proposals: the limit counts
        # and the key check below see every earlier one.
        agent = Agent.objects.select_for_update().select_related("tenant").get(pk=agent.pk)
        existing = job_by_key(tenant=tenant.slug, key=proposal.key)
        if existing is None:
            refusal = proposal_limit_refusal(agent, timezone.now())
            if refusal is not None:
                raise refusal
            submitted = proposal_submit(tenant=tenant, proposed_by=f"agent:{agent.name}", action=proposal.action,
                                        job_key=proposal.key, rationale=proposal.rationale, payload=payload,
                                        key_free=True, **subject_fields)
            if submitted.created:
                AgentProposal.objects.create(agent=agent, proposal=submitted.proposal, tenant=tenant.slug,
                                             job_key=proposal.key, watching=bool(agent.callback_url))
                return proposal_view(submitted.job, submitted.proposal, fresh=True), True
            existing = submitted.job  # created meanwhile by someone else of the tenant
    # Only the agent's own proposal is answered again; a key another agent
    # (or a person, or the system) holds tells nothing of what it holds.
    mine = AgentProposal.objects.filter(agent=agent, job_key=proposal.key).select_related("proposal").first()
    if mine is None or not _same_content(existing, mine.proposal, proposal.action, payload):
        raise Refused(409, "key-conflict", f"key {proposal.key} already holds a different proposal (another "
                                           f"action or payload, or not yours); choose another key")
    return proposal_view(existing, mine.proposal), False


def proposal_read(*, agent: Agent, key: str) -> dict:
    """The agent's own proposal under `key`; 404 for any other key — another
    agent's of the same tenant, a job the system made, another tenant's."""
    own = (AgentProposal.objects.filter(agent=agent, job_key=key).select_related("proposal").first()
           if isinstance(key, str) and len(key) <= 200 else None)
    job = job_by_key(tenant=agent.tenant.slug, key=key) if own is not None else None
    if job is None:
        raise Refused(404, "not-found", f"agent {agent.name} has no proposal {key!r:.210}")
    return proposal_view(job, own.proposal)


def _cursor(after_id: int) -> str:
    return base64.urlsafe_b64encode(f"p{after_id}".encode()).decode().rstrip("=")


def _cursor_id(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not re.fullmatch(r"p[0-9]{1,18}", text):
            raise ValueError(text)
        return int(text[1:])
    except ValueError:
        raise Refused(422, "validation-error", "cursor: not a cursor this API gave",
                      errors=[{"loc": ["query", "cursor"], "msg": "not a cursor this API gave",
                               "type": "invalid_cursor"}]) from None


def proposals_list(*, agent: Agent, state: str | None = None, cursor: str | None = None) -> dict:
    """The agent's proposals, newest first, a page at a time: `{"items",
    "next"}` (`next` is the cursor of the following page, or None). With
    `state`, only proposals whose job is in that state; such a page looks at
    no more than LIST_SCAN_BUDGET proposals, so it may be short (or empty)
    and still have a `next`."""
    if state is not None and state not in State.values:
        raise Refused(422, "validation-error", f"state: one of {', '.join(State.values)}",
                      errors=[{"loc": ["query", "state"], "msg": f"one of {', '.join(State.values)}",
                               "type": "enum"}])
    rows = AgentProposal.objects.filter(agent=agent).select_related("proposal").order_by("-id")
    if cursor:
        rows = rows.filter(id__lt=_cursor_id(cursor))
    items, last, scanned = [], None, 0
    budget = LIST_SCAN_BUDGET if state else PAGE_SIZE
    while len(items) < PAGE_SIZE and scanned < budget:
        chunk = list(rows.filter(id__lt=last)[:min(200, budget - scanned)] if last else
                     rows[:min(200, budget - scanned)])
        if not chunk:
            return {"items": items, "next": None}
        jobs = jobs_by_keys(tenant=agent.tenant.slug, keys=[row.job_key for row in chunk])
        for row in chunk:
            scanned, last = scanned + 1, row.id
            job = jobs.get(row.job_key)
            if job is not None and (state is None or job.state == state):
                items.append(proposal_view(job, row.proposal))
                if len(items) == PAGE_SIZE:
                    break
    more = rows.filter(id__lt=last).exists() if last else False
    return {"items": items, "next": _cursor(last) if more else None}


def proposal_view(job, proposal: Proposal | None, *, fresh: bool = False) -> dict:
    """A proposal as the API, the MCP tools and the callbacks show it
    (DESIGN §15): `state` is the job's; `decision` the reviewer's, if any;
    `outcome` once the job finished or needs attention, or has receipts.
    `fresh`: the job was created in the caller's transaction, not committed
    yet, so nobody can have decided on it or recorded a receipt of it."""
    decided = None if fresh else last_decision(job.pk)
    receipts = [] if fresh else [{"provider": r.operation.provider, "reference": r.provider_reference, "how": r.how}
                                 for r in receipts_for_job(job.pk)]
    settled = job.state in TERMINAL or job.state == State.NEEDS_ATTENTION
    return {
        "key": job.key,
        "action": job.action,
        "state": str(job.state),
        "needs_review": proposal.needs_review if proposal is not None else False,
        "created_at": timestamp(proposal.created_at if proposal is not None else job.created_at),
        "decision": None if decided is None else {"decision": decided.kind, "by": decided.actor,
                                                  "at": timestamp(decided.created_at), "note": decided.reason},
        "outcome": {"state": str(job.state), "result": job.result, "receipts": receipts}
        if settled or receipts else None,
        "links": {"self": f"/api/v1/proposals/{job.key}", "console": reverse("console:decide", args=[job.pk])},
    }
