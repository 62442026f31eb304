"""Plain helpers shared by the connector tests (fixtures live in conftest.py)."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

EMAIL = {"to": "ada@example.com", "subject": "Your quote Q-1", "body": "Please find your quote attached."}

# The customer-visible effect of a message, per DESIGN §10.
LISTING_KEYS = {"id", "idempotency_key", "client_reference", "to", "subject", "accepted_at"}


def message(client_reference: str, **overrides: Any) -> dict[str, Any]:
    """A valid POST /v1/messages body."""
    return {**EMAIL, "client_reference": client_reference, **overrides}


@dataclass
class RawAnswer:
    status: int
    headers: http.client.HTTPMessage
    body: Any


def raw_request(
    url: str,
    method: str,
    path: str,
    *,
    body: Any = None,
    raw_body: bytes | None = None,
    headers: dict[str, str] | None = None,
    auth: bool = True,
    timeout: float = 5.0,
) -> RawAnswer:
    """One plain HTTP exchange with the simulator, bypassing the connector.

    Raises ``TimeoutError`` when no answer arrives within ``timeout``.
    """
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    if auth:
        all_headers.setdefault("Authorization", "Bearer test-key")
    if raw_body is None and body is not None:
        raw_body = json.dumps(body).encode()
    try:
        connection.request(method, path, body=raw_body, headers=all_headers)
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    return RawAnswer(response.status, response.headers, json.loads(data) if data else None)
