"""The agent gateway over MCP (DESIGN §15), with the official `mcp` SDK.

Four tools, the same services and answers as the HTTP API:

- `list_actions` — the actions this agent may propose (as `GET /api/v1/actions`);
- `propose` — arguments as the POST body (`action`, `key`, `rationale`,
  `payload`, `subject`); its input schema lists the agent's actions and, for
  the payload, each action's own schema;
- `proposal_status` — `key`: one proposal (as `GET /api/v1/proposals/{key}`);
- `list_proposals` — `state`, `cursor` (as `GET /api/v1/proposals`).

A refusal is a tool error (`isError`) whose text is the same problem
document the API answers (`status`, `title`, `detail`, `errors`), so an agent
reads 409, 422, 423 or 429 the same way over either.

One server definition serves both transports; only where the agent's key
comes from differs: `DURABLE_AGENT_KEY` for `manage.py mcp_server` (stdio),
each HTTP request's `Authorization: Bearer` for `/mcp` (`gateway.mcp_http`).
The key is authenticated again on every call, so a key revoked (or an agent
paused) while a client stays connected takes effect at once.
"""

import json
from collections.abc import Callable

import mcp_types as types
from asgiref.sync import sync_to_async
from django.db import close_old_connections
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from pydantic import ValidationError

from jobs.states import State

from .problems import Refused, field_errors
from .schemas import ProposalIn, payload_alternatives
from .services import actions_list, agent_actions, agent_from_key, proposal_propose, proposal_read, proposals_list

SERVER_NAME = "durable-workers"


def _propose_schema(actions: list[str]) -> dict:
    """ProposalIn's JSON Schema with this agent's actions as an enum and the
    payload as one of their schemas (each action's own declaration).

    The payload says `"type": "object"` beside its alternatives: clients that
    build arguments from a form or a command line (the MCP Inspector) read
    the property's own `type` to decide how to send a value, and without it
    send the JSON object as a string."""
    schema = ProposalIn.model_json_schema()
    payloads, definitions = payload_alternatives(actions)
    schema.setdefault("$defs", {}).update(definitions)
    schema["properties"]["action"] = {**schema["properties"]["action"], "enum": actions}
    if payloads:
        schema["properties"]["payload"] = {"type": "object", "description": "As the chosen action's schema says.",
                                           "anyOf": payloads}
    return schema


def _tools(key: str) -> list[types.Tool]:
    actions = agent_actions(agent_from_key(key))
    return [
        types.Tool(name="list_actions", description="The actions you may propose: what each does, whether the "
                   "tenant's policy sends it to a reviewer, and its payload's JSON Schema.",
                   input_schema={"type": "object", "properties": {}, "additionalProperties": False}),
        types.Tool(name="propose", description="Propose work. The same key with the same action and payload again "
                   "returns the existing proposal (created: false); other content under a key is refused (409). "
                   "The tenant's policy decides whether a reviewer approves it first.",
                   input_schema=_propose_schema(actions)),
        types.Tool(name="proposal_status", description="One proposal of your tenant by its key: its state, the "
                   "reviewer's decision and the outcome with receipts.",
                   input_schema={"type": "object", "required": ["key"], "additionalProperties": False,
                                 "properties": {"key": {"type": "string", "maxLength": 200}}}),
        types.Tool(name="list_proposals", description="Your proposals, newest first, a page at a time; pass "
                   "the answer's `next` as `cursor` for the next page.",
                   input_schema={"type": "object", "additionalProperties": False, "properties": {
                       "state": {"type": "string", "enum": list(State.values)},
                       "cursor": {"type": "string", "maxLength": 64}}}),
    ]


def call_tool(key: str, name: str, arguments: dict | None) -> dict | list:
    """Run one tool for the agent of `key` (synchronously: the ORM); raises `Refused`."""
    agent = agent_from_key(key)
    arguments = arguments or {}
    if name == "list_actions":
        return actions_list(agent)
    if name == "propose":
        try:
            proposal = ProposalIn.model_validate(arguments)
        except ValidationError as exc:
            raise Refused(422, "validation-error", "the request does not match its schema",
                          errors=field_errors(exc.errors(), prefix=("body",))) from None
        view, created = proposal_propose(agent=agent, proposal=proposal)
        return {**view, "created": created}
    if name == "proposal_status":
        return proposal_read(agent=agent, key=str(arguments.get("key", "")))
    if name == "list_proposals":
        state, cursor = arguments.get("state"), arguments.get("cursor")
        if state is not None and not isinstance(state, str) or cursor is not None and not isinstance(cursor, str):
            raise Refused(422, "validation-error", "state and cursor are strings")
        return proposals_list(agent=agent, state=state, cursor=cursor or None)
    raise Refused(404, "unknown-tool", f"no tool {name!r}")


def _answer(value) -> types.CallToolResult:
    text = json.dumps(value)
    return types.CallToolResult(content=[types.TextContent(text=text)],
                                structured_content=value if isinstance(value, dict) else None)


def with_database(function):
    """`function` run in a worker thread with the ORM, its database connection
    handled as Django handles a request's (dropped when too old or broken,
    before and after), since no request cycle surrounds an MCP message."""

    def run(*args):
        close_old_connections()
        try:
            return function(*args)
        finally:
            close_old_connections()

    # Not thread-sensitive: tool calls of concurrent clients run side by side,
    # each on its own thread's connection.
    return sync_to_async(run, thread_sensitive=False)


AgentKey = Callable[[ServerRequestContext], str]


def build_server(agent_key: AgentKey) -> Server:
    """The MCP server; `agent_key(ctx)` is the key of the agent a message
    comes from (the same for a whole stdio session; each HTTP request's own)."""

    async def on_list_tools(ctx, params) -> types.ListToolsResult:
        try:
            tools = await with_database(_tools)(agent_key(ctx))
        except Refused:
            tools = []  # a key no longer valid: nothing to offer (every call says why)
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            value = await with_database(call_tool)(agent_key(ctx), params.name, params.arguments)
        except Refused as refused:
            return types.CallToolResult(content=[types.TextContent(text=json.dumps(refused.problem()))],
                                        structured_content=refused.problem(), is_error=True)
        return _answer(value)

    return Server(SERVER_NAME, version="1", instructions="Propose work for your tenant; the tenant's policy and "
                  "its reviewers decide. Read the outcome with proposal_status.",
                  on_list_tools=on_list_tools, on_call_tool=on_call_tool)
