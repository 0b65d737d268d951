"""Token operations for a fleet of gateway replicas: the ``Guard`` contract over shared stores.

``FleetGuard`` keeps ``OpsGuard``'s policy (authentication, tenancy, admission queue, alerts) and
moves every piece of state that must be exact across replicas into Redis: breakers, RPM/TPM and
concurrency on every node of the key's path, budget holds on every node. A request is two atomic
scripts (``stores/redis_admission``): one checks all of them and only then charges all (a refusal
leaves nothing to undo), one settles or releases all. A script whose answer is lost (Redis died
mid-call) leaves at most a slot or hold that nobody renews, which its lease ends (``reclaim``:
settled at the ledger's cost when the request reached the ledger, else released). Spend is
rebuilt from the PostgreSQL ledger at start-up and whenever Redis comes back empty.

Outages: a Redis call that fails or takes longer than ``timeout_s`` makes ``admit`` follow
``on_outage`` for the key's tier (the scripts' connection and redis-py's sockets time out after
``timeout_s``: ``redis_pipe``, ``redis_client``) (budgeted / unbudgeted): 503 ``store_unavailable`` with
``retry-after``, or this replica's in-process stores (metered in the ledger as always). Settling a
request whose store call fails leaves its hold to the lease: the ledger row is already durable, so
the reclaim settles it at the recorded cost, once.

The admission queue stays per replica (it guards the replica's own backends' connection pools).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.admission import AdmissionSignals
from tokenomy.gateway.ops.alerts import Alerter
from tokenomy.gateway.ops.budget import PriceLike, output_cap, remaining_fraction
from tokenomy.gateway.ops.config import OpsConfig
from tokenomy.gateway.ops.fleet_budget import SharedBudgets
from tokenomy.gateway.ops.guard import Admission, AdmitRequest, SettledUsage
from tokenomy.gateway.ops.metrics import OpsMetrics
from tokenomy.gateway.ops.ops_guard import OpsGuard, _Flight
from tokenomy.gateway.ops.tenancy import Node
from tokenomy.gateway.stores.redis_admission import RedisAdmission
from tokenomy.gateway.stores.redis_breakers import RedisBreakers
from tokenomy.gateway.stores.redis_limits import RedisRateLimits
from tokenomy.gateway.stores.redis_pipe import RedisPipe
from tokenomy.gateway.stores.redis_reservations import RedisReservations, Unseeded
from tokenomy.gateway.stores.reservations import Charge, Hold, InProcessReservations, Refusal
from tokenomy.gateway.stores.shared_config import SharedStoresConfig
from tokenomy.gateway.stores.tenancy_sql import TenantStore

log = logging.getLogger(__name__)
_STORE_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


def redis_client(shared: SharedStoresConfig) -> Redis:
    """The replica's Redis client: at most ``redis_pool_size`` connections (callers beyond them wait
    for one: local queueing is not an outage); a call on a connection fails after ``timeout_s``."""
    retry = Retry(NoBackoff(), 1, (RedisConnectionError,))  # a pooled connection Redis closed: reconnect once
    pool = BlockingConnectionPool.from_url(shared.redis_url, max_connections=shared.redis_pool_size, timeout=None,
                                           socket_timeout=shared.timeout_s, socket_connect_timeout=shared.timeout_s,
                                           retry=retry)
    return Redis(connection_pool=pool, retry=retry)


class SpendLedger(Protocol):
    """What the fleet guard reads from the ledger (``PgLedger``)."""

    async def cost(self, request_id: str) -> float | None: ...

    async def spend_snapshot(self, since_s: dict[str, float]) -> tuple[dict[str, dict[str, float]], str]: ...

    def pop_xid(self, request_id: str) -> int | None: ...

    @property
    def failed_at_s(self) -> float | None:
        """Monotonic time of the last failed commit; None once a commit succeeded."""
        ...


@dataclass(slots=True)
class _FleetFlight(_Flight):
    local: bool = False  # admitted against this replica's in-process stores (outage)
    unsent_tokens: int = 0
    cut: bool = False
    charges: tuple[Charge, ...] = ()  # the hold's (node, period) charges, as admitted


class FleetGuard(OpsGuard):
    def __init__(self, config: OpsConfig, store: TenantStore, price_of: Callable[[str], PriceLike],
                 redis: Redis, ledger: SpendLedger, shared: SharedStoresConfig, *,
                 clock: Callable[[], float] = time.time, metrics: OpsMetrics | None = None,
                 alerter: Alerter | None = None) -> None:
        super().__init__(config, store, InProcessReservations(), price_of, clock=clock, metrics=metrics,
                         alerter=alerter)
        self.shared = shared
        self.redis = redis
        self.ledger = ledger
        self.owner = secrets.token_hex(8)
        self.r_limits = RedisRateLimits(redis, lease_s=shared.lease_s)
        self.r_holds = RedisReservations(redis, lease_s=shared.lease_s)
        self.shared_budgets = SharedBudgets(self.r_holds, config.alerts.budget_thresholds)
        self.r_breakers = RedisBreakers(redis, config.breaker)
        self.pipe = RedisPipe(shared.redis_url, shared.timeout_s) if shared.redis_url.startswith("redis://") else None
        self.r_admit = RedisAdmission(self.r_limits, self.r_holds, self.r_breakers, self.pipe)
        # trips and crossings land in the lists the in-process guard drains into alerts and metrics
        self.shared_budgets.crossings = self.budgets.crossings
        self.shared_budgets.refusals = self.budgets.refusals
        self.r_breakers.trips = self.breakers.trips
        self._heartbeat: asyncio.Task[None] | None = None
        # settles Redis did not take (down): (request id, cost, path, admitted at, ledger xid)
        self._unsettled: list[tuple[str, float, tuple[Node, ...], float, int | None]] = []
        self._background: set[asyncio.Task[Any]] = set()

    # --- start-up and heartbeat ------------------------------------------------------------------

    async def start(self) -> FleetGuard:
        """Seed Redis's spend from the ledger (unless another replica did) and start the heartbeat."""
        await self.seed()
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat(), name="fleet-guard-heartbeat")
        return self

    async def seed(self) -> bool:
        """Write the ledger's spend for the current periods into Redis, once per Redis data set."""
        return await self.shared_budgets.seed(self.store.tree, self.ledger, self.clock())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.shared.heartbeat_period_s)
            try:
                await self.heartbeat()
            except _STORE_ERRORS as e:
                log.warning("fleet guard heartbeat failed: %s", e)

    async def heartbeat(self) -> dict[str, int]:
        """Retry settles Redis missed; renew this replica's slots and holds; reclaim expired holds
        of any replica."""
        now = self.clock()
        while self._unsettled:
            await self.shared_budgets.settle(*self._unsettled[0])
            self._unsettled.pop(0)
        mine = [(rid, f) for rid, f in self._flights.items() if isinstance(f, _FleetFlight) and not f.local]
        await self.r_limits.renew([(rid, f.grant.node_ids) for rid, f in mine], now)
        await self.r_holds.renew([rid for rid, _ in mine], now)
        return await self.r_holds.reclaim(now, self.ledger.cost)

    async def aclose(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if self.pipe is not None:
            await self.pipe.aclose()
        await super().aclose()

    # --- the Guard contract ------------------------------------------------------------------------

    async def _take(self, request: AdmitRequest) -> tuple[Admission, _Flight]:
        node, path, eff = self._checked(request)
        failed = self.ledger.failed_at_s
        if failed is not None and time.monotonic() - failed < self.shared.on_outage.retry_after_s:
            # the ledger cannot record: serve nothing that could not be metered (after retry-after
            # seconds requests go through again, and the first commit that works ends the outage)
            self.metrics.refusals.labels("ledger_unavailable").inc()
            raise GatewayError(503, "the usage ledger is unavailable; retry shortly", type="server_error",
                               code="ledger_unavailable",
                               headers={"retry-after": str(self.shared.on_outage.retry_after_s)})
        try:
            try:
                return await self._admit_steps(request, node, path, eff)
            except Unseeded:  # Redis came back empty: rebuild spend from the ledger, then once more
                await self.seed()
                return await self._admit_steps(request, node, path, eff)
        except _STORE_ERRORS as e:
            budgeted = any(n.limits.budget_usd is not None for n in path)
            mode = self.shared.on_outage.budgeted if budgeted else self.shared.on_outage.unbudgeted
            self.metrics.refusals.labels("store_unavailable" if mode == "fail_closed" else "store_local").inc()
            log.warning("shared store unavailable (%s): %s request %s", e or type(e).__name__,
                        "refusing" if mode == "fail_closed" else "admitting locally", request.request_id)
            if mode == "fail_closed":
                raise GatewayError(503, "token-operations state store unavailable; retry shortly",
                                   type="server_error", code="store_unavailable",
                                   headers={"retry-after": str(self.shared.on_outage.retry_after_s)}) from None
            admission, flight = self._admit_now(request)
            local = _FleetFlight(flight.started_s, flight.path, flight.session_id, flight.worst_usd, flight.grant,
                                 None, local=True)
            self._flights[request.request_id] = local
            return admission, local

    async def _admit_steps(self, request: AdmitRequest, node: Node, path: tuple[Node, ...],
                           eff: Any) -> tuple[Admission, _Flight]:
        now = self.clock()
        rid = request.request_id
        price, prompt_bound, worst = self._worst_case(request)
        cap = await self._output_cap_shared(node.id, request.session_id, price, prompt_bound, now)
        tokens = request.prompt_tokens_estimate + request.max_tokens
        charges, budgets = self.shared_budgets.charges(path, now)
        got = await self.r_admit.admit(node.id, request.session_id, request.prompt_fingerprint,
                                       request.prompt_tokens_estimate, [(n.id, n.limits) for n in path], tokens,
                                       Hold(rid, charges, worst, now + self.shared.lease_s), budgets, now)
        if isinstance(got, Refusal):
            raise self.shared_budgets.refused(path, got, worst, now)
        grant = got.grant
        self.metrics.reserved_usd.inc(worst)
        tier = await self.shared_budgets.tier_priority(path, now, got.spent_usd)
        priority = eff.priority if tier is None else min(eff.priority, tier)
        admission = Admission(rid, node.id, tuple(n.id for n in path), request.model, priority=priority,
                              reserved_cost_usd=worst, reserved_tokens=tokens, output_token_cap=cap,
                              headers=dict(grant.headers))
        flight = _FleetFlight(now, path, request.session_id, worst, grant, None, charges=charges)
        self._flights[rid] = flight
        return admission, flight

    async def _output_cap_shared(self, key_id: str, session_id: str | None, price: PriceLike, prompt_tokens: int,
                                 now: float) -> int | None:
        if session_id is None or self.config.breaker.session_budget_usd is None:
            return None  # no round trip
        cap = output_cap(await self.r_breakers.session_budget_left_usd(key_id, session_id), price, prompt_tokens)
        if cap is not None and cap < 1:
            await self.r_breakers.budget_crossed(key_id, session_id, now)
        return None if cap is None else max(0, cap)

    def on_tokens(self, admission: Admission, new_output_tokens: int) -> bool:
        flight = self._flights.get(admission.request_id)
        if not isinstance(flight, _FleetFlight) or flight.local:
            return super().on_tokens(admission, new_output_tokens)
        flight.output_tokens += new_output_tokens
        flight.unsent_tokens += new_output_tokens
        ok = not flight.cut
        cfg = self.config.breaker
        if ok and (cfg.key_tokens_per_min is not None or cfg.session_tokens_per_min is not None) \
                and flight.unsent_tokens >= self.shared.token_flush:
            n, flight.unsent_tokens = flight.unsent_tokens, 0
            self._spawn(self._add_tokens(admission.key_id, flight, n))
        cap = admission.output_token_cap
        if cap is not None and flight.output_tokens > cap:
            if flight.session_id is not None:
                self._spawn(self.r_breakers.budget_crossed(admission.key_id, flight.session_id, self.clock()))
            self.metrics.stream_cuts.labels("breaker_session_budget").inc()
            ok = False
        return ok

    async def _add_tokens(self, key_id: str, flight: _FleetFlight, n: int) -> None:
        if not await self.r_breakers.add_tokens(key_id, flight.session_id, n, self.clock()):
            flight.cut = True
            self.metrics.stream_cuts.labels("breaker_velocity").inc()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        async def guarded() -> None:
            try:
                await coro
            except _STORE_ERRORS as e:
                log.warning("fleet guard: background store call failed: %s", e)

        task = asyncio.get_running_loop().create_task(guarded())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settle(self, admission: Admission, usage: SettledUsage) -> None:
        flight = self._flights.get(admission.request_id)
        if not isinstance(flight, _FleetFlight) or flight.local:
            await super().settle(admission, usage)
            return
        self._flights.pop(admission.request_id, None)
        now = self.clock()
        rid = admission.request_id
        xid = self.ledger.pop_xid(rid)
        try:  # one round trip: the hold settled, the TPM estimate corrected, the slots and session cost
            _, hold = await self.r_admit.finish(
                rid, flight.grant, admission.key_id, flight.session_id, flight.worst_usd, now,
                actual_usd=usage.cost_usd, actual_tokens=usage.prompt_tokens + usage.output_tokens, ledger_xid=xid,
                charges=flight.charges)
        except _STORE_ERRORS as e:  # the hold: retried by the heartbeat until Redis answers (idempotent);
            # the slots end with their lease
            log.warning("settling %s in the shared store failed (%s); retrying from the heartbeat", rid, e)
            self._unsettled.append((rid, usage.cost_usd, flight.path, flight.started_s, xid))
        else:
            try:
                await self.shared_budgets.settled(hold, usage.cost_usd, flight.path)
            except _STORE_ERRORS as e:  # settled already: only a threshold alert may be missed
                log.warning("reading budgets after settling %s failed (%s)", rid, e)
        self._leave(flight)
        self._spent(admission.key_id, usage.cost_usd, now)

    async def release(self, admission: Admission, reason: str) -> None:
        flight = self._flights.get(admission.request_id)
        if not isinstance(flight, _FleetFlight) or flight.local:
            await super().release(admission, reason)
            return
        self._flights.pop(admission.request_id, None)
        try:
            await self._release_shared(admission.request_id, flight, undo_turn=False)
        except _STORE_ERRORS as e:
            log.warning("releasing %s in the shared store failed (%s); its lease will release it",
                        admission.request_id, e)
        self._leave(flight)

    async def _release_shared(self, rid: str, flight: _Flight, undo_turn: bool) -> None:
        await self.r_admit.finish(rid, flight.grant, flight.path[-1].id, flight.session_id, flight.worst_usd,
                                  self.clock(), actual_usd=None, actual_tokens=0, undo_turn=undo_turn)

    async def _give_back(self, rid: str, flight: _Flight) -> None:
        if isinstance(flight, _FleetFlight) and flight.local:
            self._undo(rid, flight)
            return
        self._flights.pop(rid, None)
        try:
            await self._release_shared(rid, flight, undo_turn=True)
        except _STORE_ERRORS as e:
            log.warning("undoing %s in the shared store failed (%s); its lease will release it", rid, e)

    # --- reads of the shared state (admin API, console, /metrics, priority admission) -------------

    async def budget_usage(self, charges: Sequence[Charge]) -> dict[Charge, tuple[float, float]]:
        return dict(zip(charges, await self.r_holds.usages(charges), strict=True))

    async def admission_signals(self, key_id: str, path: tuple[Node, ...]) -> AdmissionSignals:
        now = self.clock()
        usage = await self.r_holds.usages(self.shared_budgets.charges(path, now)[0])
        tier = await self.shared_budgets.tier_priority(path, now, [spent for spent, _ in usage])
        prio = self.store.tree.effective(key_id).priority
        return AdmissionSignals(prio if tier is None else min(prio, tier), remaining_fraction(path, usage),
                                await self.r_breakers.key_tokens_per_s(key_id, now))
