"""Token operations behind the ``Guard`` contract: one policy over one state interface.

``admit`` runs, in order: the key (401) → the request id not in flight here (409) → the model
allowed on the key's path (403) → a fleet's ledger able to record (503 ``ledger_unavailable``) →
the session's output cap (what its budget still pays for) → one atomic step of the guard state
(``stores.guard_state``): a request id holding anywhere (409), breakers (429 ``breaker_*``),
RPM/TPM/concurrency on every node (429 ``rate_limit_*``), the worst-case cost held on every node
(429 ``budget_exceeded``), all checked before any is charged → a slot in the model's pool (503
``overloaded``; the state's charges are then returned).

The state is ``LocalState`` (one process, the embedded default) or ``RedisState`` (a fleet of
replicas); everything else — what a refusal says, output caps, budget tiers, alerts, what to
serve while a shared store is down (``ops.outage``) — is this class's, the same over both.
``settle``/``release`` are idempotent per request id: the in-flight entry is popped once, and
the state's finish changes nothing the second time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.access import KeyAccess
from tokenomy.gateway.ops.admission import AdmissionSignals, PriorityAdmission
from tokenomy.gateway.ops.alerts import Alerter
from tokenomy.gateway.ops.breaker import Breakers
from tokenomy.gateway.ops.budget import (
    BudgetPolicy,
    PriceLike,
    output_cap,
    remaining_fraction,
    worst_case_cost_usd,
)
from tokenomy.gateway.ops.closed_loop import ClosedLoopPools
from tokenomy.gateway.ops.config import OpsConfig
from tokenomy.gateway.ops.guard import Admission, AdmitRequest, SettledUsage
from tokenomy.gateway.ops.metrics import OpsMetrics
from tokenomy.gateway.ops.outage import OutagePolicy
from tokenomy.gateway.ops.pools import AdmissionPools, PoolTicket
from tokenomy.gateway.ops.reporting import OpsReports
from tokenomy.gateway.ops.tenancy import Node
from tokenomy.gateway.stores.guard_state import AdmitStep, FinishStep, GuardState, StoreUnavailable
from tokenomy.gateway.stores.local_state import LocalState
from tokenomy.gateway.stores.reservations import Charge, Hold, Refusal
from tokenomy.gateway.stores.tenancy_sql import TenantStore

__all__ = ["OpsGuard"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Flight:
    started_s: float
    path: tuple[Node, ...]
    node_ids: tuple[str, ...]
    session_id: str | None
    worst_usd: float
    tokens: int  # the TPM estimate charged
    charges: tuple[Charge, ...]
    state: GuardState  # where it was admitted (a fleet's own in-process state during an outage)
    ticket: PoolTicket | None = None
    output_tokens: int = 0
    cut: bool = False


class OpsGuard:
    """The ``Guard``. One instance per gateway process, used from one event loop."""

    def __init__(self, config: OpsConfig, store: TenantStore, state: GuardState,
                 price_of: Callable[[str], PriceLike], *, clock: Callable[[], float] = time.time,
                 metrics: OpsMetrics | None = None, alerter: Alerter | None = None,
                 outage: OutagePolicy | None = None, heartbeat_s: float | None = None) -> None:
        self.config = config
        self.store = store
        self.state = state
        self.price_of = price_of
        self.clock = clock
        self.access = KeyAccess(store, config.admin_key)
        self.outage = outage
        self.heartbeat_s = heartbeat_s
        self.metrics = metrics or OpsMetrics()
        self.alerter = alerter or Alerter(config.alerts)
        self.budgets = BudgetPolicy(config.alerts.budget_thresholds)
        self.reports = OpsReports(config.alerts, self.metrics, self.alerter, self.budgets)
        self.pools = AdmissionPools(config.admission, self.metrics)
        # the console's view of sessions: in-process breakers (a fleet replica's: what it served alone)
        local = state if isinstance(state, LocalState) else outage.local if outage is not None else None
        self.breakers = local.breakers if local is not None else Breakers(config.breaker)
        self._flights: dict[str, _Flight] = {}
        self._next_sweep_s = -math.inf
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def admission(self) -> PriorityAdmission:
        return self.pools.admission

    @property
    def closed(self) -> ClosedLoopPools | None:
        return self.pools.closed

    # --- the Guard contract --------------------------------------------------------------------

    async def authenticate(self, api_key: str | None) -> None:
        self.access.key_node(api_key)

    async def admit(self, request: AdmitRequest) -> Admission:
        if self.clock() >= self._next_sweep_s:
            await self._sweep()
        try:
            admission, flight = await self._take(request)
        except GatewayError as err:
            self.reports.refused(err)
            raise
        finally:
            self._drain()
        if not self.pools.on:
            return admission  # no overload control configured: nothing to queue for
        try:
            sig = await self._signals(flight.state, admission.key_id, flight.path, flight.charges, flight.started_s)
            flight.ticket = await self.pools.enter(request, admission, sig)
        except BaseException as err:
            self._flights.pop(admission.request_id, None)
            await self._finish(admission.request_id, admission.key_id, flight, None, 0, undo_turn=True)
            if isinstance(err, GatewayError):
                self.reports.refused(err)
            raise
        return admission

    def on_tokens(self, admission: Admission, new_output_tokens: int) -> bool:
        """Count a chunk of ``new_output_tokens``; False when it would cross a hard cap (the session
        budget's ``output_token_cap`` or a velocity cap): the request path drops that chunk and
        cuts the stream, so at most ``output_token_cap`` tokens are delivered."""
        flight = self._flights.get(admission.request_id)
        if flight is None:
            return True
        flight.output_tokens += new_output_tokens
        now = self.clock()
        ok = flight.state.stream_tokens(admission.request_id, admission.key_id, flight.session_id,
                                        new_output_tokens, now)
        if not ok and not flight.cut:
            flight.cut = True
            self.metrics.stream_cuts.labels("breaker_velocity").inc()
        cap = admission.output_token_cap
        if cap is not None and flight.output_tokens > cap:
            if flight.session_id is not None:
                flight.state.trip_session_budget(admission.key_id, flight.session_id, now)
            self.metrics.stream_cuts.labels("breaker_session_budget").inc()
            ok = False
        self._drain()
        return ok

    async def settle(self, admission: Admission, usage: SettledUsage) -> None:
        flight = self._flights.pop(admission.request_id, None)
        if flight is None:
            return
        await self._finish(admission.request_id, admission.key_id, flight, usage.cost_usd,
                           usage.prompt_tokens + usage.output_tokens)
        self.pools.leave(flight.ticket)
        self.reports.spent(admission.key_id, usage.cost_usd, self.clock())
        self._drain()

    async def release(self, admission: Admission, reason: str) -> None:
        flight = self._flights.pop(admission.request_id, None)
        if flight is None:
            return
        await self._finish(admission.request_id, admission.key_id, flight, None, 0)
        self.pools.leave(flight.ticket)

    # --- admission -----------------------------------------------------------------------------

    async def _take(self, request: AdmitRequest) -> tuple[Admission, _Flight]:
        """Check and charge breakers, limits and budget in one step of the state."""
        node = self.access.key_node(request.api_key)
        rid = request.request_id
        if rid in self._flights:
            raise GatewayError(409, f"request id {rid!r} is already in flight", code="duplicate_request_id")
        eff = self.store.tree.effective(node.id)
        if eff.allowed_models is not None and request.model not in eff.allowed_models:
            raise GatewayError(403, f"model {request.model!r} is not allowed for this key",
                               type="permission_error", code="model_not_allowed", param="model")
        path = self.store.tree.path_nodes(node.id)
        if self.outage is not None:
            self.outage.check_ledger()
        now = self.clock()
        price = self.price_of(request.model)
        prompt_bound = math.ceil(request.prompt_tokens_estimate * self.config.prompt_reserve_factor)
        worst = worst_case_cost_usd(price, prompt_bound, request.max_tokens)
        charges, budgets = self.budgets.plan(path, now)
        tokens = request.prompt_tokens_estimate + request.max_tokens
        step = AdmitStep(rid, node.id, request.session_id, request.prompt_fingerprint, request.prompt_tokens_estimate,
                         tuple((n.id, n.limits) for n in path), tokens, Hold(rid, charges, worst, now + self.config.hold_ttl_s),
                         budgets, now)
        state = self.state
        try:
            cap = await self._session_cap(state, step, price, prompt_bound)
            got = await state.admit(step)
        except StoreUnavailable as err:
            if self.outage is None:
                raise GatewayError(503, "token-operations state store unavailable", type="server_error",
                                   code="store_unavailable") from err
            state = self.outage.fallback(path, err, rid, self.metrics)
            cap = await self._session_cap(state, step, price, prompt_bound)
            got = await state.admit(step)
        if isinstance(got, Refusal):
            raise self.budgets.refused(path, got, worst, now)
        self.metrics.reserved_usd.inc(worst)
        tier = self.budgets.tier_priority(path, got.spent_usd)
        ids = tuple(n for n, _ in step.path)
        admission = Admission(rid, node.id, ids, request.model,
                              priority=eff.priority if tier is None else min(eff.priority, tier),
                              reserved_cost_usd=worst, reserved_tokens=tokens, output_token_cap=cap,
                              headers=dict(got.headers))
        flight = self._flights[rid] = _Flight(now, path, ids, request.session_id, worst, tokens, charges, state)
        return admission, flight

    async def _session_cap(self, state: GuardState, step: AdmitStep, price: PriceLike, prompt_tokens: int) -> int | None:
        """The output tokens the session's budget still pays for after the prompt (None: no session
        budget). What the request needs of it (the prompt and one output token) goes into ``step``:
        a session that cannot pay for that trips its breaker inside the atomic step."""
        budget = self.config.breaker.session_budget_usd
        if step.session_id is None or budget is None:
            return None
        left = max(0.0, budget - await state.session_spend_usd(step.key_id, step.session_id))
        cap = output_cap(left, price, prompt_tokens)
        if cap is None:
            return None
        step.session_need_usd = (prompt_tokens * price.input_per_mtok + price.output_per_mtok) / 1e6
        return max(0, cap)

    async def _signals(self, state: GuardState, key_id: str, path: tuple[Node, ...], charges: tuple[Charge, ...],
                       now: float) -> AdmissionSignals:
        """Priority (lowered by budget tiers), budget left and consumption rate of a key."""
        prio = self.store.tree.effective(key_id).priority
        try:
            usage = await state.usage(charges)
            rate = await state.key_tokens_per_s(key_id, now)
        except StoreUnavailable:
            return AdmissionSignals(prio, 1.0, 0.0)
        tier = self.budgets.tier_priority(path, [spent for spent, _ in usage])
        return AdmissionSignals(prio if tier is None else min(prio, tier), remaining_fraction(path, usage), rate)

    async def admission_signals(self, key_id: str, path: tuple[Node, ...]) -> AdmissionSignals:
        """What priority admission weighs for a key (routing policies may read the same)."""
        now = self.clock()
        return await self._signals(self.state, key_id, path, self.budgets.plan(path, now)[0], now)

    # --- the end of a request ------------------------------------------------------------------

    async def _finish(self, rid: str, key_id: str, flight: _Flight, actual_usd: float | None, actual_tokens: int,
                      undo_turn: bool = False) -> None:
        step = FinishStep(rid, key_id, flight.session_id, flight.node_ids, flight.charges,
                          flight.tokens, flight.worst_usd, actual_usd, actual_tokens, self.clock(), undo_turn)
        try:
            done = await flight.state.finish(step)
        except StoreUnavailable as e:
            log.warning("finishing %s in the guard state failed (%s); %s", rid, e,
                        "its lease will release it" if actual_usd is None else "the heartbeat retries the settle")
            return
        if done.hold is not None and actual_usd is not None:
            self.budgets.settled(done.hold, done.spent_usd, actual_usd, flight.path)

    async def _sweep(self) -> None:
        """Release requests the request path never settled nor released within ``hold_ttl_s``
        (a bug there must not hold budget, concurrency and queue slots forever). At most once a
        minute; a normal request never gets near the TTL."""
        now = self.clock()
        self._next_sweep_s = now + 60.0
        stale = [(rid, f) for rid, f in self._flights.items() if f.started_s + self.config.hold_ttl_s <= now]
        for rid, flight in stale:
            log.error("request %s was neither settled nor released in %.0f s: releasing its holds",
                      rid, self.config.hold_ttl_s)
            self._flights.pop(rid, None)
            await self._finish(rid, flight.path[-1].id, flight, None, 0)
            self.pools.leave(flight.ticket)

    def _drain(self) -> None:
        trips = self.state.drain_trips()
        if self.outage is not None:
            trips = trips + self.outage.local.drain_trips()
        self.reports.drain(trips, self.clock())

    # --- lifecycle: a fleet's seeding and heartbeat ----------------------------------------------

    async def start(self) -> OpsGuard:
        """Ready the state (a fleet's: spend from the ledger) and start the heartbeat, if any."""
        await self.state.start(self.clock())
        if self.heartbeat_s is not None:
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat(), name="guard-heartbeat")
        return self

    async def _beat(self) -> None:
        assert self.heartbeat_s is not None
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.heartbeat()
            except StoreUnavailable as e:
                log.warning("guard heartbeat failed: %s", e)

    async def heartbeat(self) -> dict[str, int]:
        """Renew this process's leases, reclaim dead owners' holds, retry failed settles; the
        holds reclaimed (``settled``/``released``)."""
        upkeep = await self.state.heartbeat(self.clock())
        nodes = {n.id: n for n in self.store.tree.nodes()}
        for done, cost in upkeep.settled:  # settles retried: their threshold alerts, late
            if done.hold is not None:
                path = [nodes[n] for n, _ in done.hold.charges if n in nodes]
                self.budgets.settled(done.hold, done.spent_usd, cost, path)
        self._drain()
        return dict(upkeep.reclaimed)

    async def aclose(self) -> None:
        """Stop the heartbeat, close the state, post the alerts still queued (gateway shutdown)."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        await self.state.aclose()
        await self.alerter.close()

    # --- who may read what ---------------------------------------------------------------------

    async def usage_scope(self, api_key: str | None) -> tuple[str, ...]:
        """The tenant path whose subtree ``api_key`` may read (``()``: the admin key, everything)."""
        return self.access.usage_scope(api_key)

    def is_admin(self, api_key: str | None) -> bool:
        return self.access.is_admin(api_key)

    async def budget_usage(self, charges: Sequence[Charge]) -> dict[Charge, tuple[float, float]]:
        """(spent, held) of each (node, period) in the state admission enforces against."""
        try:
            return dict(zip(charges, await self.state.usage(charges), strict=True))
        except StoreUnavailable as e:
            raise GatewayError(503, f"token-operations state store unavailable ({e})", type="server_error",
                               code="store_unavailable") from None

    def visible_key_ids(self, admission_or_key: Admission | str) -> set[str]:
        """Key ids whose usage this key may read: its own subtree (a key: itself)."""
        return self.access.visible_key_ids(
            admission_or_key if isinstance(admission_or_key, str) else admission_or_key.key_id)
