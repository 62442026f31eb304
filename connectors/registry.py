"""Which connector serves which provider name, and what that provider declares.

A provider's capabilities are a *declaration* kept here, next to its name —
the single place the operations layer learns what it may do to reconcile
(DESIGN §6, §10). Nothing asks the provider.

Django settings are read lazily inside ``get_connector``, so this module (and
the simulator tooling that imports it) loads without Django configured.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from connectors.base import Capabilities, Connector
from connectors.email_http import DEFAULT_MAX_RESPONSE_BYTES, HttpEmailConnector

# Declared capabilities of the built-in providers, one per simulator mode.
PROVIDER_CAPABILITIES: dict[str, Capabilities] = {
    # The simulator keeps its keys and references for its whole life; 24 h is
    # what real email providers commonly promise for idempotency keys.
    "sim-idempotent": Capabilities(idempotency_key=True, lookup=True, retry_ceiling=30.0,
                                   idempotency_retention=24 * 3600.0),
    "sim-lookup": Capabilities(idempotency_key=False, lookup=True, retry_ceiling=30.0,
                               idempotency_retention=24 * 3600.0),
    "sim-bare": Capabilities(idempotency_key=False, lookup=False, retry_ceiling=30.0,
                             idempotency_retention=24 * 3600.0),
}

# The provider name to use against a simulator started with ``--mode``.
PROVIDER_FOR_SIMULATOR_MODE: dict[str, str] = {
    "idempotent": "sim-idempotent",
    "lookup": "sim-lookup",
    "bare": "sim-bare",
}

# Development only; a real deployment sets PROVIDER_API_KEY in the environment.
DEFAULT_API_KEY = "sim-dev-key"

ConnectorFactory = Callable[[], Connector]

_registered: dict[str, ConnectorFactory] = {}
# prefix -> factory(name): one connector per name of a family ("callback:12").
_families: dict[str, Callable[[str], Connector]] = {}
_registered_lock = threading.Lock()


class UnknownProvider(LookupError):
    """No connector is registered or built in under this provider name."""


def build_http_connector(
    provider_name: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    connect_timeout: float | None = None,
    read_timeout: float | None = None,
) -> HttpEmailConnector:
    """An ``HttpEmailConnector`` with the declared capabilities of ``provider_name``.

    Anything not given comes from Django settings (``PROVIDER_URL``,
    ``PROVIDER_CONNECT_TIMEOUT``, ``PROVIDER_READ_TIMEOUT``) and the
    ``PROVIDER_API_KEY`` environment variable. Raises ``UnknownProvider`` for a
    name without declared capabilities.
    """
    try:
        capabilities = PROVIDER_CAPABILITIES[provider_name]
    except KeyError:
        raise UnknownProvider(f"no declared capabilities for provider {provider_name!r}") from None
    limits = {}
    if base_url is None or connect_timeout is None or read_timeout is None:
        from django.conf import settings

        base_url = settings.PROVIDER_URL if base_url is None else base_url
        connect_timeout = settings.PROVIDER_CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        read_timeout = settings.PROVIDER_READ_TIMEOUT if read_timeout is None else read_timeout
        limits = {"total_timeout": getattr(settings, "PROVIDER_TOTAL_TIMEOUT", None),
                  "max_response_bytes": getattr(settings, "PROVIDER_MAX_RESPONSE_BYTES", DEFAULT_MAX_RESPONSE_BYTES)}
    if api_key is None:
        api_key = os.environ.get("PROVIDER_API_KEY") or DEFAULT_API_KEY
    return HttpEmailConnector(
        base_url,
        api_key,
        capabilities,
        connect_timeout,
        read_timeout,
        name=provider_name,
        **limits,
    )


def get_connector(provider_name: str) -> Connector:
    """The connector for ``provider_name``, freshly built (settings are read now).

    A factory registered with ``register_connector`` wins over a family's
    (``register_connector_family``), which wins over the built-in providers. Raises ``UnknownProvider`` when neither knows the name.
    """
    with _registered_lock:
        factory = _registered.get(provider_name)
        family = next((f for prefix, f in _families.items() if provider_name.startswith(prefix)), None)
    if factory is not None:
        return factory()
    if family is not None:
        return family(provider_name)
    return build_http_connector(provider_name)


def provider_known(provider_name: str) -> bool:
    """Whether `provider_name` names a provider one may choose by name: one
    registered (`register_connector`) or built in. A family's members
    (`callback:<agent id>`) are not: each is its owner's alone."""
    with _registered_lock:
        registered = provider_name in _registered
    return registered or provider_name in PROVIDER_CAPABILITIES


def provider_names() -> list[str]:
    """The providers one may choose by name (`provider_known`), sorted."""
    with _registered_lock:
        registered = set(_registered)
    return sorted(registered | set(PROVIDER_CAPABILITIES))


def register_connector_family(prefix: str, factory: Callable[[str], Connector]) -> None:
    """Serve every name starting with `prefix` with `factory(name)`: one
    provider per name (per receiver, say), so a pause of one — credentials
    refused — holds back that one alone."""
    with _registered_lock:
        _families[prefix] = factory


def register_connector(name: str, factory: ConnectorFactory) -> None:
    """Serve ``name`` with ``factory()`` from now on (replacing any previous one)."""
    with _registered_lock:
        _registered[name] = factory


@contextmanager
def connector_registered(name: str, factory: ConnectorFactory) -> Iterator[None]:
    """Register ``factory`` for the duration of a ``with`` block (for tests).

    Whatever was registered under ``name`` before is restored on exit.
    """
    with _registered_lock:
        previous = _registered.get(name)
        _registered[name] = factory
    try:
        yield
    finally:
        with _registered_lock:
            if previous is None:
                _registered.pop(name, None)
            else:
                _registered[name] = previous
