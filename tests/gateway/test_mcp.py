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


async def _story(params):
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        actions = _json(await session.call_tool("list_actions", {}))
        proposed = await session.call_tool("propose", {"action": "connectors.send_email", "key": "mcp-1",
                                                       "rationale": "the customer asked", "payload": EMAIL})
        again = await session.call_tool("propose", {"action": "connectors.send_email", "key": "mcp-1",
                                                    "rationale": "the customer asked", "payload": EMAIL})
        conflict = await session.call_tool("propose", {"action": "connectors.send_email", "key": "mcp-1",
                                                       "rationale": "x", "payload": {**EMAIL, "subject": "other"}})
        invalid = await session.call_tool("propose", {"action": "connectors.send_email", "key": "mcp-2",
                                                      "rationale": "x", "payload": {"to": "nobody"}})
        status = await session.call_tool("proposal_status", {"key": "mcp-1"})
        missing = await session.call_tool("proposal_status", {"key": "elsewhere-1"})
        listed = await session.call_tool("list_proposals", {})
        return tools, actions, proposed, again, conflict, invalid, status, missing, listed


def test_an_mcp_client_lists_tools_proposes_and_reads_the_status(manage, transactional_db):
    tenant = tenant_ensure(slug="studio", name="Studio")
    agent, issued = agent_create(tenant=tenant, name="claude", actor="test", actions=["connectors.send_email"])
    # Another tenant's proposal under a key this agent asks for: not found.
    other, _ = agent_create(tenant=tenant_ensure(slug="other"), name="x", actor="test")
    proposal_propose(agent=other, proposal=ProposalIn(action="connectors.send_email", key="elsewhere-1",
                                                      rationale="theirs", payload=EMAIL))

    tools, actions, proposed, again, conflict, invalid, status, missing, listed = anyio.run(
        _story, _session(manage, issued.key))

    assert set(tools) == {"list_actions", "propose", "proposal_status", "list_proposals"}
    propose_schema = tools["propose"].input_schema
    assert propose_schema["properties"]["action"]["enum"] == ["connectors.send_email"]
    # The payload's schema is the action's own declaration.
    assert propose_schema["properties"]["payload"]["anyOf"][0]["properties"]["to"]["format"] == "email"
    assert [a["name"] for a in actions] == ["connectors.send_email"]

    assert not proposed.is_error and _json(proposed)["created"] is True
    assert _json(proposed)["state"] == "WAITING_REVIEW"
    assert not again.is_error and _json(again)["created"] is False
    assert conflict.is_error and _json(conflict)["status"] == 409
    assert invalid.is_error and _json(invalid)["status"] == 422
    assert ["body", "payload", "subject"] in [e["loc"] for e in _json(invalid)["errors"]]
    assert _json(status)["key"] == "mcp-1" and _json(status)["decision"] is None
    assert missing.is_error and _json(missing)["status"] == 404
    assert [item["key"] for item in _json(listed)["items"]] == ["mcp-1"]


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
