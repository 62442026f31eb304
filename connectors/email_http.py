"""An email connector speaking the provider simulator's HTTP API.

One call is one HTTP exchange on a fresh connection: no retries, no redirects,
no connection reuse, so every attempt the operations layer makes is visible to
it and nothing is ever sent twice behind its back.

How a failure is classified depends on *when* it happened:

- while establishing the connection (refused, connect timeout, unknown
  host): no request byte left → ``ProviderUnavailable``;
- after the connection was up (send error, read timeout, reset, the peer
  closing without an answer) or a 5xx: the provider may hold the message →
  ``ProviderOutcomeUnknown``.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from email.message import Message
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urlsplit

from connectors.base import (
    ACCEPTED,
    Capabilities,
    Connector,
    NotSupported,
    ProviderAccepted,
    ProviderAuthFailed,
    ProviderError,
    ProviderIdempotencyConflict,
    ProviderIdempotencyMismatch,
    ProviderLookupAmbiguous,
    ProviderOutcomeUnknown,
    ProviderRejected,
    ProviderThrottled,
    ProviderUnavailable,
    redact_credentials,
)

# Used when a 429 carries no usable Retry-After.
DEFAULT_RETRY_AFTER_SECONDS = 1.0

# The response headers worth keeping as evidence on a receipt or an error.
EVIDENCE_HEADERS = ("Request-Id", "Idempotent-Replayed", "Retry-After")

USER_AGENT = "durable-workers-connector/1"

# Larger answers are not read: a receipt or a lookup page is a few KiB.
DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class _HttpAnswer:
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


class HttpEmailConnector(Connector):
    """Sends email through the simulator's HTTP API (or a provider speaking it).

    ``mode_capabilities`` is the provider's *declaration*; the connector
    trusts it and never probes the provider (DESIGN §10): it sends
    ``Idempotency-Key`` only when ``idempotency_key`` is declared, and its
    ``lookup`` raises ``NotSupported`` unless ``lookup`` is declared.

    ``connect_timeout`` bounds establishing the connection; ``read_timeout``
    bounds each socket operation after that (sending, waiting for the answer);
    ``total_timeout`` bounds the whole exchange (default: connect + 2 × read),
    so a server that drips its answer a byte at a time cannot hold a worker
    past it. An answer longer than ``max_response_bytes`` is not read.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        mode_capabilities: Capabilities,
        connect_timeout: float,
        read_timeout: float,
        *,
        name: str = "email-http",
        total_timeout: float | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base_url must be an http(s) URL, not {redact_credentials(base_url)!r}")
        # Credentials in the URL are never sent (the API key is) and never
        # shown: this is the URL as errors, evidence and repr name it.
        self.base_url = redact_credentials(base_url.rstrip("/"))
        self._scheme = url.scheme
        self._host = url.hostname
        self._port = url.port
        self._path_prefix = url.path.rstrip("/")
        self.api_key = api_key
        self.capabilities = mode_capabilities
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.total_timeout = float(total_timeout) if total_timeout else float(connect_timeout) + 2 * float(read_timeout)
        self.max_response_bytes = max_response_bytes
        self.name = name

    def __repr__(self) -> str:
        return f"<HttpEmailConnector {self.name} {self.base_url} {self.capabilities}>"

    # -- the contract -------------------------------------------------------

    def send(
        self,
        request: Mapping[str, Any],
        *,
        idempotency_key: str,
        client_reference: str,
    ) -> ProviderAccepted:
        """POST the message once; see ``Connector.send``.

        ``request`` supplies ``to``, ``subject`` and ``body``; validating them
        is the provider's job (a bad one comes back as ``ProviderRejected``).
        The JSON body is canonical (sorted keys), so a resend of the same
        request is byte-identical and an idempotent provider replays it.

        Raises ``ProviderUnavailable``, ``ProviderOutcomeUnknown``,
        ``ProviderRejected``, ``ProviderAuthFailed``, ``ProviderThrottled``,
        ``ProviderIdempotencyConflict`` or ``ProviderIdempotencyMismatch``.
        """
        if self.capabilities.idempotency_key and not idempotency_key:
            raise ValueError("idempotency_key is required by a provider that declares idempotency")
        payload = {
            "to": request.get("to"),
            "subject": request.get("subject"),
            "body": request.get("body"),
            "client_reference": client_reference,
        }
        headers = {"Content-Type": "application/json"}
        sent_key = idempotency_key if self.capabilities.idempotency_key else None
        if sent_key is not None:
            headers["Idempotency-Key"] = sent_key
        body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")
        answer = self._exchange("POST", "/v1/messages", body=body, headers=headers)
        evidence = answer.evidence(idempotency_key_sent=sent_key, provider=self.name)
        if answer.status in (200, 201):
            return self._receipt(answer.json(), answer, evidence)
        raise self._error_for(answer, evidence)

    def lookup(self, client_reference: str) -> ProviderAccepted | None:
        """Find the message for ``client_reference``; see ``Connector.lookup``.

        Only a message whose own ``client_reference`` is exactly ours counts:
        a provider whose lookup ignores or loosens the filter must not make us
        adopt someone else's message. None carrying it → ``None``; more than
        one (a provider without idempotency accepted a resend) →
        ``ProviderLookupAmbiguous`` with all of them as evidence, never a
        guess. A timeout raises ``ProviderOutcomeUnknown``: the lookup's
        answer, not the message, is unknown.
        """
        if not self.capabilities.lookup:
            raise NotSupported(f"provider {self.name} does not declare lookup")
        path = f"/v1/messages?client_reference={quote(client_reference, safe='')}"
        answer = self._exchange("GET", path, body=None, headers={})
        evidence = answer.evidence(lookup_client_reference=client_reference, provider=self.name)
        if answer.status != 200:
            raise self._error_for(answer, evidence)
        document = answer.json()
        matches = document.get("data") if isinstance(document, dict) else None
        if not isinstance(matches, list) or not all(isinstance(m, dict) for m in matches):
            raise ProviderOutcomeUnknown("lookup answer is not readable", status=answer.status, evidence=evidence)
        ours = [m for m in matches if m.get("client_reference") == client_reference]
        evidence["ignored"] = len(matches) - len(ours)  # listed by the provider, but not ours
        evidence["response"] = ours
        if not ours:
            return None
        if len(ours) > 1:
            ids = ", ".join(str(m.get("id")) for m in ours)
            raise ProviderLookupAmbiguous(
                f"the provider holds {len(ours)} messages for client reference {client_reference} ({ids})",
                status=answer.status, evidence={**evidence, "matches": len(ours)},
            )
        evidence["matches"] = 1
        evidence["response"] = ours[0]
        return self._receipt(ours[0], answer, evidence)

    # -- plumbing -----------------------------------------------------------

    def _exchange(self, method: str, path: str, *, body: bytes | None, headers: dict[str, str]) -> _HttpAnswer:
        connection_class = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        connection = connection_class(self._host, self._port, timeout=self.connect_timeout)
        target = f"{method} {self.base_url}{path}"
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

        deadline = threading.Timer(self.total_timeout, expire)
        deadline.daemon = True
        deadline.start()
        try:
            try:
                connection.connect()
            except OSError as exc:
                # Nothing was written to the provider: the message cannot exist.
                raise ProviderUnavailable(
                    f"cannot connect to {self.base_url}: {exc!r}",
                    evidence={"request": target, "error": repr(exc), "provider": self.name},
                ) from exc
            connection.sock.settimeout(self.read_timeout)
            opened.append(connection.sock)
            if expired.is_set():  # the deadline passed while connecting
                expire()
            try:
                connection.request(
                    method,
                    f"{self._path_prefix}{path}",
                    body=body,
                    headers={
                        **headers,
                        "Authorization": f"Bearer {self.api_key}",
                        "Accept": "application/json",
                        "User-Agent": USER_AGENT,
                    },
                )
                response = connection.getresponse()
                body = self._read_bounded(response)
                if expired.is_set():
                    raise TimeoutError("deadline passed")  # the socket was shut under a read
                return _HttpAnswer(response.status, response.headers, body)
            except (OSError, http.client.HTTPException) as exc:
                # Covers read timeouts, resets and RemoteDisconnected: some or
                # all of the request may have been received and acted on.
                error = TimeoutError(f"the whole exchange took longer than {self.total_timeout:g}s") \
                    if expired.is_set() else exc
                raise ProviderOutcomeUnknown(
                    f"no answer from {self.base_url} after sending: {error!r}",
                    evidence={"request": target, "error": repr(error), "provider": self.name},
                ) from exc
        finally:
            deadline.cancel()
            connection.close()

    def _read_bounded(self, response: http.client.HTTPResponse) -> bytes:
        """The body, or ``ProviderOutcomeUnknown`` past ``max_response_bytes``
        (the provider answered something, but not a receipt we can trust)."""
        body = response.read(self.max_response_bytes + 1)
        if len(body) > self.max_response_bytes:
            raise ProviderOutcomeUnknown(
                f"the answer from {self.base_url} is larger than {self.max_response_bytes} bytes; not read",
                status=response.status, evidence={"provider": self.name, "status_code": response.status},
            )
        return body

    def _receipt(self, message: Any, answer: _HttpAnswer, evidence: dict[str, Any]) -> ProviderAccepted:
        try:
            reference = message["id"]
            accepted_at = datetime.fromisoformat(message["accepted_at"])
            if not isinstance(reference, str) or not reference:
                raise ValueError("empty id")
        except (TypeError, KeyError, ValueError) as exc:
            # The provider said yes but we cannot read its receipt: it holds
            # the message, so this is "unknown", to be reconciled, not failed.
            raise ProviderOutcomeUnknown(
                f"accepted answer without a readable receipt: {exc!r}", status=answer.status, evidence=evidence
            ) from exc
        if accepted_at.tzinfo is None:
            accepted_at = accepted_at.replace(tzinfo=timezone.utc)
        replayed = (answer.headers.get("Idempotent-Replayed") or "").lower() == "true"
        return ProviderAccepted(
            provider_reference=reference,
            accepted_at=accepted_at,
            status=ACCEPTED,
            evidence=evidence,
            replayed=replayed,
        )

    @staticmethod
    def _error_for(answer: _HttpAnswer, evidence: dict[str, Any]) -> ProviderError:
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
