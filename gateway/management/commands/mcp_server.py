"""`manage.py mcp_server`: the agent gateway over MCP on stdio (DESIGN §15)."""

import os

import anyio
from django.core.management.base import BaseCommand, CommandError
from mcp.server.stdio import stdio_server

from gateway.mcp import build_server
from gateway.problems import Refused
from gateway.services import agent_from_key

KEY_ENV = "DURABLE_AGENT_KEY"


class Command(BaseCommand):
    help = (f"Speak MCP over stdin/stdout for the agent whose API key is in {KEY_ENV}: tools list_actions, "
            f"propose, proposal_status and list_proposals, with the HTTP API's semantics and errors.")

    def handle(self, *args, **options):
        key = os.environ.get(KEY_ENV, "").strip()
        try:
            agent = agent_from_key(key)
        except Refused:
            # Never repeat the key: only whether one was given.
            raise CommandError(f"{KEY_ENV} {'holds no valid API key' if key else 'is not set'} "
                               f"(missing, malformed or revoked)") from None
        self.stderr.write(f"mcp_server: agent {agent.name} of tenant {agent.tenant.slug}, on stdio")
        server = build_server(lambda ctx: key)

        async def serve():
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())

        anyio.run(serve)
