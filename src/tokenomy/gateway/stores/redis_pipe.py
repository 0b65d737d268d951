"""The hot path's Redis connection: one socket, many scripts in flight, answers matched in order.

A fleet replica runs two scripts a request (``redis_admission``). Through redis-py each call
takes a connection from the pool and gives it back, encodes every key and argument in Python and
waits on its own socket: about 80 us of CPU a call, which made a shared-state replica cost 0.6 ms
more CPU per request than the embedded gateway (``benchmarks/gateway_fleet.py``). RESP answers
come back in the order the commands were sent, so one connection can carry every request's
scripts at once (as Redis's own pipelining does): ``evalsha`` writes the packed command and
awaits a future; ``data_received`` feeds hiredis's parser and resolves the oldest waiting future
with each answer. Everything else (seeding, heartbeats, reads) stays on redis-py.

Errors are redis-py's, so callers treat both alike: a lost connection fails the calls in flight
with ``ConnectionError`` (the next call reconnects; one connect at a time, and the calls that
waited behind one that failed fail with it at once), an answer slower than ``timeout_s`` raises
``TimeoutError`` (``asyncio.TimeoutError``; the late answer is read and dropped, keeping the
order), a script error raises ``ResponseError``; ``NOSCRIPT`` (Redis restarted) loads the script
and runs it again. ``redis://`` URLs only (``rediss://`` and sockets: use redis-py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any, Protocol, cast

import hiredis
from redis.asyncio.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError


class ScriptLike(Protocol):
    @property
    def sha(self) -> str: ...

    @property
    def script(self) -> str | bytes | memoryview: ...


def pack(parts: list[bytes]) -> bytes:
    """One RESP command (an array of bulk strings)."""
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%b\r\n" % (len(p), p) for p in parts)


class _Answers(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (answer := self.reader.gets()) is not False:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_result(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(RedisConnectionError(f"Redis closed the connection ({exc or 'EOF'})"))


class RedisPipe:
    def __init__(self, url: str, timeout_s: float) -> None:
        if not url.startswith("redis://"):
            raise ValueError(f"RedisPipe speaks redis:// only, not {url.split(':', 1)[0]}://")
        opts = parse_url(url)
        self.host, self.port = str(opts.get("host", "127.0.0.1")), int(opts.get("port", 6379))
        self._hello: list[list[bytes]] = []
        if opts.get("password"):
            user = [str(opts["username"]).encode()] if opts.get("username") else []
            self._hello.append([b"AUTH", *user, str(opts["password"]).encode()])
        if opts.get("db"):
            self._hello.append([b"SELECT", str(opts["db"]).encode()])
        self.timeout_s = timeout_s
        self._conn: _Answers | None = None
        self._connecting: asyncio.Lock | None = None
        self._failures = 0  # failed connects so far

    async def _connected(self) -> _Answers:
        conn = self._conn
        if conn is not None and conn.transport is not None and not conn.transport.is_closing():
            return conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        failures = self._failures
        async with self._connecting:
            conn = self._conn
            if conn is not None and conn.transport is not None and not conn.transport.is_closing():
                return conn
            if self._failures != failures:  # the attempt this call waited behind failed: so does it
                raise RedisConnectionError(f"Redis at {self.host}:{self.port} is unreachable")
            try:
                proto = await asyncio.wait_for(self._open(), self.timeout_s)
            except OSError as e:
                self._failures += 1
                raise RedisConnectionError(f"cannot connect to Redis at {self.host}:{self.port}: {e}") from e
            for cmd in self._hello:
                answer = await self._send(proto, pack(cmd))
                if isinstance(answer, hiredis.ReplyError):
                    if proto.transport is not None:
                        proto.transport.close()
                    raise RedisConnectionError(f"Redis refused {cmd[0].decode()}: {answer}")
            self._conn = proto
            return proto

    async def _open(self) -> _Answers:
        _, proto = await asyncio.get_running_loop().create_connection(_Answers, self.host, self.port)
        return proto

    async def _send(self, conn: _Answers, packed: bytes) -> Any:
        transport = conn.transport
        if transport is None:
            raise RedisConnectionError("Redis connection lost")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        conn.waiting.append(fut)
        transport.write(packed)
        timer = fut.get_loop().call_later(self.timeout_s, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    async def evalsha(self, script: ScriptLike, keys: list[bytes], args: list[bytes]) -> Any:
        """Run ``script`` (loading it first if Redis does not know it); its answer, bytes as bytes."""
        conn = await self._connected()
        packed = pack([b"EVALSHA", script.sha.encode(), b"%d" % len(keys), *keys, *args])
        answer = await self._send(conn, packed)
        if isinstance(answer, hiredis.ReplyError) and str(answer).startswith("NOSCRIPT"):
            source = script.script.encode() if isinstance(script.script, str) else bytes(script.script)
            loaded = await self._send(conn, pack([b"SCRIPT", b"LOAD", source]))
            if isinstance(loaded, hiredis.ReplyError):
                raise ResponseError(str(loaded))
            answer = await self._send(conn, packed)
        if isinstance(answer, hiredis.ReplyError):
            raise ResponseError(str(answer))
        return answer

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.transport.close()
            with contextlib.suppress(Exception):
                await asyncio.sleep(0)


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError("Redis did not answer in time"))
