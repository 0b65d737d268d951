"""What the gateway's request path needs of an HTTP client to a backend: the contract, the errors
and the per-phase timeouts. Two clients implement it: :class:`.upstream_pool.UpstreamPool` (our own
pooled HTTP/1.1 client, the default; its module says why) and :class:`.upstream_aiohttp.AiohttpUpstream`
(``server.upstream_client: aiohttp``).

Contract: :meth:`Upstream.request` sends one request and returns when the status line and headers
have arrived; the body is then read whole (:meth:`UpstreamResponseLike.read`) or as it comes
(:meth:`UpstreamResponseLike.aiter_bytes`, chunked encoding decoded). A connection goes back to the
pool only after its response was read to the end with keep-alive; :meth:`UpstreamResponseLike.aclose`
on an unfinished response closes the connection, which is how a backend learns a client left.

Timeouts per phase (:class:`UpstreamTimeouts`): ``connect_s`` (TCP + TLS handshake; the wait for a
free connection), ``headers_s`` (request sent -> status and headers), ``chunk_gap_s`` (between two
pieces of the body: a stream may run for an hour, as long as it keeps moving).

Errors: :class:`UpstreamConnectError` (nothing was sent or the server closed before answering:
safe to try another backend; :class:`UpstreamTLSError` when the TLS handshake failed, e.g. the
certificate did not verify), :class:`UpstreamTimeout`, :class:`UpstreamProtocolError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol


class UpstreamError(Exception):
    pass


class UpstreamConnectError(UpstreamError):
    pass


class UpstreamTLSError(UpstreamConnectError):
    pass


class UpstreamTimeout(UpstreamError):
    pass


class UpstreamProtocolError(UpstreamError):
    pass


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    """Seconds allowed per phase of an upstream request (see the module docstring)."""

    connect_s: float = 5.0
    headers_s: float = 600.0
    chunk_gap_s: float = 600.0


class Upstream(Protocol):
    """What the request path needs of an upstream client (either client)."""

    async def request(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponseLike: ...
    async def aclose(self) -> None: ...


class UpstreamResponseLike(Protocol):
    content: bytes  # the body once read

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...  # lower-case names
    async def read(self) -> bytes: ...
    def aiter_bytes(self) -> AsyncIterator[bytes]: ...
    async def aclose(self) -> None: ...
