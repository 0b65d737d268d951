"""The hot-path client's per-phase timeouts and its connection cap, against raw loopback servers
that stall where the test wants them to; and the client-side bounds (body deadline, uvicorn's
concurrency limit)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import uvloop

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.parse import read_json
from tokenomy.gateway.routing.upstream import UpstreamConnectError, UpstreamTimeout, UpstreamTimeouts
from tokenomy.gateway.routing.upstream_pool import UpstreamPool

pytestmark = pytest.mark.integration

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"


async def _until(pred: Any, timeout_s: float = 5.0) -> None:
    """Poll ``pred`` every 5 ms until it holds (AssertionError after ``timeout_s``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def _server(handler: Any) -> tuple[asyncio.Server, str]:
    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(n)
                await handler(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1/x"


def test_the_wait_for_headers_and_the_gaps_between_chunks_have_their_own_timeouts() -> None:
    async def main() -> None:
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def silent(w: asyncio.StreamWriter) -> None:
            await never  # reads the request, never answers

        async def one_chunk_then_stall(w: asyncio.StreamWriter) -> None:
            w.write(HEAD + b"transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
            await never

        s1, url1 = await _server(silent)
        s2, url2 = await _server(one_chunk_then_stall)
        pool = UpstreamPool(UpstreamTimeouts(connect_s=1.0, headers_s=0.1, chunk_gap_s=30.0))
        with pytest.raises(UpstreamTimeout, match="status line and headers took longer than 0.1s"):
            await pool.request("POST", url1, b"{}", {})
        # a stream whose first byte comes fast and then stops: the gap timer, not the headers one
        pool = UpstreamPool(UpstreamTimeouts(connect_s=1.0, headers_s=30.0, chunk_gap_s=0.1))
        resp = await pool.request("POST", url2, b"{}", {})
        pieces = []
        with pytest.raises(UpstreamTimeout, match="next piece of the response body took longer than 0.1s"):
            async for piece in resp.aiter_bytes():
                pieces.append(piece)
        assert pieces == [b"hello"]
        await resp.aclose()
        await pool.aclose()
        never.cancel()
        for s in (s1, s2):
            s.close()

    asyncio.run(main())


def test_connections_per_backend_are_capped_and_a_request_waits_for_a_free_one() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        gates: list[asyncio.Future[None]] = []

        async def held(w: asyncio.StreamWriter) -> None:
            gate = loop.create_future()
            gates.append(gate)
            await gate
            w.write(HEAD + b"content-length: 2\r\n\r\n{}")

        server, url = await _server(held)
        host, port = "127.0.0.1", server.sockets[0].getsockname()[1]
        pool = UpstreamPool(UpstreamTimeouts(connect_s=5.0, headers_s=5.0, chunk_gap_s=5.0), max_connections=2)

        async def call() -> bytes:
            resp = await pool.request("POST", url, b"{}", {})
            return await resp.read()

        tasks = [asyncio.create_task(call()) for _ in range(3)]
        await _until(lambda: len(gates) == 2)  # the backend holds two requests
        assert pool.open_connections(host, port) == 2
        assert not any(t.done() for t in tasks)  # the third waits for a connection
        gates[0].set_result(None)
        await _until(lambda: len(gates) == 3)
        assert pool.open_connections(host, port) == 2  # it reused the freed one
        for g in gates[1:]:
            g.set_result(None)
        assert await asyncio.gather(*tasks) == [b"{}"] * 3
        # all busy for longer than connect_s: a clear timeout, not an unbounded queue
        short = UpstreamPool(UpstreamTimeouts(connect_s=0.1), max_connections=1)
        first = asyncio.create_task(short.request("POST", url, b"{}", {}))
        await _until(lambda: len(gates) == 4)  # first holds the only connection
        with pytest.raises(UpstreamTimeout, match="all 1 connections to 127.0.0.1:.* stayed busy"):
            await short.request("POST", url, b"{}", {})
        first.cancel()
        for g in gates:
            if not g.done():
                g.set_result(None)
        await pool.aclose()
        await short.aclose()
        server.close()

    asyncio.run(main())


class _Trickle:
    """A client that sent its headers and then nothing."""

    headers = {"content-length": "100"}

    async def receive(self) -> dict[str, Any]:
        await asyncio.get_running_loop().create_future()  # never completes
        return {}


def test_a_request_body_that_does_not_arrive_in_time_is_a_408() -> None:
    with pytest.raises(GatewayError) as err:
        asyncio.run(read_json(_Trickle(), 4096, deadline_s=0.05))
    assert (err.value.status, err.value.code) == (408, "request_timeout")


def test_serve_passes_the_concurrency_limit_and_keep_alive_to_uvicorn(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    from tokenomy.cli.serve_cmd import run_serve

    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw))
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(json.dumps({"server": {"limit_concurrency": 64, "timeouts": {"keep_alive_s": 7}},
                               "ledger": {"url": f"sqlite:///{tmp_path}/l.db"}}))
    args = argparse.Namespace(config=str(cfg), host=None, port=None, log_level="warning")
    monkeypatch.chdir(tmp_path)
    assert run_serve(args) == 0
    assert (seen["limit_concurrency"], seen["timeout_keep_alive"]) == (64, 7)


def test_a_connection_the_server_dropped_before_the_request_was_written_is_a_connect_error() -> None:
    """An engine killed behind a TCP proxy: the proxy accepts, then drops the connection. When the
    drop lands before the request is written (the pool's connect resumed a loop turn later), the
    write must not reach the closed transport (under uvloop it raised RuntimeError: a 500 to the
    client); it is a connect error, which the proxy answers by trying another backend."""
    async def main() -> None:
        async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        server = await asyncio.start_server(drop, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/v1/x"
        pool = UpstreamPool(UpstreamTimeouts(connect_s=1.0, headers_s=5.0, chunk_gap_s=5.0))
        connect = pool._connect

        async def connect_then_lose_the_race(key: Any, tls: Any) -> Any:
            conn = await connect(key, tls)
            await _until(lambda: conn.closed)  # the drop is processed before the write
            return conn

        pool._connect = connect_then_lose_the_race  # type: ignore[method-assign]
        with pytest.raises(UpstreamConnectError, match="closed the connection before the request"):
            await pool.request("POST", url, b"{}", {})
        assert pool._open.get(("127.0.0.1", port), 0) == 0  # the slot is returned
        await pool.aclose()
        server.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
