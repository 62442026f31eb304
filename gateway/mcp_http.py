"""The agent gateway's MCP server over Streamable HTTP at `/mcp` (DESIGN §15),
mounted beside Django by the ASGI entry (`durable.asgi`).

The tools are `gateway.mcp`'s, through the same services as the HTTP API and
the stdio server. Every request carries the agent's key as
`Authorization: Bearer dwk_…`: a request without a valid one is answered 401
(the API's problem document) before the MCP layer sees it, and each tool
call authenticates the key again, so a key revoked or an agent paused while
a client stays connected takes effect on its next call.

Stateless, JSON answers: no session lives in one process's memory, so any
worker of any instance answers any request (no sticky sessions), and a
restart loses nothing. The body limit is the HTTP API's
(`GATEWAY_MAX_BODY_BYTES`).
"""

import json

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from .api import max_body_bytes
from .mcp import build_server, with_database
from .problems import PROBLEM_CONTENT_TYPE, Refused
from .services import agent_authenticate

PATH = "/mcp"


def _authorization(headers) -> str:
    return next((value.decode("latin-1") for name, value in headers if name == b"authorization"), "")


def request_key(ctx) -> str:
    """The key in the HTTP request that carried this MCP message (already
    checked to be `Bearer <key>` by `McpApp`; checked again by each call)."""
    scheme, _, token = (ctx.request.headers.get("authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def _problem(send, refused: Refused) -> None:
    body = json.dumps(refused.problem()).encode()
    headers = [(b"content-type", PROBLEM_CONTENT_TYPE.encode()), (b"content-length", str(len(body)).encode())]
    if refused.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="durable-workers"'))
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class McpApp:
    """The ASGI application of `/mcp`. `lifespan()` must be entered once
    for the process's life (the ASGI lifespan) before it answers."""

    def __init__(self):
        self.manager = StreamableHTTPSessionManager(
            app=build_server(request_key), stateless=True, json_response=True,
            max_request_body_size=max_body_bytes())

    def lifespan(self):
        return self.manager.run()

    async def __call__(self, scope, receive, send) -> None:
        try:
            await with_database(agent_authenticate)(_authorization(scope["headers"]))
        except Refused as refused:
            await _problem(send, refused)
            return
        await self.manager.handle_request(scope, receive, send)
