"""A signed webhook: one JSON event POSTed to a URL someone else gave us.

Delivering to a URL an outside party chose is a request made on their
behalf from inside our network, so the destination is checked where it
matters — on the address the host resolves to *at delivery time*, and the
connection goes to exactly that address (a DNS answer that changes between
the check and the connect cannot redirect it):

- `https` only, unless `require_https=False` (development);
- loopback, private, link-local (cloud metadata services live there),
  shared, reserved, multicast and unspecified addresses are refused —
  anything not globally routable — unless `allow_private=True`;
- no credentials in the URL; redirects are never followed (a 3xx is a
  refusal, `ProviderRejected`).

The body is canonical JSON (sorted keys), so a resend is byte-identical; the
event's own id travels as `Idempotency-Key` and receivers deduplicate by it
(a resend after a lost answer is safe: `Capabilities.idempotency_key`).
Signature headers come from the `sign(body) -> headers` function the caller
supplies, so the secret never enters a request that is stored.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from connectors.base import (
    Capabilities,
    Connector,
    NotSupported,
    ProviderAccepted,
    ProviderRejected,
    ProviderUnavailable,
)
from connectors.http_exchange import Endpoint, ExchangeLimits, http_exchange, provider_error

USER_AGENT = "durable-workers-webhook/1"

# A receiver is asked to keep event ids for a week; resends never go past that.
WEBHOOK_CAPABILITIES = Capabilities(idempotency_key=True, lookup=False, retry_ceiling=600.0,
                                    idempotency_retention=7 * 24 * 3600.0)


class DestinationRefused(ValueError):
    """The URL may not be delivered to (scheme, credentials, or an address
    that is not publicly routable). Nothing was sent."""


def _carried_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address leads to: IPv4-mapped, 6to4
    (2002::/16) and Teredo (2001::/32: its server and its client)."""
    carried = [ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())]
    return [address for address in carried if address is not None]


def address_problem(address: str) -> str | None:
    """Why a resolved address may not be called on an outsider's behalf
    (None when it may): only globally routable unicast addresses pass, and
    so must every IPv4 address an IPv6 address carries."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    carried = _carried_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else []
    for candidate in [*carried, ip]:
        named = address if candidate is ip else f"{address} (carrying {candidate})"
        if candidate.is_loopback:
            return f"{named} is a loopback address"
        if candidate.is_link_local:
            return f"{named} is link-local (where cloud metadata services answer)"
        if candidate.is_multicast or candidate.is_unspecified or candidate.is_reserved:
            return f"{named} is not a unicast address"
        if candidate.is_private or not candidate.is_global:
            return f"{named} is a private or non-routable address"
    return None


def url_problem(url: str, *, require_https: bool) -> str | None:
    """Why `url` is not a deliverable webhook URL on its face (None when it
    is); the address it resolves to is checked again at each delivery."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a URL: {exc}"
    allowed = ("https",) if require_https else ("https", "http")
    if parts.scheme not in allowed:
        return f"the URL must be {' or '.join(allowed)}, not {parts.scheme or 'schemeless'}"
    if not parts.hostname:
        return "the URL has no host"
    if parts.username is not None or parts.password is not None:
        return "the URL may not carry credentials"
    if port == 0:
        return "the URL's port is 0"
    return None


def resolve_destination(url: str, *, allow_private: bool, require_https: bool) -> Endpoint:
    """Check `url` and where its host resolves to now; the endpoint to
    connect to (pinned to the checked address). Raises `DestinationRefused`,
    or `ProviderUnavailable` when the host does not resolve (nothing sent)."""
    problem = url_problem(url, require_https=require_https)
    if problem:
        raise DestinationRefused(problem)
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ProviderUnavailable(f"cannot resolve {parts.hostname}: {exc!r}") from exc
    addresses = sorted({info[4][0] for info in infos})
    if not allow_private:
        # Every address the name has must pass: otherwise a second lookup
        # (by anyone) could land on the refused one.
        for address in addresses:
            problem = address_problem(address)
            if problem:
                raise DestinationRefused(f"{parts.hostname} resolves to {problem}; refused")
    if not addresses:
        raise ProviderUnavailable(f"{parts.hostname} has no address")
    return Endpoint(parts.scheme, parts.hostname, port, address=addresses[0])


class WebhookConnector(Connector):
    """POSTs one JSON event to `url`, signed by `sign(body)`; see the module."""

    capabilities = WEBHOOK_CAPABILITIES

    def __init__(self, name: str, url: str, sign: Callable[[bytes], Mapping[str, str]], *,
                 limits: ExchangeLimits, allow_private: bool = False, require_https: bool = True,
                 idempotency_field: str = "id") -> None:
        self.name = name
        self.url = url
        self.sign = sign
        self.limits = limits
        self.allow_private = allow_private
        self.require_https = require_https
        self.idempotency_field = idempotency_field

    def __repr__(self) -> str:
        return f"<WebhookConnector {self.name}>"

    def send(self, request: Mapping[str, Any], *, idempotency_key: str, client_reference: str) -> ProviderAccepted:
        """POST `request` once as canonical JSON; a 2xx is the receipt.
        Raises `DestinationRefused`-as-`ProviderRejected` (nothing sent),
        and the `ProviderError`s of an HTTP exchange."""
        try:
            endpoint = resolve_destination(self.url, allow_private=self.allow_private,
                                           require_https=self.require_https)
        except DestinationRefused as exc:
            raise ProviderRejected(f"callback URL refused: {exc}", evidence={"provider": self.name}) from exc
        body = json.dumps(dict(request), sort_keys=True, separators=(",", ":")).encode("utf-8")
        key = str(request.get(self.idempotency_field) or idempotency_key)
        parts = urlsplit(self.url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": USER_AGENT,
                   "Idempotency-Key": key, "X-Client-Reference": client_reference, **self.sign(body)}
        answer = http_exchange(endpoint, "POST", path, body=body, headers=headers, limits=self.limits,
                               describe=f"POST to {parts.scheme}://{parts.hostname} (callback {key})",
                               provider=self.name)
        evidence = answer.evidence(idempotency_key_sent=key, provider=self.name, address=endpoint.address)
        if 200 <= answer.status < 300:
            document = answer.json()
            reference = document.get("id") if isinstance(document, dict) else None
            reference = reference if isinstance(reference, str) and reference else f"HTTP {answer.status} {key}"
            return ProviderAccepted(provider_reference=reference[:200], accepted_at=datetime.now(timezone.utc),
                                    evidence=evidence)
        if 300 <= answer.status < 400:
            raise ProviderRejected(f"the receiver answered a redirect ({answer.status} to "
                                   f"{answer.headers.get('Location', '?')!r:.200}); redirects are not followed",
                                   status=answer.status, evidence=evidence)
        raise provider_error(answer, evidence)

    def lookup(self, client_reference: str) -> ProviderAccepted | None:
        raise NotSupported(f"a webhook receiver ({self.name}) cannot be asked what it received")
