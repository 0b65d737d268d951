"""Routing state every replica must see alike, in Redis: session → decode-instance bindings (AMPD,
``colocated-affinity``) and the per-backend in-flight counts that routing reads.

Bindings: the first replica to bind a session wins (``SET NX``); a replica that bound the same
session at the same moment adopts the winner's instance, so one session's turns reach one decode
instance whichever replica they pass. A rebind is a compare-and-set (only from the instance the
caller saw), and a binding expires ``ttl_s`` after the session's last turn (sessions end without
saying so; the in-process binder's map grew forever).

In-flight counts: a sorted set per backend of request ids scored by lease expiry, renewed by the
replica's heartbeat; a dead replica's requests stop counting when their lease passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from redis.asyncio import Redis

from tokenomy.gateway.stores.redis_store import text as _s

# KEYS: binding; ARGV: expected instance, new instance, ttl s
_MOVE = """
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return ARGV[2]
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return cur
"""


class RedisSessionBindings:
    def __init__(self, redis: Redis, ttl_s: float = 3600.0, prefix: str = "tk:") -> None:
        self.redis = redis
        self.ttl_s = int(max(1, ttl_s))
        self.prefix = prefix
        self._move = redis.register_script(_MOVE)

    def _key(self, session_id: str) -> str:
        return f"{self.prefix}bind:{session_id}"

    async def get(self, session_id: str) -> str | None:
        """The session's decode instance (and keep the binding alive), None when unbound."""
        value = await self.redis.getex(self._key(session_id), ex=self.ttl_s)
        return None if value is None else _s(value)

    async def claim(self, session_id: str, instance_id: str) -> str:
        """Bind the session to ``instance_id`` unless another replica bound it first; the binding
        that holds."""
        key = self._key(session_id)
        for _ in range(3):  # the winner's binding can expire between SET NX and GET: try again
            if await self.redis.set(key, instance_id, nx=True, ex=self.ttl_s):
                return instance_id
            held = await self.get(session_id)
            if held is not None:
                return held
        return instance_id

    async def move(self, session_id: str, from_id: str | None, to_id: str) -> str:
        """Rebind from ``from_id`` (what the caller saw) to ``to_id``; the binding that holds."""
        return _s(await self._move(keys=[self._key(session_id)], args=[from_id or "", to_id, self.ttl_s]))

    async def unbind(self, session_id: str) -> None:
        await self.redis.delete(self._key(session_id))


class RedisInFlight:
    """Requests in flight per backend, over the whole fleet."""

    def __init__(self, redis: Redis, lease_s: float = 30.0, prefix: str = "tk:") -> None:
        self.redis = redis
        self.lease_s = lease_s
        self.prefix = prefix

    def _key(self, backend_id: str) -> str:
        return f"{self.prefix}if:{backend_id}"

    async def dispatched(self, backend_id: str, request_id: str, now_s: float) -> None:
        await self.redis.zadd(self._key(backend_id), {request_id: now_s + self.lease_s})

    async def finished(self, backend_id: str, request_id: str) -> None:
        await self.redis.zrem(self._key(backend_id), request_id)

    async def renew(self, flights: Iterable[tuple[str, str]], now_s: float) -> None:
        """Extend the lease of each (backend id, request id) still running on this replica."""
        until = now_s + self.lease_s
        async with self.redis.pipeline(transaction=False) as pipe:
            for backend_id, rid in flights:
                pipe.zadd(self._key(backend_id), {rid: until}, xx=True)
            await pipe.execute()

    async def counts(self, backend_ids: Sequence[str], now_s: float) -> dict[str, int]:
        """Each backend's requests in flight on any replica whose lease has not passed."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for b in backend_ids:
                pipe.zremrangebyscore(self._key(b), "-inf", repr(float(now_s)))
                pipe.zcard(self._key(b))
            out = await pipe.execute()
        return {b: int(out[2 * i + 1]) for i, b in enumerate(backend_ids)}
