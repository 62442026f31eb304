"""The request digest: what makes two attempts "the same request" (DESIGN §6)."""

import hashlib
import json
from typing import Any


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
