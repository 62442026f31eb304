import json

import pytest

from company.services import tenant_ensure
from gateway.services import agent_create

EMAIL = {"to": "ada@example.com", "subject": "Your quote Q-1", "body": "Please find your quote attached."}


@pytest.fixture
def tenant(db):
    return tenant_ensure(slug="studio", name="Studio")


@pytest.fixture
def agent_key(tenant):
    """(agent, key) of an agent of `studio` that may propose every action with a schema."""
    agent, issued = agent_create(tenant=tenant, name="assistant", actor="test")
    return agent, issued.key


@pytest.fixture
def api(client, agent_key):
    """The API as the agent calls it: JSON bodies, its key as a bearer token."""

    class Api:
        key = agent_key[1]
        agent = agent_key[0]

        def get(self, path, key=None, **params):
            return client.get(f"/api/v1{path}", params, HTTP_AUTHORIZATION=f"Bearer {key or self.key}")

        def post(self, path, body, key=None, content_type="application/json"):
            data = json.dumps(body) if not isinstance(body, (bytes, str)) else body
            return client.post(f"/api/v1{path}", data, content_type=content_type,
                               HTTP_AUTHORIZATION=f"Bearer {key or self.key}")

        def propose(self, key="send-1", *, action="connectors.send_email", payload=None, rationale="asked",
                    api_key=None, **extra):
            return self.post("/proposals", {"action": action, "key": key, "rationale": rationale,
                                            "payload": EMAIL if payload is None else payload, **extra}, key=api_key)

    return Api()
