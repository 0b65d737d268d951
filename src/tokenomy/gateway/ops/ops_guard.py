"""Token operations behind the ``Guard`` contract: keys, limits, budgets, breakers, admission, alerts.

``admit`` runs, in order: authenticate the key (401) → model allowed on the path (403) →
breaker check (429 ``breaker_*``) → RPM/TPM/concurrency on every node (429 ``rate_limit_*``) →
reserve the worst-case cost on every node (429 ``budget_exceeded``) → count the turn in the
breaker → wait for a slot in the model's pool (503 ``overloaded``). Each step that took
something is undone if a later one refuses, so a refused request leaves no trace but its counter.
Everything up to the queue is synchronous, so concurrent asyncio tasks cannot interleave a
check with its charge.

``settle``/``release`` are idempotent per request id (the in-flight entry is popped once).
"""

from __future__ import annotations

import hmac
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.admission import AdmissionSignals, PriorityAdmission, Ticket
from tokenomy.gateway.ops.alerts import Alert, Alerter, SpendRateMonitor
from tokenomy.gateway.ops.breaker import Breakers
from tokenomy.gateway.ops.budget import Budgets, PriceLike, output_cap, worst_case_cost_usd
from tokenomy.gateway.ops.closed_loop import ClosedLoopTicket, build_pools
from tokenomy.gateway.ops.config import GatewayConfigLike, OpsConfig, ops_config, secret_of
from tokenomy.gateway.ops.guard import Admission, AdmitRequest, SettledUsage
from tokenomy.gateway.ops.metrics import OpsMetrics
from tokenomy.gateway.ops.tenancy import Node
from tokenomy.gateway.ops.tenancy_seed import apply_seeds
from tokenomy.gateway.stores.budget_seed import seed_from_ledger
from tokenomy.gateway.stores.limits import InProcessRateLimits, RateGrant, RateLimits
from tokenomy.gateway.stores.reservations import Charge, InProcessReservations, Reservations
from tokenomy.gateway.stores.reservations_sql import SqlReservations
from tokenomy.gateway.stores.tenancy_sql import TenantStore, sqlite_engine

