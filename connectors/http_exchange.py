"""One HTTP exchange with a provider, classified by when it failed.

Every connector that speaks HTTP makes its calls here: one request on a
fresh connection — no retries, no redirects followed, no connection reuse —
bounded by a connect timeout, a timeout per socket operation, an overall
deadline and a maximum answer size. A failure while connecting means no
request byte left (`ProviderUnavailable`); any failure after that, or an
answer too large to read, means the provider may have acted on it
(`ProviderOutcomeUnknown`).

`Endpoint.address`, when set, is the IP address to connect to instead of
resolving the host again: a caller that checked where a host resolves to
(the callback connector's SSRF guard) connects to exactly that address,
while TLS still verifies the certificate for the host name.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from email.message import Message
from email.utils import parsedate_to_datetime
from typing import Any

from connectors.base import (
    ProviderAuthFailed,
    ProviderError,
    ProviderIdempotencyConflict,
    ProviderIdempotencyMismatch,
    ProviderOutcomeUnknown,
    ProviderRejected,
    ProviderThrottled,
    ProviderUnavailable,
)

# Used when a 429 carries no usable Retry-After.
DEFAULT_RETRY_AFTER_SECONDS = 1.0

# The response headers worth keeping as evidence on a receipt or an error.
EVIDENCE_HEADERS = ("Request-Id", "Idempotent-Replayed", "Retry-After")


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        """The decoded JSON body, or ``None`` when it is not JSON."""
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None

    def evidence(self, **extra: Any) -> dict[str, Any]:
        headers = {name: self.headers[name] for name in EVIDENCE_HEADERS if self.headers.get(name) is not None}
        body = self.json()
        return {
            "status_code": self.status,
            "headers": headers,
            "response": body if body is not None else self.body[:500].decode("utf-8", "replace"),
            **extra,
        }


@dataclass(frozen=True)
class Endpoint:
    scheme: str  # "http" or "https"
    host: str
    port: int | None = None
    address: str | None = None  # connect here instead of resolving `host` again


@dataclass(frozen=True)
class ExchangeLimits:
    connect_timeout: float
    read_timeout: float
    total_timeout: float
    max_response_bytes: int


def _connection(endpoint: Endpoint, timeout: float) -> http.client.HTTPConnection:
    connection_class = http.client.HTTPSConnection if endpoint.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(endpoint.host, endpoint.port, timeout=timeout)
    if endpoint.address is not None:
        pinned = endpoint.address

        def create_connection(address, timeout=None, source_address=None):
            return socket.create_connection((pinned, address[1]), timeout, source_address)

        # http.client connects through this attribute; TLS then wraps the
        # socket with server_hostname=host, so the certificate is still checked.
        connection._create_connection = create_connection
    return connection


def http_exchange(endpoint: Endpoint, method: str, path: str, *, body: bytes | None, headers: dict[str, str],
                  limits: ExchangeLimits, describe: str, provider: str) -> HttpAnswer:
    """Send one request and read its answer. Raises `ProviderUnavailable`
    (connecting failed: nothing was sent) or `ProviderOutcomeUnknown`
    (anything after that: it may have been received and acted on)."""
    connection = _connection(endpoint, limits.connect_timeout)
    # The overall deadline: per-operation timeouts cannot stop a peer that
    # sends one byte just before each would expire, so a timer shuts the
    # socket at the deadline and the blocked read returns.
    expired = threading.Event()
    opened: list[socket.socket] = []  # the response keeps the socket after the connection lets go of it

    def expire() -> None:
        expired.set()
        for sock in opened:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    deadline = threading.Timer(limits.total_timeout, expire)
    deadline.daemon = True
    deadline.start()
    try:
        try:
            connection.connect()
        except OSError as exc:
            # Nothing was written to the provider: the message cannot exist.
            raise ProviderUnavailable(
                f"cannot connect for {describe}: {exc!r}",
                evidence={"request": describe, "error": repr(exc), "provider": provider},
            ) from exc
        connection.sock.settimeout(limits.read_timeout)
        opened.append(connection.sock)
        if expired.is_set():  # the deadline passed while connecting
            expire()
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            answer = _read_bounded(response, limits.max_response_bytes, describe=describe, provider=provider)
            if expired.is_set():
                raise TimeoutError("deadline passed")  # the socket was shut under a read
            return HttpAnswer(response.status, response.headers, answer)
        except (OSError, http.client.HTTPException) as exc:
            # Covers read timeouts, resets and RemoteDisconnected: some or
            # all of the request may have been received and acted on.
            error = TimeoutError(f"the whole exchange took longer than {limits.total_timeout:g}s") \
                if expired.is_set() else exc
            raise ProviderOutcomeUnknown(
                f"no answer for {describe} after sending: {error!r}",
                evidence={"request": describe, "error": repr(error), "provider": provider},
            ) from exc
    finally:
        deadline.cancel()
        connection.close()


def _read_bounded(response: http.client.HTTPResponse, limit: int, *, describe: str, provider: str) -> bytes:
    """The body, or ``ProviderOutcomeUnknown`` past `limit` bytes (the
    provider answered something, but not a receipt we can trust)."""
    body = response.read(limit + 1)
    if len(body) > limit:
        raise ProviderOutcomeUnknown(
            f"the answer to {describe} is larger than {limit} bytes; not read",
            status=response.status, evidence={"provider": provider, "status_code": response.status},
        )
    return body


def parse_retry_after(value: str | None, *, default: float = DEFAULT_RETRY_AFTER_SECONDS) -> float:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or HTTP-date).

    Never negative; ``default`` when the header is absent or unreadable.
    """
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def provider_error(answer: HttpAnswer, evidence: dict[str, Any]) -> ProviderError:
    """What a provider's non-success answer means (see `connectors.base`)."""
    status = answer.status
    document = answer.json()
    document = document if isinstance(document, dict) else {}
    code = document.get("error")
    detail = str(document.get("detail") or code or f"HTTP {status}")
    if status in (401, 403):
        return ProviderAuthFailed(detail, status=status, evidence=evidence)
    if status == 429:
        retry_after = parse_retry_after(answer.headers.get("Retry-After"))
        return ProviderThrottled(detail, retry_after=retry_after, status=status, evidence=evidence)
    if status == 409:
        return ProviderIdempotencyConflict(detail, status=status, evidence=evidence)
    if status == 422 and code == "idempotency_error":
        return ProviderIdempotencyMismatch(detail, status=status, evidence=evidence)
    if 400 <= status < 500:
        # 400, 404, 422 validation_error...: the same request will be
        # refused again, so it is permanent.
        return ProviderRejected(detail, status=status, evidence=evidence)
    # 5xx, and anything we do not understand: the provider may have
    # acted on the request before failing to answer properly.
    return ProviderOutcomeUnknown(detail, status=status, evidence=evidence)
