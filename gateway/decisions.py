"""Operators' decisions on a tenant's agents, taken in the console (DESIGN
§14, §15): create an agent, issue and revoke its keys, pause and resume it.

Each needs the permission `gateway.manage_agent` and the operator role in
the agent's tenant (`jobs.access`, decision `manage_agent`; another tenant's
agent answers 404), and writes its change and an admin `LogEntry` in one
outermost transaction. A key is named by its prefix only — in the history,
the messages and the pages; the whole key is returned once, to be shown on
the page that answers the request, and never stored.
"""

from django.db import transaction
from django.http import Http404

from company.models import Tenant
from jobs import access
from jobs.access import DecisionRefused, decision_logged

from .keys import IssuedKey
from .models import Agent
from .services import (
    AgentError,
    agent_create,
    agent_holds_release,
    agent_key_issue,
    agent_key_revoke,
    agent_pause,
    agent_unpause,
)


def _may_manage(user, tenant: str) -> None:
    reason = access.refusal(user, "manage_agent", tenant=tenant)
    if reason:
        raise DecisionRefused(reason)


def _agent(user, agent_id: int) -> Agent:
    agent = access.get_visible_or_404(Agent.objects.select_related("tenant"), user, tenant_field="tenant__slug",
                                      pk=agent_id)
    _may_manage(user, agent.tenant.slug)
    return agent


def _note(note: str, what: str) -> str:
    note = (note or "").strip()
    if not note:
        raise DecisionRefused(f"a note is required: say {what}")
    return note


def agent_create_decided(*, user, tenant: str, name: str, note: str, actions: list[str] | None = None,
                         callback_url: str = "") -> tuple[Agent, IssuedKey]:
    """Create an agent and its first key. Raises `DecisionRefused` (also for
    what `agent_create` refuses), `Http404` for a tenant outside the user's scope."""
    note = _note(note, "what the agent is for")
    with transaction.atomic(durable=True):  # a human decision: never nested
        if not access.scope_of(user).sees(tenant):
            raise Http404("no such tenant")
        _may_manage(user, tenant)
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise DecisionRefused(f"no tenant {tenant}")
        try:
            agent, issued = agent_create(tenant=found, name=name, actor=user.get_username(), actions=actions,
                                         callback_url=callback_url)
        except AgentError as exc:
            raise DecisionRefused(str(exc)) from None
        decision_logged(user=user, obj=agent, message=f"Created agent {agent.name} with key {issued.prefix}. {note}")
    return agent, issued


def agent_key_issue_decided(*, user, agent_id: int, note: str) -> tuple[Agent, IssuedKey]:
    note = _note(note, "why a new key")
    with transaction.atomic(durable=True):
        agent = _agent(user, agent_id)
        issued = agent_key_issue(agent=agent, actor=user.get_username())
        decision_logged(user=user, obj=agent, message=f"Issued key {issued.prefix}. {note}")
    return agent, issued


def agent_key_revoke_decided(*, user, agent_id: int, prefix: str, note: str) -> Agent:
    note = _note(note, "why it is revoked")
    with transaction.atomic(durable=True):
        agent = _agent(user, agent_id)
        try:
            key = agent_key_revoke(agent=agent, prefix=prefix, actor=user.get_username())
        except AgentError as exc:
            raise DecisionRefused(str(exc)) from None
        decision_logged(user=user, obj=agent, message=f"Revoked key {key.prefix}. {note}")
    return agent


def agent_pause_decided(*, user, agent_id: int, note: str) -> Agent:
    """The kill switch: new proposals refused (423), undispatched jobs held."""
    note = _note(note, "why it is paused")
    with transaction.atomic(durable=True):
        agent = agent_pause(agent=_agent(user, agent_id), reason=note, actor=user.get_username())
        decision_logged(user=user, obj=agent, message=f"Paused: {note}")
    return agent


def agent_resume_decided(*, user, agent_id: int, note: str) -> tuple[Agent, int]:
    """Lift the pause, then resume the jobs it held; returns how many."""
    note = _note(note, "why it may go on")
    with transaction.atomic(durable=True):
        agent = agent_unpause(agent=_agent(user, agent_id), actor=user.get_username())
        decision_logged(user=user, obj=agent, message=f"Resumed: {note}")
    return agent, agent_holds_release(agent=agent, actor=user.get_username(), note=note)
