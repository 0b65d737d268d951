"""API keys: ``tk-`` + 32 random bytes (urlsafe base64), kept only as HMAC-SHA-256 digests.

The raw key is shown once, when it is created. The store keeps ``hmac(server_secret, key)``; a
presented key is hashed the same way and compared with ``hmac.compare_digest``, so neither a
database leak nor response timing reveals a usable key.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "tk-"
_RANDOM_BYTES = 32
# len("tk-") + urlsafe base64 of 32 bytes without padding (43 chars)
KEY_LENGTH = len(KEY_PREFIX) + 43


def new_api_key() -> str:
    """A fresh key: ``tk-`` followed by 43 urlsafe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(_RANDOM_BYTES)


def looks_like_key(raw: str) -> bool:
    return raw.startswith(KEY_PREFIX) and len(raw) == KEY_LENGTH


def hash_key(server_secret: bytes, raw: str) -> str:
    """Hex HMAC-SHA-256 of the raw key under the server secret."""
    return hmac.new(server_secret, raw.encode(), hashlib.sha256).hexdigest()


def key_hint(raw: str) -> str:
    """A non-secret label to tell keys apart in listings: the first and last four characters."""
    return f"{raw[:7]}…{raw[-4:]}"


class KeyIndex:
    """Digest → node id, with a constant-time final comparison.

    The table is indexed by the digest's first 16 hex characters (a lookup handle, not enough to
    authenticate); the full stored digest is then compared with ``hmac.compare_digest``.
    """

    def __init__(self, server_secret: bytes) -> None:
        if len(server_secret) < 16:
            raise ValueError("the server secret must be at least 16 bytes")
        self._secret = server_secret
        self._by_handle: dict[str, tuple[str, str]] = {}

    def digest(self, raw: str) -> str:
        return hash_key(self._secret, raw)

    def add(self, digest: str, node_id: str) -> None:
        self._by_handle[digest[:16]] = (digest, node_id)

    def discard(self, digest: str) -> None:
        self._by_handle.pop(digest[:16], None)

    def clear(self) -> None:
        self._by_handle.clear()

    def lookup(self, raw: str) -> str | None:
        """The node id of a presented key, or None."""
        if not looks_like_key(raw):
            return None
        digest = self.digest(raw)
        entry = self._by_handle.get(digest[:16])
        if entry is None:
            return None
        stored, node_id = entry
        return node_id if hmac.compare_digest(stored, digest) else None
