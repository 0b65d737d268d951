"""RPM/TPM buckets and concurrency slots in Redis: exact across gateway replicas.

Same semantics as the in-process ``InProcessRateLimits`` (continuous token buckets of ``capacity``
per minute, one per node and kind; all-or-nothing over the key's path), but the check and the
charge run inside one Lua script (``redis_admission``) that checks every node of the path and
then charges them all, so no interleaving of replicas can let a key through twice. The clock is the caller's ``now_s`` (replicas need
synchronised clocks: a skew of d seconds refills d/60 of a bucket early).

Concurrency slots are members of a sorted set per node scored by a *lease* expiry: the replica
that holds a slot renews it (``renew``, from its heartbeat) while the request runs and removes it
when the request finishes; a dead replica stops renewing, and the next admission on that node drops its
slots once their lease has passed. So a crashed replica leaks no slot for longer than the lease.

Keys (prefix ``tk:``): ``tk:rl:{node}:{requests|tokens}`` hash (level, ts, cap), expiring once a
bucket would have refilled anyway; ``tk:cc:{node}`` sorted set of request ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from redis.asyncio import Redis

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.tenancy import NodeLimits
from tokenomy.gateway.stores.limits import (
    RPM,
    TPM,
    concurrency_refused,
    headers_of,
    never_fits,
    rate_limited,
)
from tokenomy.gateway.stores.redis_store import RedisStore
from tokenomy.gateway.stores.redis_store import text as _s

# The limit steps as Lua functions over (K, A), so that one script runs them alone (below) or as
# part of a fleet admission (``redis_admission``). rl_refill: a bucket's level after refilling to
# now, keeping what was used when the capacity changed (as InProcessRateLimits does).
# rl_check / rl_apply: K per node i (1-based) its rpm bucket, tpm bucket and concurrency set;
# A: now, tokens, request_id, lease_until, then per node: rpm cap, tpm cap, max concurrent (-1: none).
# rl_check checks every node and returns a refusal ({'concurrency', i, max} | {'never', i, kind} |
# {'wait', i, kind, seconds}) or the plan rl_apply charges: all or nothing.
LIMITS_LUA = """
local function rl_refill(key, cap, now)
  local h = redis.call('HMGET', key, 'level', 'ts', 'cap')
  local level, ts, old = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
  if level == nil then return cap, now end
  if old ~= cap then level = cap - (old - level) end
  if now > ts then
    level = math.min(cap, level + (now - ts) * cap / 60.0)
    ts = now
  end
  return level, ts
