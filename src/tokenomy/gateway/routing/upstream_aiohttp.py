"""The hot-path upstream client on aiohttp (``server.upstream_client: aiohttp``).

Same contract and errors (:mod:`.upstream`) as :class:`tokenomy.gateway.routing.upstream_pool.UpstreamPool`, on a
maintained client: one ``aiohttp.ClientSession`` with a connection cap per host, the same TLS
contexts per backend and the same per-phase timeouts (aiohttp has one read timeout, used for both
the wait for headers and the gaps between chunks: the larger of the two). Kept so that the
choice in :mod:`.upstream_pool`'s docstring stays measurable: ``benchmarks/gateway_overhead.py
--clients fast,aiohttp`` runs both side by side.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Mapping

import aiohttp

from tokenomy.gateway.routing.tls import host_port
from tokenomy.gateway.routing.upstream import (
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamTimeouts,
    UpstreamTLSError,
)


class AiohttpResponse:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status_code = resp.status
        self.headers: Mapping[str, str] = {k.lower(): v for k, v in resp.headers.items()}
        self.content = b""

    async def read(self) -> bytes:
        try:
            self.content = await self._resp.read()
        except TimeoutError as exc:
            raise UpstreamTimeout(f"the response body took too long: {exc}") from None
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(f"upstream closed mid-response: {exc}") from None
        finally:
            self._resp.release()
        return self.content

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._resp.content.iter_any():
                yield piece
        except TimeoutError as exc:
            raise UpstreamTimeout(f"the next piece of the response body took too long: {exc}") from None
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(f"upstream closed mid-response: {exc}") from None
        self._resp.release()

    async def aclose(self) -> None:
        if not self._resp.content.at_eof():
            self._resp.close()  # unfinished: drop the connection, the backend sees the client leave
        else:
            self._resp.release()


class AiohttpUpstream:
    """``UpstreamPool``'s interface on aiohttp; the session is made on first use (inside the loop)."""

    def __init__(self, timeouts: UpstreamTimeouts | None = None, max_connections: int = 256,
                 tls: Mapping[tuple[str, int], ssl.SSLContext] | None = None) -> None:
        timeouts = timeouts or UpstreamTimeouts()
        self.timeouts = timeouts
        self.max_connections = max_connections
        self._tls = dict(tls or {})
        self._session: aiohttp.ClientSession | None = None
        read_s = max(timeouts.headers_s, timeouts.chunk_gap_s)
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, sock_read=read_s,
                                              connect=timeouts.connect_s)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            conn = aiohttp.TCPConnector(limit=0, limit_per_host=self.max_connections, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=conn, timeout=self._timeout, auto_decompress=False,
                                                  skip_auto_headers=("User-Agent", "Accept-Encoding"))
        return self._session

    async def request(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> AiohttpResponse:
        tls: ssl.SSLContext | bool = self._tls.get(host_port(url), True) if url.startswith("https") else False
        try:
            resp = await self._client().request(method, url, data=body, headers=headers, ssl=tls)
        except aiohttp.ClientConnectorCertificateError as exc:
            raise UpstreamTLSError(f"TLS handshake with {url} failed: {exc.certificate_error}") from None
        except aiohttp.ClientSSLError as exc:
            raise UpstreamTLSError(f"TLS handshake with {url} failed: {exc}") from None
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamConnectError(f"cannot connect to {url}: {exc}") from None
        except aiohttp.ServerDisconnectedError as exc:
            raise UpstreamConnectError(f"upstream closed the connection: {exc}") from None
        except TimeoutError:
            raise UpstreamTimeout(f"{url}: no response within the timeouts") from None
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(f"{url}: {exc}") from None
        return AiohttpResponse(resp)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
