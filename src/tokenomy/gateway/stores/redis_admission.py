"""A fleet replica's request in two Redis round trips: one script admits it, one finishes it.

The steps are the Redis stores' own Lua functions (``redis_breakers.BREAKER_LUA``,
``redis_limits.LIMITS_LUA``, ``redis_reservations.HOLDS_LUA``), composed here so that each end of
a request is one ``EVALSHA``:

* ``admit``: every check first (a request id still holding: 409; breakers; RPM/TPM/concurrency on
  every node of the key's path; the budget hold on every node), then, only when all pass, every
  charge (the breaker's turn, the buckets and slots, the hold). All or nothing, atomic across
  replicas, with no undo step: a refused request changes nothing but the trip a breaker records.
* ``finish`` (settle, release, or the undo of an admission a later local step refused): the hold
  (settled at the actual cost, idempotent per request id), the TPM estimate corrected, the
  concurrency slots returned, the session's breaker cost, in one script; a second finish of the
  same request id changes nothing.

Each round trip costs the gateway a socket write and read and redis-py's encoding and parsing of
one command; on loopback the write also runs the receiver's TCP work in the sender's system time.
Seven of them a request (the separate scripts) cost a fleet replica about 1 ms of CPU more than
the embedded gateway; two cost a fraction (``benchmarks/gateway_fleet.py``, docs/gateway-ops.md).
"""

from __future__ import annotations

from typing import Any

import orjson
from redis.commands.core import AsyncScript

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.stores.guard_state import AdmitStep, Admitted, Finished, FinishStep
from tokenomy.gateway.stores.redis_breakers import BREAKER_LUA, RedisBreakers
from tokenomy.gateway.stores.redis_limits import LIMITS_LUA, RedisRateLimits
from tokenomy.gateway.stores.redis_pipe import RedisPipe
from tokenomy.gateway.stores.redis_reservations import HOLDS_LUA, RedisReservations, Unseeded
from tokenomy.gateway.stores.redis_store import text as _s
from tokenomy.gateway.stores.reservations import Refusal

_SLICE = """
local function slice(t, i, n)
  local r = {}
  for k = i, i + n - 1 do r[#r + 1] = t[k] end
  return r
end
"""

# KEYS: breaker keys (4), limit keys (3 per node), hold keys (3 + one per charge)
# ARGV: the breaker's, the limits' (4 + 3 per node) and the hold's arguments, each a JSON array:
# three arguments to encode instead of forty (redis-py encodes each in Python, the script's
# cjson.decode is C)
_ADMIT = BREAKER_LUA + LIMITS_LUA + HOLDS_LUA + _SLICE + """
local BA, LA, HA = cjson.decode(ARGV[1]), cjson.decode(ARGV[2]), cjson.decode(ARGV[3])
local nlk = #LA - 4
local BK, LK, HK = slice(KEYS, 1, 4), slice(KEYS, 5, nlk), slice(KEYS, 5 + nlk, #KEYS - 4 - nlk)
local hold = bu_check(HK, HA)
if hold and hold[1] == 'unseeded' then return hold end
if hold and hold[1] == 'held' then return {'duplicate'} end
local r = br_check(BK, BA)
if r then return {'breaker', r} end
local refusal, plan = rl_check(LK, LA)
if refusal then return {'limits', refusal} end
if hold then return {'budget', hold} end
local trips = {}
br_count(BK, BA, trips)
local levels = rl_apply(LK, LA, plan)
local spent = bu_hold(HK, HA)
return {'ok', trips, levels, spent}
"""

