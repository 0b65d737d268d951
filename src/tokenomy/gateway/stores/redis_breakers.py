"""Agent circuit breakers with their state in Redis: a runaway agent whose requests are spread over
several gateway replicas is cut at the same turn as through one.

Same trips and codes as the in-process ``ops.breaker.Breakers`` (turn cap, repetition, velocity, session
budget; a cooldown during which the session or key is refused), but the state of each session
and key lives in Redis and each step is one Lua script: ``admit`` checks every breaker and counts
the admitted turn (turns, fingerprint, prompt tokens, worst cost in flight) atomically, so two
replicas admitting turns of one session at once cannot both pass a cap (``br_check``/``br_count``,
run inside the admission script of ``redis_admission``). ``add_tokens`` counts streamed output
tokens in the velocity windows; ``br_finish`` (in the finish script) replaces a request's worst
case by its actual cost. Session state expires ``session_ttl_s`` after its last use (in place of the
in-process LRU bound).

Keys: ``tk:br:k:{key}`` and ``tk:br:s:{key}:{session}`` hashes (turns, fp, repeats, spent, inflight,
vtotal, open_until, code, reason) and ``...:w`` sorted sets (the velocity window's events).
"""

from __future__ import annotations

import secrets

from redis.asyncio import Redis

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.breaker import BreakerConfig, Trip, breaker_open
from tokenomy.gateway.stores.redis_store import text as _s

