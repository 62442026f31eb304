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

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlsplit

from connectors.http_exchange import (  # noqa: F401 - parse_retry_after is part of this module's API
    Endpoint,
    ExchangeLimits,
    HttpAnswer,
    http_exchange,
    parse_retry_after,
    provider_error,
)
from connectors.base import (
    ACCEPTED,
    Capabilities,
    Connector,
    NotSupported,
    ProviderAccepted,
    ProviderLookupAmbiguous,
    ProviderOutcomeUnknown,
    redact_credentials,
)

USER_AGENT = "durable-workers-connector/1"

# Larger answers are not read: a receipt or a lookup page is a few KiB.
DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024


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
        raise provider_error(answer, evidence)

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
            raise provider_error(answer, evidence)
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

    def _exchange(self, method: str, path: str, *, body: bytes | None, headers: dict[str, str]) -> HttpAnswer:
        return http_exchange(
            Endpoint(self._scheme, self._host, self._port), method, f"{self._path_prefix}{path}", body=body,
            headers={**headers, "Authorization": f"Bearer {self.api_key}", "Accept": "application/json",
                     "User-Agent": USER_AGENT},
            limits=ExchangeLimits(self.connect_timeout, self.read_timeout, self.total_timeout,
                                  self.max_response_bytes),
            describe=f"{method} {self.base_url}{path}", provider=self.name,
        )

    def _receipt(self, message: Any, answer: HttpAnswer, evidence: dict[str, Any]) -> ProviderAccepted:
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
