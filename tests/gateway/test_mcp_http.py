"""MCP over Streamable HTTP at `/mcp`, as agents on other machines use it:
the production server (`durable.server`: uvicorn serving `durable.asgi`)
started as a real process on the test database, reached with the `mcp` SDK's
Streamable HTTP client and the OpenAI Agents SDK's `MCPServerStreamableHttp`
(no model is called: it connects, lists and calls tools)."""

import json
import shutil
import subprocess
import sys

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
from tests.conftest import ROOT

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


# The MCP Inspector's CLI, when npx and the package are in npm's cache (run
# `npx -y @modelcontextprotocol/inspector@<version> --help` once to cache it):
# the current one over HTTP, and 0.15.0, which builds each argument from the
# property's declared `type` (over stdio: it sends no headers).
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
INSPECTOR_BY_TYPE = "@modelcontextprotocol/inspector@0.15.0"
PROPOSE_ARGS = ["--tool-arg", "action=connectors.send_email", "--tool-arg", "rationale=asked",
                "--tool-arg", "payload=" + json.dumps(EMAIL)]


def _inspector(package: str, *target: str, method: str, env=None) -> dict:
    if shutil.which("npx") is None:
        pytest.skip("needs npx (Node.js)")
    result = subprocess.run(["npx", "--offline", "-y", package, "--cli", *target, "--method", method[0], *method[1:]],
                            capture_output=True, text=True, timeout=180, env=env)
    if "ENOTCACHED" in result.stderr or "cache mode is 'only-if-cached'" in result.stderr:
        pytest.skip(f"{package} is not in npm's cache")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_the_mcp_inspector_cli_calls_every_tool(mcp_url, manage):
    key = story_setup()
    http = [mcp_url, "--transport", "http", "--header", f"Authorization: Bearer {key}"]
    listed = _inspector(INSPECTOR, *http, method=["tools/list"])
    assert {tool["name"] for tool in listed["tools"]} == {"list_actions", "propose", "proposal_status",
                                                          "list_proposals"}
    calls = {
        "list_actions": [],
        "propose": ["--tool-arg", "key=inspector-1", *PROPOSE_ARGS],
        "proposal_status": ["--tool-arg", "key=inspector-1"],
        "list_proposals": ["--tool-arg", "state=WAITING_REVIEW"],
    }
    for tool, arguments in calls.items():
        answer = _inspector(INSPECTOR, *http, method=["tools/call", "--tool-name", tool, *arguments])
        assert answer["isError"] is False, (tool, answer)
    stdio = ["-e", f"DURABLE_AGENT_KEY={key}", "-e", f"DATABASE_URL={manage.env['DATABASE_URL']}",
             sys.executable, str(ROOT / "manage.py"), "mcp_server"]
    by_type = _inspector(INSPECTOR_BY_TYPE, *stdio,
                         method=["tools/call", "--tool-name", "propose", "--tool-arg", "key=inspector-2", *PROPOSE_ARGS])
    assert by_type["isError"] is False, by_type
