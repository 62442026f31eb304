"""API keys: `dwk_<prefix>_<secret>` (DESIGN §15).

The prefix (10 hex digits) finds the key and names it to people; the secret
(43 URL-safe characters, 256 bits) is kept only as its SHA-256 — a secret
that long needs no slow hash — and compared in constant time. The whole key
is shown once, when issued, and never written anywhere: not in a log, a
history row, an admin page or an error message.
"""

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

KEY_PATTERN = re.compile(r"^dwk_([0-9a-f]{10})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class IssuedKey:
    prefix: str
    secret_hash: str
    key: str  # shown once, to the person who asked for it


def key_generate() -> IssuedKey:
    prefix, secret = secrets.token_hex(5), secrets.token_urlsafe(32)
    return IssuedKey(prefix, secret_digest(secret), f"dwk_{prefix}_{secret}")


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def key_parse(text: str) -> tuple[str, str] | None:
    """(prefix, secret) of a well-formed key, or None."""
    match = KEY_PATTERN.match(text or "")
    return (match.group(1), match.group(2)) if match else None


def secret_matches(secret: str, digest: str) -> bool:
    return hmac.compare_digest(secret_digest(secret), digest)


def callback_secret_generate() -> str:
    return f"whsec_{secrets.token_urlsafe(32)}"
