"""Budget holds in Redis: ``spent + reserved <= budget`` kept exactly across gateway replicas.

Each step is Lua inside one script, so no interleaving of replicas can overspend:

* ``bu_check`` / ``bu_hold`` (in the admission script of ``redis_admission``): check every
  budgeted (node, period) of the hold, then add the hold to all of them (all or nothing).
* ``bu_finish``: remove the hold (once: a second call finds none and changes nothing), moving its
  actual cost into ``spent`` (settle) or only returning the reservation (release).

Leases: a hold is scored in ``tk:holds`` by its lease expiry, which the replica that took it
renews from its heartbeat while the request runs. A dead replica stops renewing; ``reclaim`` (run
by every replica's heartbeat) finishes holds whose lease has passed: settled at the ledger's cost
when the request reached the ledger, else released. A released-by-reclaim hold leaves a marker,
so a replica that was only slow (its hold reclaimed under it) still charges its actual cost at
``settle``, once.

Spend is rebuilt from the ledger: ``seed`` writes the ledger's spend in one script, only when the
Redis data set has not been seeded (``tk:seeded`` absent: a new or restarted Redis). Until then
an admission answers ``Unseeded`` and the caller seeds first, so an empty Redis never admits
against zero spend. ``tk:seeded`` keeps the PostgreSQL snapshot the spend was read in; a request
admitted before Redis lost its data settles afterwards with its event's transaction id, and is
charged exactly when that snapshot did not count it: nothing twice, nothing lost.

Keys: ``tk:bu:{node}:{period}`` hash (spent, reserved); ``tk:hold:{request id}`` hash
(charges, amount); ``tk:holds`` sorted set (request id by lease expiry); ``tk:rc:{request id}``
reclaim markers (a day).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
from redis.asyncio import Redis

from tokenomy.gateway.stores.redis_store import RedisStore
from tokenomy.gateway.stores.redis_store import text as _s
from tokenomy.gateway.stores.reservations import Charge, Hold, Refusal

_EPS = 1e-12
_MARKER_TTL_S = 86400


class Unseeded(RuntimeError):
    """Redis holds no spend yet (new or restarted): seed it from the ledger, then retry."""


# The hold steps as Lua functions over (K, A), so that one script runs them alone (below) or as
# part of a fleet admission and finish (``redis_admission``).
# bu_check / bu_hold: K: seeded flag, hold, holds zset, then one usage key per charge;
# A: request id, amount, lease until, charges json, then per charge its budget (-1: none).
# bu_check answers {'unseeded'}, {'held'} (this request id holds already), {'refused', charge
# index, spent, reserved} or nil (it fits); bu_hold adds the hold to every charge and returns each
# charge's spend.
# bu_finish: K: hold, holds zset, marker, seeded flag
# A: 1 request id, 2 actual cost (settle) or '' (release), 3 prefix,
#    4 mode ('finish' | 'reclaim': only if the lease has passed at A[5] = now), 6 marker ttl,
#    7 the ledger transaction id of the request's event ('' unknown), 8 its charges json
# Markers: a reclaimed hold leaves 'settled' or its charges (released: a late settle charges them);
# the request's own finish then answers 'reclaimed' or 'late' (its slots and session cost are
# still to be returned) and leaves 'done'. 'none': nothing left to finish (a second call).
# A settle that finds neither hold nor marker comes after Redis lost its data: its cost is added
# unless the ledger snapshot the spend was rebuilt from (tk:seeded = 'xmin:xmax:xip,...') saw it.
HOLDS_LUA = """
local function bu_check(K, A)
  if redis.call('EXISTS', K[1]) == 0 then return {'unseeded'} end
  if redis.call('EXISTS', K[2]) == 1 then return {'held'} end
  local amount = tonumber(A[2])
  for i = 4, #K do
    local budget = tonumber(A[i + 1])
    if budget >= 0 then
      local h = redis.call('HMGET', K[i], 'spent', 'reserved')
      local spent, reserved = tonumber(h[1]) or 0, tonumber(h[2]) or 0
      if spent + reserved + amount > budget + 1e-12 then
        return {'refused', tostring(i - 3), tostring(spent), tostring(reserved)}
      end
    end
  end
  return nil
