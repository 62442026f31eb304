"""MCP over Streamable HTTP at `/mcp`, as agents on other machines use it:
the production server (`durable.server`: uvicorn serving `durable.asgi`)
started as a real process on the test database, reached with the `mcp` SDK's
Streamable HTTP client and the OpenAI Agents SDK's `MCPServerStreamableHttp`
(no model is called: it connects, lists and calls tools)."""

import json
import subprocess

import anyio
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from company.services import tenant_ensure
from durable.net import free_port
from durable.server import server_start, server_stop
from gateway.services import agent_create, agent_key_revoke, agent_pause

from .conftest import EMAIL
from .test_mcp import assert_story, story, story_setup

pytestmark = [pytest.mark.acceptance]


@pytest.fixture
def mcp_url(manage):
    """`/mcp` of the production server, on the test database."""
    port = free_port()
    process = server_start(port=port, env=manage.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield f"http://127.0.0.1:{port}/mcp"
    server_stop(process)


def _json(result):
    return json.loads(result.content[0].text)


async def _over_http(url: str, key: str, work):
    async with (create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as client,
                streamable_http_client(url, http_client=client) as (read, write),
                ClientSession(read, write) as session):
        return await work(session)


def test_an_mcp_client_over_http_lists_and_calls_every_tool(mcp_url):
    key = story_setup()
    assert_story(anyio.run(_over_http, mcp_url, key, story))


def test_http_without_a_valid_key_is_refused_before_mcp_and_a_revoked_key_at_its_next_call(mcp_url):
    tenant = tenant_ensure(slug="studio")
    agent, issued = agent_create(tenant=tenant, name="claude", actor="test")
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                             "clientInfo": {"name": "test", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream"}
    for authorization in (None, "Bearer dwk_0000000000_" + "x" * 43, f"Basic {issued.key}"):
        answer = httpx2.post(mcp_url, json=initialize,
                             headers={**headers, **({"Authorization": authorization} if authorization else {})})
        assert answer.status_code == 401
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["status"] == 401 and answer.headers["www-authenticate"].startswith("Bearer")

    async def revoked_meanwhile(session):
        await session.initialize()
        before = await session.call_tool("list_actions", {})
        await anyio.to_thread.run_sync(lambda: agent_key_revoke(agent=agent, prefix=issued.prefix, actor="test"))
        # As MCP's authorization rules say: an invalid token is an HTTP 401,
        # which the client raises (no tool runs).
        with pytest.raises(MCPError):
            await session.call_tool("list_actions", {})
        return before

    before = anyio.run(_over_http, mcp_url, issued.key, revoked_meanwhile)
    assert not before.is_error
    # A revoked key opens nothing afterwards.
    answer = httpx2.post(mcp_url, json=initialize, headers={**headers, "Authorization": f"Bearer {issued.key}"})
    assert answer.status_code == 401


def test_over_http_another_tenant_is_walled_off_and_a_paused_agent_may_not_propose(mcp_url):
    ours = story_setup()  # studio's agent; tenant `other` holds elsewhere-1
    other_agent, other_key = agent_create(tenant=tenant_ensure(slug="other"), name="y", actor="test")

    async def as_other(session):
        await session.initialize()
        proposed = await session.call_tool("propose", {"action": "connectors.send_email", "key": "theirs-1",
                                                       "rationale": "asked", "payload": EMAIL})
        return proposed, await session.call_tool("list_proposals", {})

    proposed, listed = anyio.run(_over_http, mcp_url, other_key.key, as_other)
    assert not proposed.is_error and _json(proposed)["created"] is True
    assert [item["key"] for item in _json(listed)["items"]] == ["theirs-1"]  # its own only

    async def as_ours(session):
        await session.initialize()
        return (await session.call_tool("proposal_status", {"key": "theirs-1"}),
                await session.call_tool("list_proposals", {}))

    theirs, ours_listed = anyio.run(_over_http, mcp_url, ours, as_ours)
    assert theirs.is_error and _json(theirs)["status"] == 404
    assert _json(ours_listed)["items"] == []

    agent_pause(agent=other_agent, actor="test", reason="too eager")

    async def paused(session):
        await session.initialize()
        return await session.call_tool("propose", {"action": "connectors.send_email", "key": "theirs-2",
                                                   "rationale": "asked", "payload": EMAIL})

    refused = anyio.run(_over_http, mcp_url, other_key.key, paused)
    assert refused.is_error and _json(refused)["status"] == 423


def test_the_openai_agents_sdk_connects_lists_and_calls_every_tool(mcp_url):
    from agents.mcp import MCPServerStreamableHttp

    key = story_setup()

    async def run():
        server = MCPServerStreamableHttp(params={"url": mcp_url, "headers": {"Authorization": f"Bearer {key}"}},
                                         name="durable-workers", client_session_timeout_seconds=30)
        async with server:
            tools = [tool.name for tool in await server.list_tools()]
            actions = await server.call_tool("list_actions", {})
            proposed = await server.call_tool("propose", {"action": "connectors.send_email", "key": "oa-1",
                                                          "rationale": "asked", "payload": EMAIL})
            status = await server.call_tool("proposal_status", {"key": "oa-1"})
            listed = await server.call_tool("list_proposals", {"state": "WAITING_REVIEW"})
            return tools, actions, proposed, status, listed

    tools, actions, proposed, status, listed = anyio.run(run)
    assert sorted(tools) == sorted(["list_actions", "propose", "proposal_status", "list_proposals"])
    assert [a["name"] for a in _json(actions)] == ["connectors.send_email"]
    assert not proposed.is_error and _json(proposed)["created"] is True
    assert _json(status)["key"] == "oa-1"
    assert [item["key"] for item in _json(listed)["items"]] == ["oa-1"]
