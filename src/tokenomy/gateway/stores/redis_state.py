"""``GuardState`` in Redis: a fleet's replicas share breakers, limits and budget holds exactly.

Each step is one script (``redis_admission``): ``admit`` checks every breaker, bucket, slot and
budget and only then charges them all; ``finish`` settles or releases the hold, corrects the TPM
estimate, returns the slots and the session's worst case. A script whose answer is lost (Redis
died mid-call) leaves at most a slot or hold nobody renews, which its lease ends (``heartbeat``:
reclaimed, settled at the ledger's cost when the request reached the ledger, else released).

What only a remote store has to do, it does here: spend is rebuilt from the ledger at start-up
and whenever Redis comes back empty (``Unseeded``); this replica's slots and holds are renewed
from the heartbeat; a settle whose call failed is retried there (the hold alone: idempotent);
streamed tokens are added to the shared velocity windows every ``token_flush`` tokens, in the
background, so a stream is cut up to that many tokens late. A call that fails or outlasts
``timeout_s`` raises ``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tokenomy.gateway.ops.breaker import BreakerConfig, Trip
from tokenomy.gateway.ops.tenancy import TenantTree
from tokenomy.gateway.stores.budget_seed import period_starts_s, spend_by_charge
from tokenomy.gateway.stores.guard_state import (
    AdmitStep,
    Admitted,
    Finished,
    FinishStep,
    StoreUnavailable,
    Upkeep,
)
from tokenomy.gateway.stores.redis_admission import RedisAdmission
from tokenomy.gateway.stores.redis_breakers import RedisBreakers
from tokenomy.gateway.stores.redis_limits import RedisRateLimits
from tokenomy.gateway.stores.redis_pipe import RedisPipe
from tokenomy.gateway.stores.redis_reservations import RedisReservations, Unseeded
from tokenomy.gateway.stores.reservations import Charge, Refusal
from tokenomy.gateway.stores.shared_config import SharedStoresConfig

log = logging.getLogger(__name__)
STORE_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


class SpendLedger(Protocol):
    """What the fleet's state reads from the ledger (``PgLedger``)."""

    async def cost(self, request_id: str) -> float | None: ...

    async def spend_snapshot(self, since_s: dict[str, float]) -> tuple[dict[str, dict[str, float]], str]: ...

    def pop_xid(self, request_id: str) -> int | None: ...


@dataclass(slots=True)
class _Stream:
    unsent: int = 0  # streamed tokens not yet added to the shared windows
    cut: bool = False