end
local function rl_check(K, A)
  local now, tokens = tonumber(A[1]), tonumber(A[2])
  local plan = {}
  for i = 1, #K / 3 do
    local base = 4 + 3 * (i - 1)
    local cc = K[3 * i]
    local maxc = tonumber(A[base + 3])
    redis.call('ZREMRANGEBYSCORE', cc, '-inf', now)
    if maxc >= 0 and redis.call('ZCARD', cc) >= maxc then return {'concurrency', i, tostring(maxc)}, nil end
    for k = 1, 2 do
      local cap = tonumber(A[base + k])
      if cap >= 0 then
        local amount = 1.0
        if k == 2 then amount = tokens end
        local level, ts = rl_refill(K[3 * (i - 1) + k], cap, now)
        if amount > level then
          if amount > cap or cap <= 0 then return {'never', i, tostring(k)}, nil end
          return {'wait', i, tostring(k), tostring((amount - level) * 60.0 / cap)}, nil
        end
        plan[#plan + 1] = {K[3 * (i - 1) + k], cap, level - amount, ts}
      end
    end
  end
  return nil, plan
end
-- charge the plan and take a slot on every node; returns {bucket key, level, ...}
local function rl_apply(K, A, plan)
  local out = {}
  for _, p in ipairs(plan) do
    redis.call('HSET', p[1], 'level', tostring(p[3]), 'ts', tostring(p[4]), 'cap', tostring(p[2]))
    redis.call('PEXPIRE', p[1], 61000 + math.ceil((p[2] - p[3]) * 60000.0 / math.max(p[2], 1)))
    out[#out + 1] = p[1]
    out[#out + 1] = tostring(p[3])
  end
  for i = 1, #K / 3 do
    redis.call('ZADD', K[3 * i], tonumber(A[4]), A[3])
    redis.call('PEXPIRE', K[3 * i], 86400000)
  end
  return out
end
-- K: tpm bucket keys; A: now, delta (actual - estimate)
local function rl_correct(K, A)
  local now, delta = tonumber(A[1]), tonumber(A[2])
  for _, key in ipairs(K) do
    local cap = tonumber(redis.call('HGET', key, 'cap'))
    if cap ~= nil then
      local level, ts = rl_refill(key, cap, now)
      level = math.min(cap, level - delta)
      redis.call('HSET', key, 'level', tostring(level), 'ts', tostring(ts))
      redis.call('PEXPIRE', key, 61000 + math.ceil(math.max(0, cap - level) * 60000.0 / math.max(cap, 1)))
    end
  end
  return 1
end
-- K: concurrency sets; rid: the request whose slots end
local function rl_release(K, rid)
  for _, key in ipairs(K) do redis.call('ZREM', key, rid) end
end
"""

# KEYS: buckets to read; ARGV: now, then each key's cap
_READ = LIMITS_LUA + """
local now = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do out[i] = tostring((rl_refill(key, tonumber(ARGV[1 + i]), now))) end
return out
"""


class RedisRateLimits(RedisStore):
    """The buckets' and slots' keys, the arguments of ``LIMITS_LUA``'s steps and their answers; the
    steps run inside ``redis_admission``'s two scripts."""

    def __init__(self, redis: Redis, lease_s: float = 30.0, prefix: str = "tk:") -> None:
        super().__init__(redis, lease_s, prefix)
        self._read = redis.register_script(_READ)

    def _bucket_key(self, node_id: str, kind: str) -> str:
        return f"{self.prefix}rl:{node_id}:{kind}"

    def _cc_key(self, node_id: str) -> str:
        return f"{self.prefix}cc:{node_id}"

    def acquire_call(self, path: Sequence[tuple[str, NodeLimits]], tokens: int, now_s: float,
                     request_id: str) -> tuple[list[str], list[Any], dict[str, tuple[int, str]]]:
        """Keys and arguments of ``rl_check``/``rl_apply``, and each limited bucket's (cap, kind)."""
        keys: list[str] = []
        args: list[Any] = [repr(float(now_s)), tokens, request_id, repr(float(now_s + self.lease_s))]
        caps: dict[str, tuple[int, str]] = {}
        for node_id, lim in path:
            rk, tk = self._bucket_key(node_id, RPM), self._bucket_key(node_id, TPM)
            keys += [rk, tk, self._cc_key(node_id)]
            args += [-1 if lim.rpm is None else lim.rpm, -1 if lim.tpm is None else lim.tpm,
                     -1 if lim.max_concurrent is None else lim.max_concurrent]
            if lim.rpm is not None:
                caps[rk] = (lim.rpm, RPM)
            if lim.tpm is not None:
                caps[tk] = (lim.tpm, TPM)
        return keys, args, caps

    @staticmethod
    def headers(levels_flat: Sequence[Any], caps: dict[str, tuple[int, str]]) -> dict[str, str]:
        """The response's headers from ``rl_apply``'s answer (bucket key, level, ...)."""
        levels = {_s(levels_flat[i]): float(_s(levels_flat[i + 1])) for i in range(0, len(levels_flat), 2)}
        return headers_of([(levels[k], cap, kind) for k, (cap, kind) in caps.items() if k in levels])

    async def refusal(self, out: list[str], path: Sequence[tuple[str, NodeLimits]], tokens: int,
                      now_s: float) -> GatewayError:
        """The 429 of ``rl_check``'s refusal (a rate limit's carries the path's current headers)."""
        what, i = out[0], int(out[1]) - 1
        node_id, lim = path[i]
        if what == "concurrency":
            return concurrency_refused(node_id, int(out[2]))
        kind = RPM if out[2] == "1" else TPM
        cap = int(lim.rpm if kind == RPM else lim.tpm)  # type: ignore[arg-type]
        if what == "never":
            return never_fits(node_id, kind, 1 if kind == RPM else tokens, cap)
        return rate_limited(node_id, kind, cap, float(out[3]), await self._headers(path, now_s))

    async def _headers(self, path: Sequence[tuple[str, NodeLimits]], now_s: float) -> dict[str, str]:
        keys: list[str] = []
        caps: list[tuple[int, str]] = []
        for node_id, lim in path:
            for kind, cap in ((RPM, lim.rpm), (TPM, lim.tpm)):
                if cap is not None:
                    keys.append(self._bucket_key(node_id, kind))
                    caps.append((cap, kind))
        if not keys:
            return {}
        levels = await self._read(keys=keys, args=[repr(float(now_s)), *(c for c, _ in caps)])
        return headers_of([(float(_s(lv)), cap, kind) for lv, (cap, kind) in zip(levels, caps, strict=True)])

    def finish_call(self, node_ids: Sequence[str], estimate: int, actual_tokens: int,
                    now_s: float) -> tuple[list[str], list[str], list[str]]:
        """``rl_correct``'s keys and arguments (the TPM ``estimate`` replaced by ``actual_tokens``)
        and ``rl_release``'s keys (the concurrency slots)."""
        return ([self._bucket_key(n, TPM) for n in node_ids], [repr(float(now_s)), str(actual_tokens - estimate)],
                [self._cc_key(n) for n in node_ids])

    async def renew(self, flights: Iterable[tuple[str, Sequence[str]]], now_s: float) -> None:
        """Extend the lease of each (request id, node ids) still running on this replica."""
        until = now_s + self.lease_s
        async with self.redis.pipeline(transaction=False) as pipe:
            for rid, node_ids in flights:
                for n in node_ids:
                    pipe.zadd(self._cc_key(n), {rid: until}, xx=True)
            await pipe.execute()
