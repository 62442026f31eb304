"""The request digest: what makes two attempts "the same request", and the
intent key: what makes two operations "the same obligation" (DESIGN §6)."""

import hashlib
import json
import uuid
from typing import Any

# Fixed forever: changing it changes every key a provider may still hold.
_INTENT_NAMESPACE = uuid.UUID("5b0c3f3e-8f4e-4c55-9d0e-6a1f2c7b9d11")


def canonical_json(request: Any) -> bytes:
    """The canonical form: sorted keys, no insignificant whitespace, UTF-8.

    Two requests that differ only in key order or spacing are the same
    request; any difference in a value is a different one. Raises `TypeError`
    for values JSON cannot represent (a digest must never depend on `str()`
    of an arbitrary object).
    """
    return json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def request_digest(request: Any) -> str:
    """SHA-256 (hex) of `canonical_json(request)`."""
    return hashlib.sha256(canonical_json(request)).hexdigest()


def intent_key(*, tenant: str, job_key: str, step: str, digest: str) -> str:
    """The provider's idempotency key and client reference of an operation:
    a UUID derived from the obligation — the tenant, the job's key, the step
    and the request's digest (a human correction changes the request, hence
    the intent's version) — never from a row's random id. A send repeated
    after the database lost the commit that recorded the first one (an
    asynchronous replica promoted after a crash) carries the same key, so a
    provider that deduplicates by it drops the repeat and a lookup by it
    finds the first message."""
    return str(uuid.uuid5(_INTENT_NAMESPACE, "\x1f".join((tenant, job_key, step, digest))))