class RedisState:
    """``GuardState`` over one Redis (``prefix``: each key's start; tests give each its own)."""

    def __init__(self, redis: Redis, shared: SharedStoresConfig, breaker: BreakerConfig, ledger: SpendLedger,
                 tree: Callable[[], TenantTree], *, prefix: str = "tk:") -> None:
        self.redis = redis
        self.shared = shared
        self.ledger = ledger
        self._tree = tree
        self.limits = RedisRateLimits(redis, lease_s=shared.lease_s, prefix=prefix)
        self.holds = RedisReservations(redis, lease_s=shared.lease_s, prefix=prefix)
        self.breakers = RedisBreakers(redis, breaker, prefix=prefix)
        self.pipe = RedisPipe(shared.redis_url, shared.timeout_s) if shared.redis_url.startswith("redis://") else None
        self.scripts = RedisAdmission(self.limits, self.holds, self.breakers, self.pipe)
        self._counts_tokens = breaker.key_tokens_per_min is not None or breaker.session_tokens_per_min is not None
        self.mine: dict[str, tuple[str, ...]] = {}  # this replica's requests in flight: their leases to renew
        self._streams: dict[str, _Stream] = {}
        self._unsettled: list[tuple[str, float, tuple[Charge, ...], int | None]] = []  # (rid, cost, charges, xid)
        self._background: set[asyncio.Task[Any]] = set()

    async def seed(self, now_s: float) -> bool:
        """Write the ledger's spend for the current periods into Redis, once per Redis data set."""
        by_period, snapshot = await self.ledger.spend_snapshot(period_starts_s(now_s))
        totals = spend_by_charge(self._tree(), by_period, now_s)
        seeded = await self.holds.seed(totals, snapshot)
        if seeded:
            log.info("fleet budgets: seeded %d charges from the ledger", len(totals))
        return seeded

    async def start(self, now_s: float) -> None:
        """Seed the budgets; a store away at start-up (a replica restarted during an outage) leaves
        it to the first admission that finds Redis unseeded, as when Redis comes back empty."""
        try:
            await self._call(self.seed(now_s))
        except StoreUnavailable as e:
            log.warning("fleet budgets: not seeded at start-up (%s); the first admission that needs it will", e)

    async def _call(self, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except STORE_ERRORS as e:
            raise StoreUnavailable(str(e) or type(e).__name__) from e

    async def admit(self, step: AdmitStep) -> Admitted | Refusal:
        try:
            try:
                got = await self.scripts.admit(step)
            except Unseeded:  # Redis came back empty: rebuild spend from the ledger, then once more
                await self.seed(step.now_s)
                got = await self.scripts.admit(step)
        except STORE_ERRORS as e:
            raise StoreUnavailable(str(e) or type(e).__name__) from e
        if isinstance(got, Admitted):
            self.mine[step.request_id] = tuple([n for n, _ in step.path])
        return got

    async def finish(self, step: FinishStep) -> Finished:
        rid = step.request_id
        self.mine.pop(rid, None)
        self._streams.pop(rid, None)
        xid = self.ledger.pop_xid(rid)
        try:
            return await self.scripts.finish(step, xid if step.actual_usd is not None else None)
        except STORE_ERRORS as e:  # the hold: retried by the heartbeat; the slots end with their lease
            if step.actual_usd is not None:
                self._unsettled.append((rid, step.actual_usd, step.charges, xid))
            raise StoreUnavailable(str(e) or type(e).__name__) from e

    def stream_tokens(self, request_id: str, key_id: str, session_id: str | None, n: int, now_s: float) -> bool:
        s = self._streams.get(request_id)
        if s is None:
            s = self._streams[request_id] = _Stream()
        if s.cut or not self._counts_tokens:
            return not s.cut
        s.unsent += n
        if s.unsent >= self.shared.token_flush:
            batch, s.unsent = s.unsent, 0
            self._spawn(self._add_tokens(s, key_id, session_id, batch, now_s))
        return True

    async def _add_tokens(self, s: _Stream, key_id: str, session_id: str | None, n: int, now_s: float) -> None:
        if not await self.breakers.add_tokens(key_id, session_id, n, now_s):
            s.cut = True

    def trip_session_budget(self, key_id: str, session_id: str, now_s: float) -> None:
        self._spawn(self.breakers.budget_crossed(key_id, session_id, now_s))

    def _spawn(self, call: Awaitable[Any]) -> None:
        async def guarded() -> None:
            try:
                await call
            except STORE_ERRORS as e:
                log.warning("guard state: background Redis call failed: %s", e)

        task = asyncio.get_running_loop().create_task(guarded())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def session_spend_usd(self, key_id: str, session_id: str) -> float:
        return float(await self._call(self.breakers.session_spend_usd(key_id, session_id)))

    async def usage(self, charges: Sequence[Charge]) -> list[tuple[float, float]]:
        return list(await self._call(self.holds.usages(charges)))

    async def key_tokens_per_s(self, key_id: str, now_s: float) -> float:
        return float(await self._call(self.breakers.key_tokens_per_s(key_id, now_s)))

    def drain_trips(self) -> list[Trip]:
        if not self.breakers.trips:
            return []
        trips, self.breakers.trips = self.breakers.trips, []
        return trips

    async def heartbeat(self, now_s: float) -> Upkeep:
        return await self._call(self._upkeep(now_s))

    async def _upkeep(self, now_s: float) -> Upkeep:
        settled: list[tuple[Finished, float]] = []
        while self._unsettled:
            rid, cost, charges, xid = self._unsettled[0]
            hold, spent = await self.holds.settle(rid, cost, xid, charges)
            self._unsettled.pop(0)
            if hold is not None:
                settled.append((Finished(hold, spent), cost))
        await self.limits.renew(list(self.mine.items()), now_s)
        await self.holds.renew(list(self.mine), now_s)
        return Upkeep(await self.holds.reclaim(now_s, self.ledger.cost), tuple(settled))

    async def drain(self) -> None:
        while self._background:
            await asyncio.gather(*self._background)

    async def aclose(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self.pipe is not None:
            await self.pipe.aclose()