__all__ = ["OpsConfig", "OpsGuard", "build_guard", "ops_config"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Flight:
    started_s: float
    path: tuple[Node, ...]
    session_id: str | None
    worst_usd: float
    grant: RateGrant
    ticket: Ticket | ClosedLoopTicket | None
    output_tokens: int = 0


class OpsGuard:
    """The real ``Guard``. One instance per gateway process, used from one event loop."""

    def __init__(self, config: OpsConfig, store: TenantStore, reservations: Reservations,
                 price_of: Callable[[str], PriceLike], *, clock: Callable[[], float] = time.time,
                 metrics: OpsMetrics | None = None, alerter: Alerter | None = None) -> None:
        self.config = config
        self.store = store
        self.price_of = price_of
        self.clock = clock
        self.limits: RateLimits = InProcessRateLimits()
        self.budgets = Budgets(reservations, config.alerts.budget_thresholds, config.hold_ttl_s)
        self.breakers = Breakers(config.breaker)
        self.admission = PriorityAdmission(config.admission)
        adm = config.admission
        self.closed = None if adm.closed_loop is None else build_pools(
            adm.closed_loop, max_in_flight=adm.max_in_flight, pools=adm.pools, retry_after_s=adm.retry_after_s)
        self.metrics = metrics or OpsMetrics()
        self.alerter = alerter or Alerter(config.alerts)
        a = config.alerts
        self.spend_rate = SpendRateMonitor(a.spend_rate_usd_per_hour, a.spend_rate_window_s, a.spend_rate_factor,
                                           a.spend_baseline_s, a.spend_rate_min_usd_per_hour)
        self._flights: dict[str, _Flight] = {}
        self._pool_gauges: dict[str, tuple[Any, Any]] = {}
        self._next_sweep_s = -math.inf

    # --- the Guard contract --------------------------------------------------------------------

    async def admit(self, request: AdmitRequest) -> Admission:
        self._sweep()
        try:
            admission, flight = await self._take(request)
        except GatewayError as err:
            self._refused(err)
            raise
        finally:
            self._drain_events()
        if self.admission.config.max_in_flight is None:
            return admission  # no overload control configured: nothing to queue for
        try:
            flight.ticket = await self._enter(request, admission, flight)
        except BaseException as err:
            await self._give_back(admission.request_id, flight)
            if isinstance(err, GatewayError):
                self._refused(err)
            raise
        finally:
            self._observe_pool(request.model)
        return admission

    async def _take(self, request: AdmitRequest) -> tuple[Admission, _Flight]:
        """Check and charge limits, budgets and breakers (a fleet's guard: in Redis); ``_give_back`` undoes it."""
        return self._admit_now(request)

    async def _give_back(self, request_id: str, flight: _Flight) -> None:
        self._undo(request_id, flight)

    async def _enter(self, request: AdmitRequest, admission: Admission, flight: _Flight) -> Ticket | ClosedLoopTicket:
        """A slot in the model's pool: the priority queue, or the closed loop (its tier, its cap)."""
        sig = await self.admission_signals(admission.key_id, flight.path)
        if self.closed is None:
            return await self.admission.enter(request.model, sig)
        tier = self.closed.tier_of(sig.priority)
        try:
            ticket = await self.closed.enter(
                request.model, request_id=request.request_id, tenant=admission.tenant_path[0], priority=sig.priority,
                tokens_per_s=sig.consumption_tokens_per_s, budget_left_fraction=sig.remaining_budget_fraction,
                prompt_tokens=request.prompt_tokens_estimate, max_tokens=request.max_tokens, retries=request.retries)
        except GatewayError:
            self.metrics.admission_refused.labels(tier).inc()
            raise
        if ticket.waited_s > 0:
            self.metrics.admission_deferred.labels(tier).inc()
        admission.tier = ticket.tier
        if ticket.max_tokens < request.max_tokens:  # degraded under load
            cap = admission.output_token_cap
            admission.output_token_cap = ticket.max_tokens if cap is None else min(cap, ticket.max_tokens)
        return ticket

    async def authenticate(self, api_key: str | None) -> None:
        self._key_node(api_key)

    def on_tokens(self, admission: Admission, new_output_tokens: int) -> bool:
        """Count a chunk of ``new_output_tokens``; False when it would cross a hard cap (the session
        budget's ``output_token_cap`` or a velocity cap): the request path drops that chunk and
        cuts the stream, so at most ``output_token_cap`` tokens are delivered."""
        flight = self._flights.get(admission.request_id)
        if flight is None:
            return True
        flight.output_tokens += new_output_tokens
        now = self.clock()
        ok = self.breakers.on_tokens(admission.key_id, flight.session_id, new_output_tokens, now)
        if not ok:
            self.metrics.stream_cuts.labels("breaker_velocity").inc()
        cap = admission.output_token_cap
        if cap is not None and flight.output_tokens > cap:
            if flight.session_id is not None:
                self.breakers.budget_crossed(admission.key_id, flight.session_id, now)
            self.metrics.stream_cuts.labels("breaker_session_budget").inc()
            ok = False
        self._drain_events()
        return ok

    async def settle(self, admission: Admission, usage: SettledUsage) -> None:
        flight = self._flights.pop(admission.request_id, None)
        if flight is None:
            return
        now = self.clock()
        self.budgets.settle(admission.request_id, usage.cost_usd, flight.path)
        self.limits.correct_tokens(flight.grant, usage.prompt_tokens + usage.output_tokens, now)
        self._finish(admission.key_id, flight, usage.cost_usd)
        self._spent(admission.key_id, usage.cost_usd, now)

    def _spent(self, key_id: str, cost_usd: float, now: float) -> None:
        """After a settle: the key's spend rate (an alert when anomalous), then the events' alerts."""
        anomaly = self.spend_rate.add(key_id, cost_usd, now)
        if anomaly is not None:
            rate, reason = anomaly
            self._alert("spend_rate", key_id, f"spending ${rate:.2f}/h, {reason}", now,
                        {"usd_per_hour": rate, "reason": reason})
        self._drain_events()

    async def release(self, admission: Admission, reason: str) -> None:
        flight = self._flights.pop(admission.request_id, None)
        if flight is None:
            return
        self.budgets.release(admission.request_id)
        self.limits.correct_tokens(flight.grant, 0, self.clock())
        self._finish(admission.key_id, flight, 0.0)

    async def aclose(self) -> None:
        """Post the alerts still queued and stop the webhook task (gateway shutdown)."""
        await self.alerter.close()

    async def usage_scope(self, api_key: str | None) -> tuple[str, ...]:
        """The tenant path whose subtree ``api_key`` may read: a key reads only its own usage;
        the admin key reads everything (``()``). 401 for a missing, unknown or revoked key."""
        if not api_key:
            raise GatewayError(401, "missing API key", type="authentication_error", code="missing_api_key")
        if self.is_admin(api_key):
            return ()
        node = self.store.authenticate(api_key)
        if node is None:
            raise GatewayError(401, "invalid or revoked API key", type="authentication_error",
                               code="invalid_api_key")
        return self.store.tree.path(node.id)

    def is_admin(self, api_key: str | None) -> bool:
        admin = self.config.admin_key
        if not admin or not api_key:
            return False
        return hmac.compare_digest(api_key.encode(), admin.encode())

    # --- helpers -------------------------------------------------------------------------------

    def _checked(self, request: AdmitRequest) -> tuple[Node, tuple[Node, ...], Any]:
        """The key's node, path and effective limits: 401 unknown key, 409 id in flight, 403 model."""
        node = self._key_node(request.api_key)
        if request.request_id in self._flights:
            raise GatewayError(409, f"request id {request.request_id!r} is already in flight",
                               code="duplicate_request_id")
        eff = self.store.tree.effective(node.id)
        if eff.allowed_models is not None and request.model not in eff.allowed_models:
            raise GatewayError(403, f"model {request.model!r} is not allowed for this key",
                               type="permission_error", code="model_not_allowed", param="model")
        return node, self.store.tree.path_nodes(node.id), eff

    def _worst_case(self, request: AdmitRequest) -> tuple[PriceLike, int, float]:
        """The model's price, the prompt bound held for and the request's worst-case cost."""
        price = self.price_of(request.model)
        prompt_bound = math.ceil(request.prompt_tokens_estimate * self.config.prompt_reserve_factor)
        return price, prompt_bound, worst_case_cost_usd(price, prompt_bound, request.max_tokens)

    def _admit_now(self, request: AdmitRequest) -> tuple[Admission, _Flight]:
        """Every synchronous check and charge; undoes its own charges when a later step refuses."""
        node, path, eff = self._checked(request)
        now = self.clock()
        price, prompt_bound, worst = self._worst_case(request)
        cap = self._output_cap(node.id, request.session_id, price, prompt_bound, now)
        self.breakers.admit_check(node.id, request.session_id, request.prompt_fingerprint, now)
        grant = self.limits.acquire([(n.id, n.limits) for n in path],
                                    request.prompt_tokens_estimate + request.max_tokens, now)
        try:
            self.budgets.reserve(request.request_id, path, worst, now)
        except GatewayError:
            self.limits.correct_tokens(grant, 0, now)
            self.limits.finish(grant)
            raise
        self.metrics.reserved_usd.inc(worst)
        self.breakers.admit_count(node.id, request.session_id, request.prompt_fingerprint,
                                  request.prompt_tokens_estimate, worst, now)
        tier = self.budgets.tier_priority(path, now)
        priority = eff.priority if tier is None else min(eff.priority, tier)
        admission = Admission(request.request_id, node.id, tuple(n.id for n in path), request.model,
                              priority=priority, reserved_cost_usd=worst,
                              reserved_tokens=request.prompt_tokens_estimate + request.max_tokens,
                              output_token_cap=cap, headers=dict(grant.headers))
        flight = _Flight(now, path, request.session_id, worst, grant, None)
        self._flights[request.request_id] = flight
        return admission, flight

    def _key_node(self, api_key: str | None) -> Node:
        """The live key node of ``api_key``; 401 for a missing, unknown or revoked key."""
        if not api_key:
            raise GatewayError(401, "missing API key: send 'Authorization: Bearer tk-...'",
                               type="authentication_error", code="missing_api_key")
        node = self.store.authenticate(api_key)
        if node is None:
            raise GatewayError(401, "invalid or revoked API key", type="authentication_error",
                               code="invalid_api_key")
        return node

    def _output_cap(self, key_id: str, session_id: str | None, price: PriceLike, prompt_tokens: int,
                    now: float) -> int | None:
        """Output tokens the session's budget pays for after this prompt (None: none); under 1 trips it."""
        left = None if session_id is None else self.breakers.session_budget_left_usd(key_id, session_id)
        cap = output_cap(left, price, prompt_tokens)
        if cap is not None and cap < 1 and session_id is not None:
            self.breakers.budget_crossed(key_id, session_id, now)  # admit_check refuses next
        return None if cap is None else max(0, cap)

    def _sweep(self) -> None:
        """Release requests the request path never settled nor released within ``hold_ttl_s``
        (a bug there must not hold budget, concurrency and queue slots forever). At most once a
        minute; a normal request never gets near the TTL."""
        now = self.clock()
        if now < self._next_sweep_s:
            return
        self._next_sweep_s = now + 60.0
        stale = [(rid, f) for rid, f in self._flights.items() if f.started_s + self.config.hold_ttl_s <= now]
        for rid, flight in stale:
            log.error("request %s was neither settled nor released in %.0f s: releasing its holds",
                      rid, self.config.hold_ttl_s)
            self._flights.pop(rid, None)
            self.budgets.release(rid)
            self.limits.correct_tokens(flight.grant, 0, now)
            self._finish(flight.path[-1].id, flight, 0.0)

    def _undo(self, request_id: str, flight: _Flight) -> None:
        self._flights.pop(request_id, None)
        self.budgets.release(request_id)
        self.limits.correct_tokens(flight.grant, 0, self.clock())
        self.limits.finish(flight.grant)
        self.breakers.finish(flight.path[-1].id, flight.session_id, flight.worst_usd, 0.0, undo_turn=True)

    def _finish(self, key_id: str, flight: _Flight, actual_usd: float) -> None:
        self.limits.finish(flight.grant)
        self.breakers.finish(key_id, flight.session_id, flight.worst_usd, actual_usd)
        self._leave(flight)

    def _leave(self, flight: _Flight) -> None:  # the request's admission slot, back to its queue or pool
        if isinstance(flight.ticket, ClosedLoopTicket) and self.closed is not None:
            self.closed.leave(flight.ticket)
        elif isinstance(flight.ticket, Ticket):
            self.admission.leave(flight.ticket)
        if flight.ticket is not None:
            self._observe_pool(flight.ticket.pool, is_pool=True)

    async def admission_signals(self, key_id: str, path: tuple[Node, ...]) -> AdmissionSignals:
        """Priority, remaining budget share and consumption rate of a key (a fleet's: shared)."""
        now = self.clock()
        tier = self.budgets.tier_priority(path, now)
        prio = self.store.tree.effective(key_id).priority
        return AdmissionSignals(prio if tier is None else min(prio, tier), self.budgets.remaining_fraction(path, now),
                                self.breakers.key_tokens_per_s(key_id, now))

    async def budget_usage(self, charges: Sequence[Charge]) -> dict[Charge, tuple[float, float]]:
        """(spent, held) of each (node, period) in the store admission enforces against."""
        return {c: self.budgets.store.usage(c) for c in charges}

    def visible_key_ids(self, admission_or_key: Admission | str) -> set[str]:
        """Key ids whose usage this key may read: its own subtree (a key: itself)."""
        key_id = admission_or_key if isinstance(admission_or_key, str) else admission_or_key.key_id
        tree = self.store.tree
        return {i for i in tree.subtree(key_id) if tree.get(i).kind.value == "key"}

    def _observe_pool(self, model_or_pool: str, is_pool: bool = False) -> None:
        pools = self.closed or self.admission
        pool = model_or_pool if is_pool else pools.pool_of(model_or_pool)
        sig = pools.signals(pool)
        gauges = self._pool_gauges.get(pool)
        if gauges is None:
            gauges = self._pool_gauges[pool] = (self.metrics.queue_depth.labels(pool),
                                                self.metrics.pool_in_flight.labels(pool))
        gauges[0].set(sig.queue_depth)
        gauges[1].set(sig.in_flight)

    def _refused(self, err: GatewayError) -> None:
        self.metrics.refusals.labels(err.code or str(err.status)).inc()

    def _alert(self, kind: str, subject: str, message: str, now_s: float, data: dict[str, Any]) -> None:
        self.metrics.alerts.labels(kind).inc()
        self.alerter.emit(Alert(kind, subject, message, now_s, data))

    def _drain_events(self) -> None:
        now = self.clock()
        for trip in self.breakers.trips:
            self.metrics.breaker_trips.labels(trip.scope, trip.code).inc()
            self._alert("breaker_trip", f"{trip.scope} {trip.subject}", f"{trip.code}: {trip.reason}", now,
                        {"code": trip.code, "until_s": trip.until_s})
        self.breakers.trips.clear()
        groups: tuple[tuple[str, list[Any]], ...] = (  # Crossing, RefusalEvent: .node_id, .alert()
            ("budget_threshold", self.budgets.crossings), ("budget_refusal", self.budgets.refusals))
        for kind, events in groups:
            for event in events:
                message, data = event.alert()
                self._alert(kind, event.node_id, message, now, data)
            events.clear()


def build_guard(config: GatewayConfigLike, *, engine: Engine | None = None, db_url: str | None = None,
                registry: Any = None, clock: Callable[[], float] = time.time,
                ledger_cost_usd: Callable[[str], float | None] | None = None,
                alerter: Alerter | None = None) -> OpsGuard:
    """The gateway's Guard from its config: ``config.ops`` (an ``OpsConfig`` mapping) and
    ``config.price(model)``.

    The database is ``engine``, else ``ops.db_url``, else ``db_url`` (the ledger's). Holds left by
    a previous process are reconciled at once: settled at the cost ``ledger_cost_usd(request_id)``
    reports, released when it reports None (or when no lookup is given).
    """
    ops = ops_config(config)
    if engine is None:
        url = ops.db_url or db_url
        if url is None:
            raise ValueError("ops.db_url: no database for tenants (and no ledger URL to share)")
        engine = sqlite_engine(url)
    store = TenantStore(engine, server_secret=secret_of(ops, engine), refresh_interval_s=ops.tenant_refresh_s,
                        clock=clock)
    apply_seeds(store, ops.tenants)
    reservations: Reservations
    if ops.reservations == "sql":
        sql = SqlReservations(engine)
        sql.reconcile(clock(), ledger_cost_usd or (lambda _rid: None))
        reservations = sql
    else:
        memory = InProcessReservations()
        ledger_url = db_url or ops.db_url
        seed_from_ledger(memory, store.tree, sqlite_engine(ledger_url) if ledger_url else engine, clock())
        reservations = memory
    return OpsGuard(ops, store, reservations, config.price, clock=clock,
                    metrics=OpsMetrics(registry) if registry is not None else None, alerter=alerter)
