"""Console sign-in with the gateway's admin key: a signed session cookie and a CSRF token.

The login form takes the admin key (``ops.admin_key``, checked by the guard's ``is_admin`` in
constant time) and sets ``tokenomy_console``: ``<expiry>.<nonce>.<HMAC-SHA256(admin key, expiry.nonce)>``,
HttpOnly, SameSite=Strict, path ``/console``. Nothing is stored server-side; changing the admin
key signs every session out. Every form carries a CSRF token derived from the session cookie
(HMAC of it under the admin key), and every POST is refused when its ``Origin`` names another
site: SameSite=Strict already keeps the cookie off cross-site requests, the token covers browsers
that ignore it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

COOKIE = "tokenomy_console"
SESSION_TTL_S = 12 * 3600.0  # labelled default: one working day, then sign in again


def _mac(secret: str, message: str) -> str:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


class ConsoleAuth:
    """Issues and checks session cookies and CSRF tokens; ``admin_key()`` is read per call so a
    config reload takes effect (None: the console is off)."""

    def __init__(self, admin_key: Callable[[], str | None], is_admin: Callable[[str | None], bool],
                 clock: Callable[[], float] = time.time, ttl_s: float = SESSION_TTL_S) -> None:
        self.admin_key = admin_key
        self.is_admin = is_admin
        self.clock = clock
        self.ttl_s = ttl_s

    @property
    def enabled(self) -> bool:
        return bool(self.admin_key())

    def login(self, submitted_key: str) -> str | None:
        """A fresh session cookie value when ``submitted_key`` is the admin key, else None."""
        key = self.admin_key()
        if not key or not self.is_admin(submitted_key):
            return None
        body = f"{int(self.clock() + self.ttl_s)}.{secrets.token_urlsafe(16)}"
        return f"{body}.{_mac(key, 'session:' + body)}"

    def valid(self, cookie: str | None) -> bool:
        key = self.admin_key()
        if not key or not cookie or cookie.count(".") != 2:
            return False
        expiry, nonce, sig = cookie.split(".")
        if not hmac.compare_digest(sig, _mac(key, f"session:{expiry}.{nonce}")):
            return False
        return expiry.isdigit() and int(expiry) > self.clock()

    def csrf_token(self, cookie: str) -> str:
        return _mac(str(self.admin_key()), "csrf:" + cookie)[:32]

    def csrf_ok(self, cookie: str, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(str(token), self.csrf_token(cookie))


def same_origin(origin: str | None, host: str | None, scheme: str) -> bool:
    """True when the request carries no ``Origin`` (same-origin form posts in some browsers) or one
    that names this host."""
    if origin is None:
        return True
    return host is not None and origin in (f"{scheme}://{host}", f"http://{host}", f"https://{host}")