# KEYS: the hold's 4 keys, n tpm buckets, n concurrency sets, the session's breaker hash ('': none)
# ARGV: the hold's (bu_finish), the correction's (rl_correct) and the breaker's arguments, as JSON
_FINISH = BREAKER_LUA + LIMITS_LUA + HOLDS_LUA + _SLICE + """
local FA = cjson.decode(ARGV[1])
local n = (#KEYS - 5) / 2
local r = bu_finish(slice(KEYS, 1, 4), FA)
if r[1] ~= 'none' then  -- 'none': finished already (or Redis lost it): correct nothing twice
  rl_correct(slice(KEYS, 5, n), cjson.decode(ARGV[2]))
  br_finish(slice(KEYS, 5 + 2 * n, 1), cjson.decode(ARGV[3]))
end
rl_release(slice(KEYS, 5 + n, n), FA[1])
return r
"""


class RedisAdmission:
    """The two scripts over one replica's stores (their keys, arguments and answers)."""

    def __init__(self, limits: RedisRateLimits, holds: RedisReservations, breakers: RedisBreakers,
                 pipe: RedisPipe | None = None) -> None:
        self.limits = limits
        self.holds = holds
        self.breakers = breakers
        self.pipe = pipe  # the scripts' connection (else redis-py's pool)
        self._admit = limits.redis.register_script(_ADMIT)
        self._finish = limits.redis.register_script(_FINISH)

    async def _run(self, script: AsyncScript, keys: list[str], args: list[bytes]) -> Any:
        if self.pipe is None:
            return await script(keys=keys, args=args)
        return await self.pipe.evalsha(script, [k.encode() for k in keys], args)

    async def admit(self, step: AdmitStep) -> Admitted | Refusal:
        """Admit ``step``: the headers and spend, or the budget's ``Refusal``; raises the 429 of a
        breaker or a limit, 409 for a request id that holds already, ``Unseeded``."""
        hold = step.hold
        bk, ba = self.breakers.admit_call(step.key_id, step.session_id, step.fingerprint, step.prompt_tokens,
                                          hold.amount_usd, step.now_s, step.session_need_usd)
        lk, la, caps = self.limits.acquire_call(step.path, step.tokens, step.now_s, hold.request_id)
        hk, ha = self.holds.reserve_call(hold, step.budgets_usd, step.now_s)
        out = await self._run(self._admit, [*bk, *lk, *hk], [orjson.dumps(ba), orjson.dumps(la), orjson.dumps(ha)])
        status = _s(out[0])
        if status == "ok":
            self.breakers.collect([_s(x) for x in out[1]])
            return Admitted(self.limits.headers(out[2], caps), tuple(float(_s(x)) for x in out[3]))
        if status == "unseeded":
            raise Unseeded("Redis holds no budget state yet")
        if status == "duplicate":
            raise GatewayError(409, f"request id {hold.request_id!r} is already in flight",
                               code="duplicate_request_id")
        detail = [_s(x) for x in out[1]]
        if status == "breaker":
            raise self.breakers.refusal(detail, step.key_id, step.session_id, step.now_s)
        if status == "limits":
            raise await self.limits.refusal(detail, step.path, step.tokens, step.now_s)
        return self.holds.refusal(detail, hold, step.budgets_usd)

    async def finish(self, step: FinishStep, ledger_xid: int | None) -> Finished:
        """Settle (``actual_usd``) or release (None) the hold, correct the TPM estimate, return the
        slots and the session's worst case, in one script; the hold it finished (None: none)."""
        actual = "" if step.actual_usd is None else repr(float(step.actual_usd))
        fk, fa = self.holds.finish_call(step.request_id, actual, "finish", ledger_xid=ledger_xid, charges=step.charges)
        ck, ca, sk = self.limits.finish_call(step.node_ids, step.estimate_tokens, step.actual_tokens, step.now_s)
        bk, ba = self.breakers.finish_call(step.key_id, step.session_id, step.worst_usd, step.actual_usd or 0.0,
                                           step.undo_turn)
        out = await self._run(self._finish, [*fk, *ck, *sk, *bk], [orjson.dumps(fa), orjson.dumps(ca), orjson.dumps(ba)])
        _, hold, spent = self.holds.finished(step.request_id, out)
        return Finished(hold, spent)
