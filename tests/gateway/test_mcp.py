"""The MCP server as an MCP client uses it: `manage.py mcp_server` started as
a real process by the `mcp` SDK's stdio client, on the test database."""

import json
import subprocess
import sys

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from company.services import tenant_ensure
from gateway.schemas import ProposalIn
from gateway.services import agent_create, agent_key_revoke, proposal_propose
from tests.conftest import ROOT

from .conftest import EMAIL

pytestmark = [pytest.mark.acceptance]


def _session(manage, key: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(ROOT / "manage.py"), "mcp_server"], cwd=str(ROOT),
                                 env={**manage.env, "DURABLE_AGENT_KEY": key})


def _json(result):
    return json.loads(result.content[0].text)


async def story_over_stdio(params):
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        return await story(session)


def story_setup() -> str:
    """An agent of `studio` that may send emails (its key is returned), and
    a proposal of another tenant under a key it will ask for."""
    tenant = tenant_ensure(slug="studio", name="Studio")
    agent, issued = agent_create(tenant=tenant, name="claude", actor="test", actions=["connectors.send_email"])
    other, _ = agent_create(tenant=tenant_ensure(slug="other"), name="x", actor="test")
    proposal_propose(agent=other, proposal=ProposalIn(action="connectors.send_email", key="elsewhere-1",
                                                      rationale="theirs", payload=EMAIL))
    return issued.key


async def story(session: ClientSession) -> dict:
    """Every tool as an agent uses it, through a session of either transport."""
    await session.initialize()
    call = session.call_tool
    email = {"action": "connectors.send_email", "key": "mcp-1", "rationale": "the customer asked", "payload": EMAIL}
    return {
        "tools": {tool.name: tool for tool in (await session.list_tools()).tools},
        "actions": await call("list_actions", {}),
        "proposed": await call("propose", email),
        "again": await call("propose", email),
        "conflict": await call("propose", {**email, "rationale": "x", "payload": {**EMAIL, "subject": "other"}}),
        "invalid": await call("propose", {**email, "key": "mcp-2", "payload": {"to": "nobody"}}),
        "status": await call("proposal_status", {"key": "mcp-1"}),
        "missing": await call("proposal_status", {"key": "elsewhere-1"}),
        "listed": await call("list_proposals", {}),
    }


def assert_story(told: dict) -> None:
    """The answers of `story`: the HTTP API's, tool errors carrying its problems."""
    assert set(told["tools"]) == {"list_actions", "propose", "proposal_status", "list_proposals"}
    propose_schema = told["tools"]["propose"].input_schema
    assert propose_schema["properties"]["action"]["enum"] == ["connectors.send_email"]
    # The payload's schema is the action's own declaration, and says it is an
    # object (clients that build arguments from the schema send it as one).
    assert propose_schema["properties"]["payload"]["type"] == "object"
    assert propose_schema["properties"]["payload"]["anyOf"][0]["properties"]["to"]["format"] == "email"
    assert [a["name"] for a in _json(told["actions"])] == ["connectors.send_email"]

    proposed, again = told["proposed"], told["again"]
    assert not proposed.is_error and _json(proposed)["created"] is True
    assert _json(proposed)["state"] == "WAITING_REVIEW"
    assert not again.is_error and _json(again)["created"] is False
    assert told["conflict"].is_error and _json(told["conflict"])["status"] == 409
    invalid = told["invalid"]
    assert invalid.is_error and _json(invalid)["status"] == 422
    assert ["body", "payload", "subject"] in [e["loc"] for e in _json(invalid)["errors"]]
    assert _json(told["status"])["key"] == "mcp-1" and _json(told["status"])["decision"] is None
    assert told["missing"].is_error and _json(told["missing"])["status"] == 404
    assert [item["key"] for item in _json(told["listed"])["items"]] == ["mcp-1"]


def test_an_mcp_client_lists_tools_proposes_and_reads_the_status(manage, transactional_db):
    key = story_setup()
    assert_story(anyio.run(story_over_stdio, _session(manage, key)))


def test_the_mcp_server_refuses_to_start_without_a_valid_key_and_never_prints_it(manage, transactional_db):
    tenant = tenant_ensure(slug="studio")
    agent, issued = agent_create(tenant=tenant, name="claude", actor="test")
    agent_key_revoke(agent=agent, prefix=issued.prefix, actor="test")
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), "mcp_server"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env={**manage.env, "DURABLE_AGENT_KEY": issued.key})
    assert result.returncode != 0
    assert "no valid API key" in result.stderr
    secret = issued.key.split("_", 2)[2]
    assert secret not in result.stderr + result.stdout
