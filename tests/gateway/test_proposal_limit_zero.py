"""A proposal limit of 0 allows no proposal: refused with an error that
says so, never taken as "no limit" and never told to retry in a minute."""

import pytest

from gateway.services import agent_create
from jobs.models import Job

from .conftest import EMAIL


def propose(client, key: str, name: str = "a"):
    return client.post("/api/v1/proposals", {"action": "connectors.send_email", "key": name, "rationale": "r",
                                             "payload": EMAIL}, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {key}")


@pytest.mark.parametrize("own", ["proposals_per_minute", "proposals_per_day"])
def test_an_agents_own_limit_of_0_refuses_every_proposal_without_a_retry_time(client, tenant, own):
    _, issued = agent_create(tenant=tenant, name="muted", actor="t", **{own: 0})
    refused = propose(client, issued.key)
    document = refused.json()
    assert refused.status_code == 429 and "Retry-After" not in refused and "retry_after" not in document
    assert "allows it no proposals" in document["detail"] and "raises" in document["detail"]
    assert not Job.objects.exists()


def test_a_default_limit_of_0_refuses_every_proposal(client, tenant, settings):
    settings.GATEWAY_PROPOSALS_PER_MINUTE = 0
    _, issued = agent_create(tenant=tenant, name="muted", actor="t")
    assert propose(client, issued.key).status_code == 429
    _, own = agent_create(tenant=tenant, name="allowed", actor="t", proposals_per_minute=5)
    assert propose(client, own.key, "b").status_code == 201