# The breaker steps as Lua functions over (K, A) = the script's keys and arguments, so that one
# script can run them alone (the scripts below) or as part of a fleet admission (``redis_admission``).
# K: key hash, key window, session hash, session window (session keys '' when none)
# A: 1 now, 2 fingerprint, 3 prompt (or streamed) tokens, 4 worst usd, 5 max turns, 6 repeat limit,
#    7 session budget, 8 window s, 9 cooldown s, 10 key tpm, 11 session tpm, 12 uid, 13 key id,
#    14 session id, 15 ttl s, 16 what the request needs of the session's budget   (-1: off)
BREAKER_LUA = """
local function br_num(h, f) return tonumber(redis.call('HGET', h, f)) end
local function br_is_open(h, now)
  local u = br_num(h, 'open_until')
  if u ~= nil and now < u then return u end
  return nil
end
local function br_trip(h, now, cooldown, code, reason, out, scope, subject)
  if br_is_open(h, now) then return end
  local u = now + cooldown
  redis.call('HSET', h, 'open_until', tostring(u), 'code', code, 'reason', reason)
  out[#out + 1] = scope; out[#out + 1] = subject; out[#out + 1] = code; out[#out + 1] = reason
  out[#out + 1] = tostring(u)
end
-- add n tokens to the window of hash h (events in zset w); returns the window's total
local function br_window_add(h, w, now, n, window_s, uid)
  local old = redis.call('ZRANGEBYSCORE', w, '-inf', now - window_s)
  local total = br_num(h, 'vtotal') or 0
  for _, m in ipairs(old) do total = total - tonumber(string.match(m, '^[^:]*:([^:]*)')) end
  redis.call('ZREMRANGEBYSCORE', w, '-inf', now - window_s)
  if n > 0 then
    redis.call('ZADD', w, now, uid .. ':' .. n)
    total = total + n
  end
  redis.call('HSET', h, 'vtotal', tostring(total))
  return total
end
-- count A[3] tokens in the key's (and session's) velocity window; 0 when a cap is crossed (trips)
local function br_velocity(K, A, out)
  local now, n, window_s, cooldown = tonumber(A[1]), tonumber(A[3]), tonumber(A[8]), tonumber(A[9])
  local key_tpm, ses_tpm = tonumber(A[10]), tonumber(A[11])
  local ok = 1
  local kt = br_window_add(K[1], K[2], now, n, window_s, A[12])
  if key_tpm >= 0 and kt > key_tpm * window_s / 60.0 then
    br_trip(K[1], now, cooldown, 'breaker_velocity', 'more than ' .. A[10] .. ' tokens/min on key ' .. A[13],
            out, 'key', A[13])
    ok = 0
  end
  if K[3] ~= '' and ses_tpm >= 0 then
    if br_window_add(K[3], K[4], now, n, window_s, A[12]) > ses_tpm * window_s / 60.0 then
      br_trip(K[3], now, cooldown, 'breaker_velocity', 'more than ' .. A[11] .. ' tokens/min in session',
              out, 'session', A[14])
      ok = 0
    end
  end
  return ok
end
-- the check: {'open', scope, code, reason, until, trips...} when an open or newly tripped breaker
-- refuses the request, else nil (nothing written)
local function br_check(K, A)
  local now, fp = tonumber(A[1]), A[2]
  local max_turns, rep, budget = tonumber(A[5]), tonumber(A[6]), tonumber(A[7])
  local cooldown = tonumber(A[9])
  local kh, sh = K[1], K[3]
  local u = br_is_open(kh, now)
  if u then return {'open', 'key', redis.call('HGET', kh, 'code'), redis.call('HGET', kh, 'reason'), tostring(u)} end
  if sh == '' then return nil end
  u = br_is_open(sh, now)
  if u then return {'open', 'session', redis.call('HGET', sh, 'code'), redis.call('HGET', sh, 'reason'), tostring(u)} end
  local out = {}
  local turns, last = br_num(sh, 'turns') or 0, redis.call('HGET', sh, 'fp')
  local repeats = br_num(sh, 'repeats') or 0
  local spent, inflight = br_num(sh, 'spent') or 0, br_num(sh, 'inflight') or 0
  if max_turns >= 0 and turns >= max_turns then
    br_trip(sh, now, cooldown, 'breaker_turn_cap', turns .. ' turns reached the cap of ' .. max_turns, out, 'session', A[14])
  elseif rep >= 0 and fp ~= '' and fp == last and repeats + 1 >= rep then
    br_trip(sh, now, cooldown, 'breaker_repetition', 'the same call repeated ' .. (repeats + 1) .. ' times in a row',
            out, 'session', A[14])
    redis.call('HDEL', sh, 'fp'); redis.call('HSET', sh, 'repeats', '0')
  elseif budget >= 0 and (spent + inflight >= budget or (tonumber(A[16]) > 0 and spent + inflight + tonumber(A[16]) > budget)) then
    br_trip(sh, now, cooldown, 'breaker_session_budget',
            string.format('session spent $%.4f of $%.4f', spent, budget), out, 'session', A[14])
  end
  u = br_is_open(sh, now)
  if u then
    local r = {'open', 'session', redis.call('HGET', sh, 'code'), redis.call('HGET', sh, 'reason'), tostring(u)}
    for _, x in ipairs(out) do r[#r + 1] = x end
    return r
  end
  return nil
end
-- count the admitted request: its prompt tokens in the velocity windows, a turn, its fingerprint,
-- its worst cost in flight; trips go to out
local function br_count(K, A, out)
  br_velocity(K, A, out)
  local ttl = tonumber(A[15])
  local kh, kw, sh, sw, fp = K[1], K[2], K[3], K[4], A[2]
  redis.call('EXPIRE', kh, ttl); redis.call('EXPIRE', kw, ttl)
  if sh ~= '' then
    local last = redis.call('HGET', sh, 'fp')
    local repeats = 1
    if fp ~= '' and fp == last then repeats = (br_num(sh, 'repeats') or 0) + 1 end
    redis.call('HINCRBY', sh, 'turns', 1)
    if fp ~= '' then redis.call('HSET', sh, 'fp', fp) else redis.call('HDEL', sh, 'fp') end
    redis.call('HSET', sh, 'repeats', tostring(repeats))
    redis.call('HINCRBYFLOAT', sh, 'inflight', A[4])
    redis.call('EXPIRE', sh, ttl); redis.call('EXPIRE', sw, ttl)
  end
end
-- K: session hash ('': none); A: worst usd, actual usd, undo turn (0/1)
local function br_finish(K, A)
  if K[1] == '' or redis.call('EXISTS', K[1]) == 0 then return 0 end
  local inflight = tonumber(redis.call('HGET', K[1], 'inflight')) or 0
  redis.call('HSET', K[1], 'inflight', tostring(math.max(0, inflight - tonumber(A[1]))))
  redis.call('HINCRBYFLOAT', K[1], 'spent', A[2])
  if A[3] == '1' then
    local turns = tonumber(redis.call('HGET', K[1], 'turns')) or 0
    redis.call('HSET', K[1], 'turns', tostring(math.max(0, turns - 1)))
  end
  return 1
end
"""

# KEYS, ARGV as br_check (ARGV[3] = streamed tokens)
_TOKENS = BREAKER_LUA + """
local out = {}
local r = {tostring(br_velocity(KEYS, ARGV, out))}
for _, x in ipairs(out) do r[#r + 1] = x end
return r
"""

# KEYS: session hash; ARGV: now, cooldown, reason, session id
_TRIP = BREAKER_LUA + """
local out = {}
br_trip(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), 'breaker_session_budget', ARGV[3], out, 'session', ARGV[4])
return out
"""


def _opt(x: float | int | None) -> str:
    return "-1" if x is None else repr(x)


