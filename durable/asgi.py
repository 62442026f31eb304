"""The ASGI entry: the whole web app under one ASGI server (uvicorn, see
docs/howto/deploy.md) — Django (console, admin, agent API, webhooks, probes,
static files through WhiteNoise) and, at `/mcp`, the agent gateway's MCP
server over Streamable HTTP (`gateway.mcp_http`), which is not a Django view.

The lifespan protocol is answered here (Django's handler does not speak it):
the MCP server's task group lives from startup to shutdown.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable.settings")
# No database connection outlives its request here (see the settings).
os.environ["DURABLE_ASGI"] = "1"
django_application = get_asgi_application()

from gateway.mcp_http import PATH as MCP_PATH, McpApp  # noqa: E402 - needs the apps loaded above


class Application:
    def __init__(self):
        self.mcp = McpApp()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and scope["path"].rstrip("/") == MCP_PATH:
            await self.mcp(scope, receive, send)
        else:
            await django_application(scope, receive, send)

    async def _lifespan(self, receive, send):
        await receive()  # lifespan.startup
        started = False
        try:
            async with self.mcp.lifespan():
                await send({"type": "lifespan.startup.complete"})
                started = True
                await receive()  # lifespan.shutdown
        except Exception as exc:
            await send({"type": f"lifespan.{'shutdown' if started else 'startup'}.failed", "message": repr(exc)})
            return
        await send({"type": "lifespan.shutdown.complete"})


application = Application()
