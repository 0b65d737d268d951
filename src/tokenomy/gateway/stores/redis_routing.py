"""Routing state every replica must see alike, in Redis: session → decode-instance bindings (AMPD,
``colocated-affinity``) and the per-backend in-flight counts that routing reads.

Bindings: the first replica to bind a session wins (``SET NX``); a replica that bound the same
session at the same moment adopts the winner's instance, so one session's turns reach one decode
instance whichever replica they pass. A rebind is a compare-and-set (only from the instance the
caller saw), and a binding expires ``ttl_s`` after the session's last turn (sessions end without
saying so; the in-process binder's map grew forever).

In-flight counts: each replica publishes its own count per backend every ``in_flight_period_s``
and reads the other replicas' in the same script (``RedisInFlight.exchange``); routing adds its
own live count to the others' last published ones, so no request waits on Redis for them. A
published count carries a lease: a dead replica's counts stop counting when it passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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


# KEYS: one hash per backend (field: replica, value: "count:expiry ms"); ARGV[1]: this replica,
# ARGV[2]: lease ms, ARGV[2 + i]: its count on backend i. Server time: replicas' clocks may differ.
_EXCHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, lease = ARGV[1], tonumber(ARGV[2])
local out = {}
for i, key in ipairs(KEYS) do
  redis.call('HSET', key, me, ARGV[i + 2] .. ':' .. string.format('%d', now + lease))
  redis.call('PEXPIRE', key, lease)
  local sum, fields = 0, redis.call('HGETALL', key)
  for j = 1, #fields, 2 do
    if fields[j] ~= me then
      local c, e = string.match(fields[j + 1], '^(%d+):(%d+)$')
      if c == nil or tonumber(e) <= now then
        redis.call('HDEL', key, fields[j])
      else
        sum = sum + tonumber(c)
      end
    end
  end
  out[i] = sum
end
return out
"""


class RedisInFlight:
    """Requests in flight per backend over the fleet (:class:`tokenomy.gateway.stores.in_flight.InFlightExchange`).

    One hash per backend, one field per replica: its count and the server time its lease ends.
    ``exchange`` writes this replica's counts and reads the others' sums in one script; a field
    whose lease passed (a replica that stopped publishing) is deleted by the next reader.
    """

    def __init__(self, redis: Redis, replica_id: str, lease_s: float = 2.0, prefix: str = "tk:") -> None:
        self.redis = redis
        self.replica_id = replica_id
        self.lease_ms = max(1, int(lease_s * 1000))
        self.prefix = prefix
        self._exchange = redis.register_script(_EXCHANGE)

    def _key(self, backend_id: str) -> str:
        return f"{self.prefix}if:{backend_id}"

    async def exchange(self, own: Mapping[str, int]) -> dict[str, int]:
        ids = list(own)
        if not ids:
            return {}
        sums = await self._exchange(keys=[self._key(b) for b in ids],
                                    args=[self.replica_id, self.lease_ms, *(max(0, int(own[b])) for b in ids)])
        return {b: int(n) for b, n in zip(ids, sums, strict=True)}

    async def leave(self, backend_ids: Iterable[str]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for b in backend_ids:
                pipe.hdel(self._key(b), self.replica_id)
            await pipe.execute()