class RedisBreakers:
    """Breaker state shared by every replica through Redis (async). ``trips`` collects the trips
    this replica's calls caused, for its alerts and metrics."""

    def __init__(self, redis: Redis, config: BreakerConfig, session_ttl_s: float = 86400.0,
                 prefix: str = "tk:") -> None:
        self.redis = redis
        self.config = config
        self.session_ttl_s = session_ttl_s
        self.prefix = prefix
        self.trips: list[Trip] = []
        self._tokens = redis.register_script(_TOKENS)
        self._trip = redis.register_script(_TRIP)

    def _keys(self, key_id: str, session_id: str | None) -> list[str]:
        kh = f"{self.prefix}br:k:{key_id}"
        sh = "" if session_id is None else f"{self.prefix}br:s:{key_id}:{session_id}"
        return [kh, kh + ":w", sh, sh + ":w" if sh else ""]

    def _args(self, key_id: str, session_id: str | None, fingerprint: str | None, tokens: int,
              worst_usd: float, now_s: float, need_usd: float = 0.0) -> list[str]:
        c = self.config
        return [repr(float(now_s)), fingerprint or "", str(tokens), repr(float(worst_usd)),
                _opt(c.max_turns_per_session), _opt(c.repeat_limit), _opt(c.session_budget_usd),
                repr(c.velocity_window_s), repr(c.cooldown_s), _opt(c.key_tokens_per_min),
                _opt(c.session_tokens_per_min), secrets.token_hex(6), key_id, session_id or "",
                str(int(self.session_ttl_s)), repr(float(need_usd))]

    def collect(self, flat: list[str]) -> None:
        for i in range(0, len(flat) - 4, 5):
            self.trips.append(Trip(flat[i], flat[i + 1], flat[i + 2], flat[i + 3], float(flat[i + 4])))

    def admit_call(self, key_id: str, session_id: str | None, fingerprint: str | None, prompt_tokens: int,
                   worst_cost_usd: float, now_s: float, need_usd: float = 0.0) -> tuple[list[str], list[str]]:
        """Keys and arguments of the admission step (``br_check`` then ``br_count``)."""
        return (self._keys(key_id, session_id),
                self._args(key_id, session_id, fingerprint, prompt_tokens, worst_cost_usd, now_s, need_usd))

    def refusal(self, out: list[str], key_id: str, session_id: str | None, now_s: float) -> GatewayError:
        """The 429 of ``br_check``'s answer ``['open', scope, code, reason, until, trips...]``."""
        _, scope, code, reason, until = out[:5]
        self.collect(out[5:])
        subject = f"key {key_id}" if scope == "key" else f"session {session_id!r}"
        return breaker_open(subject, code, reason, float(until) - now_s)

    async def add_tokens(self, key_id: str, session_id: str | None, n: int, now_s: float) -> bool:
        """Count ``n`` streamed output tokens; False when a velocity cap is crossed (cut the stream)."""
        out = [_s(x) for x in await self._tokens(keys=self._keys(key_id, session_id),
                                                 args=self._args(key_id, session_id, None, n, 0.0, now_s))]
        self.collect(out[1:])
        return out[0] == "1"

    def finish_call(self, key_id: str, session_id: str | None, worst_cost_usd: float, actual_usd: float,
                    undo_turn: bool = False) -> tuple[list[str], list[str]]:
        """Keys and arguments of ``br_finish`` (the session's hash '' when there is none)."""
        return ([self._keys(key_id, session_id)[2]],
                [repr(float(worst_cost_usd)), repr(float(actual_usd)), "1" if undo_turn else "0"])

    async def budget_crossed(self, key_id: str, session_id: str, now_s: float) -> None:
        out = [_s(x) for x in await self._trip(
            keys=[self._keys(key_id, session_id)[2]],
            args=[repr(float(now_s)), repr(self.config.cooldown_s),
                  f"a streamed answer crossed the session budget of ${self.config.session_budget_usd}", session_id])]
        self.collect(out)

    async def session_spend_usd(self, key_id: str, session_id: str) -> float:
        """The session's settled spend plus its requests' worst cases in flight."""
        spent, inflight = await self.redis.hmget(self._keys(key_id, session_id)[2], ["spent", "inflight"])
        return float(spent or 0.0) + float(inflight or 0.0)

    async def key_tokens_per_s(self, key_id: str, now_s: float) -> float:
        """The key's token rate over the velocity window (a routing and admission signal)."""
        kh = self._keys(key_id, None)[0]
        await self._tokens(keys=[kh, kh + ":w", "", ""], args=self._args(key_id, None, None, 0, 0.0, now_s))
        total = await self.redis.hget(kh, "vtotal")
        return float(total or 0.0) / self.config.velocity_window_s
