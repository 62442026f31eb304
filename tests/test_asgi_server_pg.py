"""The production server (durable.asgi under uvicorn) on PostgreSQL: each
request's sync work runs on a thread of its own there, so a connection kept
past its request would never be reused and would stay open until the
database refuses new clients: it takes them from a pool instead."""

import subprocess
import urllib.request

import pytest
from django.db import connection

from company.services import tenant_ensure
from durable.net import free_port
from durable.server import server_start, server_stop
from gateway.services import agent_create

pytestmark = [pytest.mark.postgres, pytest.mark.acceptance]


def _server_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


def test_the_asgi_server_holds_no_connection_per_request(manage):
    _, issued = agent_create(tenant=tenant_ensure(slug="studio"), name="bench", actor="test")
    port = free_port()
    process = server_start(port=port, env=manage.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(60):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/actions",
                                             headers={"Authorization": f"Bearer {issued.key}"})
            with urllib.request.urlopen(request, timeout=30) as answer:
                assert answer.status == 200
        assert _server_connections() <= 4  # its pool (WEB_DATABASE_POOL_SIZE)
    finally:
        server_stop(process)
