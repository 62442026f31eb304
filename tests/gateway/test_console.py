"""Operators manage their tenant's agents in the console: create (the key
shown once), issue and revoke keys, pause and resume — each a decision with
the permission and the role in the tenant, audited, a key named only by its
prefix; another tenant's agent does not exist for them."""

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group

from company.models import Tenant
from gateway.models import Agent, ApiKey
from gateway.services import agent_create
from tests.console.conftest import ensure_roles
from tests.factories import MembershipFactory, TenantFactory

from .conftest import EMAIL


@pytest.fixture
def people(db):
    ensure_roles()
    studio, acme = TenantFactory(slug="studio"), TenantFactory(slug="acme")

    def person(name, group, tenant, role):
        return MembershipFactory(user__username=name, user__groups=[Group.objects.get(name=group)], tenant=tenant,
                                 role=role).user

    return {"operator": person("otto", "operators", studio, "operator"),
            "reviewer": person("rita", "reviewers", studio, "reviewer"),
            "other": person("alex", "operators", acme, "operator")}


def issued_key(page: str) -> str:
    return re.search(r'<code id="issued-key">(dwk_[^<]+)</code>', page).group(1)


def propose(client, key):
    return client.post("/api/v1/proposals", {"action": "connectors.send_email", "key": "k-1", "rationale": "r",
                                             "payload": EMAIL}, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {key}")


def test_an_operator_creates_an_agent_and_sees_its_key_once(client, people):
    client.force_login(people["operator"])
    page = client.post("/admin/gateway/agent/create/", {"tenant": "studio", "name": "assistant",
                                                        "actions": ["connectors.send_email"],
                                                        "note": "the support bot"}).content.decode()
    key = issued_key(page)
    agent = Agent.objects.get(name="assistant")
    assert agent.actions == ["connectors.send_email"] and agent.created_by == "otto"
    assert client.get("/api/v1/actions", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    secret = key.split("_", 2)[2]
    change = client.get(f"/admin/gateway/agent/{agent.pk}/change/").content.decode()
    assert secret not in change and ApiKey.objects.get().secret_hash not in change
    assert f"dwk_{ApiKey.objects.get().prefix}_" in change
    logged = LogEntry.objects.get(object_id=str(agent.pk)).change_message
    assert ApiKey.objects.get().prefix in logged and secret not in logged


def test_pause_resume_new_key_and_revoke_are_audited_decisions(client, people):
    agent, first = agent_create(tenant=Tenant.objects.get(slug="studio"), name="assistant", actor="t")
    client.force_login(people["operator"])
    client.post(f"/admin/gateway/agent/{agent.pk}/pause/", {"note": "sending too much"})
    assert propose(client, first.key).status_code == 423
    client.post(f"/admin/gateway/agent/{agent.pk}/resume/", {"note": "fixed its prompt"})
    assert propose(client, first.key).status_code == 201
    second = issued_key(client.post(f"/admin/gateway/agent/{agent.pk}/keys/new/", {"note": "rotation"}).content
                        .decode())
    client.post(f"/admin/gateway/agent/{agent.pk}/keys/{first.prefix}/revoke/", {"note": "rotated"})
    assert propose(client, first.key).status_code == 401
    assert client.get("/api/v1/actions", HTTP_AUTHORIZATION=f"Bearer {second}").status_code == 200
    messages = list(LogEntry.objects.filter(object_id=str(agent.pk)).order_by("id")
                    .values_list("change_message", flat=True))
    assert [m.split(":")[0].split(" ")[0] for m in messages] == ["Paused", "Resumed", "Issued", "Revoked"]
    assert not any(second.split("_", 2)[2] in m for m in messages)


def test_a_reviewer_may_not_manage_agents_and_nothing_changes(client, people):
    agent, _ = agent_create(tenant=Tenant.objects.get(slug="studio"), name="assistant", actor="t")
    client.force_login(people["reviewer"])
    assert client.post(f"/admin/gateway/agent/{agent.pk}/pause/", {"note": "x"}).status_code == 403
    assert client.post(f"/admin/gateway/agent/{agent.pk}/keys/new/", {"note": "x"}).status_code == 403
    assert client.get("/admin/gateway/agent/create/").status_code == 404
    agent.refresh_from_db()
    assert not agent.paused and ApiKey.objects.count() == 1


def test_another_tenants_operator_finds_no_such_agent(client, people):
    agent, _ = agent_create(tenant=Tenant.objects.get(slug="studio"), name="assistant", actor="t")
    client.force_login(people["other"])
    assert client.get(f"/admin/gateway/agent/{agent.pk}/change/").status_code == 404
    assert client.post(f"/admin/gateway/agent/{agent.pk}/pause/", {"note": "x"}).status_code == 404
    assert "assistant" not in client.get("/admin/gateway/agent/").content.decode()
    refused = client.post("/admin/gateway/agent/create/", {"tenant": "studio", "name": "evil", "note": "x"})
    assert not Agent.objects.filter(name="evil").exists() and refused.status_code == 200