end
local function bu_hold(K, A)
  local spent = {}
  for i = 4, #K do
    redis.call('HINCRBYFLOAT', K[i], 'reserved', A[2])
    spent[#spent + 1] = redis.call('HGET', K[i], 'spent') or '0'
  end
  redis.call('HSET', K[2], 'charges', A[4], 'amount', A[2], 'lease', A[3])
  redis.call('ZADD', K[3], A[3], A[1])
  return spent
end
local function bu_finish(K, A)
  local rid, actual, prefix, mode = A[1], A[2], A[3], A[4]
  local function add_spent(charges_json)
    for _, c in ipairs(cjson.decode(charges_json)) do
      redis.call('HINCRBYFLOAT', prefix .. 'bu:' .. c[1] .. ':' .. c[2], 'spent', actual)
    end
  end
  local function seen_by_seed(xid)
    local snap = redis.call('GET', K[4])
    if snap == false then return false end
    local xmin, xmax, xip = string.match(snap, '^(%d+):(%d+):(.*)$')
    if xmin == nil then return false end
    xid = tonumber(xid)
    if xid < tonumber(xmin) then return true end
    if xid >= tonumber(xmax) then return false end
    for x in string.gmatch(xip, '%d+') do if tonumber(x) == xid then return false end end
    return true
  end
  local h = redis.call('HMGET', K[1], 'charges', 'amount')
  if h[1] == false then
    if mode ~= 'finish' then return {'none'} end
    local marker = redis.call('GET', K[3])
    if marker == 'done' then return {'none'} end
    if marker then  -- reclaimed under a slow replica: finish it here, once
      redis.call('SET', K[3], 'done', 'EX', A[6])
      if marker == 'settled' or actual == '' then return {'reclaimed'} end
      add_spent(marker)
      return {'late', marker, '0'}
    end
    if actual ~= '' and A[7] ~= '' and A[8] ~= '' and not seen_by_seed(A[7]) then
      redis.call('SET', K[3], 'done', 'EX', A[6])
      add_spent(A[8])
      return {'late', A[8], '0'}
    end
    return {'none'}
  end
  if mode == 'reclaim' then
    local lease = tonumber(redis.call('ZSCORE', K[2], rid))
    if lease ~= nil and lease > tonumber(A[5]) then return {'renewed'} end
  end
  local amount = tonumber(h[2])
  local spent = {}
  for i, c in ipairs(cjson.decode(h[1])) do
    local key = prefix .. 'bu:' .. c[1] .. ':' .. c[2]
    local reserved = tonumber(redis.call('HGET', key, 'reserved')) or 0
    redis.call('HSET', key, 'reserved', tostring(math.max(0, reserved - amount)))
    if actual ~= '' then spent[i] = redis.call('HINCRBYFLOAT', key, 'spent', actual)
    else spent[i] = redis.call('HGET', key, 'spent') or '0' end
  end
  redis.call('DEL', K[1])
  redis.call('ZREM', K[2], rid)
  if mode == 'reclaim' then
    if actual == '' then redis.call('SET', K[3], h[1], 'EX', A[6])
    else redis.call('SET', K[3], 'settled', 'EX', A[6]) end
  end
  local out = {'held', h[1], h[2]}
  for _, x in ipairs(spent) do out[#out + 1] = x end
  return out
end
"""

_FINISH = HOLDS_LUA + "return bu_finish(KEYS, ARGV)\n"

# KEYS: seeded flag, then one usage key per charge; ARGV: owner, then each charge's spend
_SEED = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') == false then return 0 end
for i = 2, #KEYS do redis.call('HSET', KEYS[i], 'spent', ARGV[i]) end
return 1
"""


class RedisReservations(RedisStore):
    """Budget holds in Redis: the keys and arguments of ``HOLDS_LUA``'s steps, seeding, leases."""

    def __init__(self, redis: Redis, lease_s: float = 30.0, prefix: str = "tk:") -> None:
        super().__init__(redis, lease_s, prefix)
        self._finish_script = redis.register_script(_FINISH)
        self._seed = redis.register_script(_SEED)
        self.seeded_key = f"{prefix}seeded"
        self.holds_key = f"{prefix}holds"

    def _usage_key(self, charge: Charge) -> str:
        return f"{self.prefix}bu:{charge[0]}:{charge[1]}"

    def _hold_key(self, request_id: str) -> str:
        return f"{self.prefix}hold:{request_id}"

    def _marker_key(self, request_id: str) -> str:
        return f"{self.prefix}rc:{request_id}"

    async def seed(self, spent: Mapping[Charge, float], snapshot: str) -> bool:
        """Write the ledger's spend, unless Redis was seeded already (True when this call did).
        ``snapshot``: the ledger's ``pg_current_snapshot()`` the spend was read in (which events
        it counted), or any other tag when none applies."""
        charges = list(spent)
        keys = [self.seeded_key, *(self._usage_key(c) for c in charges)]
        return bool(await self._seed(keys=keys, args=[snapshot, *(repr(float(spent[c])) for c in charges)]))

    def reserve_call(self, hold: Hold, budgets_usd: Mapping[Charge, float], now_s: float) -> tuple[list[str], list[str]]:
        """Keys and arguments of ``bu_check``/``bu_hold`` (a lease to ``now_s + lease_s``)."""
        keys = [self.seeded_key, self._hold_key(hold.request_id), self.holds_key,
                *(self._usage_key(c) for c in hold.charges)]
        args = [hold.request_id, repr(float(hold.amount_usd)), repr(float(now_s + self.lease_s)),
                orjson.dumps(hold.charges).decode(), *(repr(float(budgets_usd.get(c, -1.0))) for c in hold.charges)]
        return keys, args

    @staticmethod
    def refusal(out: list[str], hold: Hold, budgets_usd: Mapping[Charge, float]) -> Refusal:
        """``bu_check``'s ``['refused', charge index, spent, reserved]`` (``Unseeded`` for ``['unseeded']``)."""
        if out[0] == "unseeded":
            raise Unseeded("Redis holds no budget state yet")
        charge = hold.charges[int(out[1]) - 1]
        return Refusal(charge, budgets_usd[charge], float(out[2]), float(out[3]))

    def finish_call(self, request_id: str, actual: str, mode: str, now_s: float = 0.0,
                    ledger_xid: int | None = None, charges: tuple[Charge, ...] = ()) -> tuple[list[str], list[Any]]:
        """Keys and arguments of ``bu_finish`` (``actual``: the cost, or '' to release)."""
        keys = [self._hold_key(request_id), self.holds_key, self._marker_key(request_id), self.seeded_key]
        return keys, [request_id, actual, self.prefix, mode, repr(float(now_s)), _MARKER_TTL_S,
                      "" if ledger_xid is None else str(ledger_xid), orjson.dumps(charges).decode() if charges else ""]

    @staticmethod
    def finished(request_id: str, answer: list[Any]) -> tuple[str, Hold | None, dict[Charge, float]]:
        """``bu_finish``'s answer: its status, the hold it finished and each charge's spend after."""
        out = [_s(x) for x in answer]
        if out[0] in ("held", "late"):
            charges = tuple((str(n), str(p)) for n, p in json.loads(out[1]))
            spent = {c: float(x) for c, x in zip(charges, out[3:], strict=False)}
            return out[0], Hold(request_id, charges, float(out[2]), 0.0), spent
        return out[0], None, {}

    async def _finish(self, request_id: str, actual: str, mode: str, now_s: float = 0.0, ledger_xid: int | None = None,
                      charges: tuple[Charge, ...] = ()) -> tuple[str, Hold | None, dict[Charge, float]]:
        keys, args = self.finish_call(request_id, actual, mode, now_s, ledger_xid, charges)
        return self.finished(request_id, await self._finish_script(keys=keys, args=args))

    async def settle(self, request_id: str, actual_usd: float, ledger_xid: int | None = None,
                     charges: tuple[Charge, ...] = ()) -> tuple[Hold | None, dict[Charge, float]]:
        """The hold alone settled at ``actual_usd`` (a retry of a finish whose answer was lost);
        (None, {}) when nothing was held. A hold that Redis lost (restarted empty) is charged to
        ``charges`` unless the ledger snapshot the spend was rebuilt from already counted the event
        (``ledger_xid``: its ledger transaction id)."""
        _, hold, spent = await self._finish(request_id, repr(float(actual_usd)), "finish", ledger_xid=ledger_xid,
                                            charges=charges)
        return hold, spent

    async def renew(self, request_ids: Iterable[str], now_s: float) -> None:
        """Extend the lease of holds still in flight on this replica."""
        until = now_s + self.lease_s
        mapping = {rid: until for rid in request_ids}
        if mapping:
            await self.redis.zadd(self.holds_key, dict(mapping), xx=True)

    async def reclaim(self, now_s: float, ledger_cost_usd: Callable[[str], Awaitable[float | None]],
                      limit: int = 200) -> dict[str, int]:
        """Finish holds whose lease has passed (a dead replica's): settled at the ledger's cost
        when the request reached the ledger, else released. Safe to run on every replica."""
        rids = [_s(r) for r in await self.redis.zrangebyscore(self.holds_key, "-inf", repr(float(now_s)),
                                                              start=0, num=limit)]
        counts = {"settled": 0, "released": 0}
        for rid in rids:
            cost = await ledger_cost_usd(rid)
            actual = "" if cost is None else repr(float(cost))
            status, _, _ = await self._finish(rid, actual, "reclaim", now_s)
            if status == "held":
                counts["released" if cost is None else "settled"] += 1
        return counts

    async def usages(self, charges: Sequence[Charge]) -> list[tuple[float, float]]:
        """(spent_usd, reserved_usd) of each charge, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for c in charges:
                pipe.hmget(self._usage_key(c), ["spent", "reserved"])
            rows: list[Any] = await pipe.execute() if charges else []
        return [(float(_s(s)) if s is not None else 0.0, float(_s(r)) if r is not None else 0.0) for s, r in rows]
