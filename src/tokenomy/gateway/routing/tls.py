"""TLS to backends: one ``ssl.SSLContext`` per https backend, from its ``tls:`` settings.

Verification is on unless a backend says ``verify: false``; ``ca_bundle`` replaces the system's
trust store for that backend (a private CA), ``client_cert``/``client_key`` present a client
certificate (mutual TLS). The same context serves the hot path (:mod:`.upstream`) and the health
checks and scrapes (httpx), so both trust the same certificates.
"""

from __future__ import annotations

import ssl
from urllib.parse import urlsplit

from tokenomy.gateway.config import BackendConfig


def tls_context(backend: BackendConfig) -> ssl.SSLContext | None:
    """The context for ``backend`` (None for an http:// backend). ValueError naming the backend
    and the file when a CA bundle or client certificate cannot be loaded."""
    if not backend.url.startswith("https://"):
        return None
    tls = backend.tls
    try:
        ctx = ssl.create_default_context(cafile=tls.ca_bundle if tls else None)
        if tls is not None and tls.client_cert is not None:
            ctx.load_cert_chain(tls.client_cert, tls.client_key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"backends[{backend.id}].tls: {exc}") from None
    if tls is not None and not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def tls_contexts(backends: tuple[BackendConfig, ...]) -> dict[tuple[str, int], ssl.SSLContext]:
    """Each https backend's context, keyed by its (host, port), as :class:`.upstream_pool.UpstreamPool` takes them."""
    out: dict[tuple[str, int], ssl.SSLContext] = {}
    for b in backends:
        ctx = tls_context(b)
        if ctx is not None:
            out[host_port(b.url)] = ctx
    return out


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)
