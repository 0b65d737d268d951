"""The gateway's admission pools under a closed-loop policy (``ops.admission.policy``).

The same decision objects as the simulator's admission gate (``sim/admission_gate.py``), built
from the same :data:`~tokenomy.policy.closedloop.ADMISSION_POLICIES` entry, applied to live
requests: at most ``max_in_flight`` requests of a pool are forwarded at once; the others wait
(deferred) until the policy picks them or their deadline passes (shed: 503 ``overloaded`` with
``retry-after``). A request is never shed before it waited: every refusal for load is a deadline.
The tenant's tier comes from its key's effective priority (``ops.admission.tiers``: the first tier
whose ``min_priority`` the priority reaches, the lowest tier otherwise), its consumption rate and
remaining budget from token operations (:class:`~tokenomy.gateway.admission.AdmissionSignals`).
Every decision goes to the trace sink given (the gateway logs them at debug level).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.admission import PoolSignals
from tokenomy.gateway.ops.closed_loop_settings import ClosedLoopSettings, closed_loop_config
from tokenomy.policy.closedloop import (
    Action,
    ArrivalView,
    ClosedLoopConfig,
    LoadView,
    QueuedView,
    TenantView,
    make_admission_policy,
)
from tokenomy.policy.trace import TraceSink

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ClosedLoopTicket:
    """A slot in a pool, held from ``enter`` until ``leave``; ``max_tokens`` as the policy capped it."""

    pool: str
    tier: str
    max_tokens: int
    view: QueuedView | None = None
    future: asyncio.Future[None] | None = None
    state: str = "queued"  # queued -> granted -> left, or queued -> shed
    waited_s: float = 0.0


@dataclass(slots=True)
class _Pool:
    in_flight: int = 0
    queue: list[ClosedLoopTicket] = field(default_factory=list)


class ClosedLoopPools:
    """Admission pools applying one closed-loop policy (module docstring).

    ``tier_of(priority)`` names a key's tier; ``enter`` waits for a slot or raises GatewayError
    (503 ``overloaded`` when shed at its deadline, 429 ``budget_exceeded`` when the policy refuses
    for budget); ``leave`` frees a slot. ``deferred`` and ``refused`` count requests by tier.
    """

    def __init__(self, policy: str, config: ClosedLoopConfig, *, max_in_flight: int, pool_of: dict[str, str],
                 tier_min_priority: dict[str, int], retry_after_s: int = 1, trace: TraceSink | None = None) -> None:
        self.policy = make_admission_policy(policy, config, trace)
        self.max_in_flight = max_in_flight
        self.retry_after_s = retry_after_s
        self._pool_of = pool_of
        self._tiers = sorted(tier_min_priority.items(), key=lambda kv: -kv[1])
        self._pools: dict[str, _Pool] = {}
        self.deferred: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.shed_count = 0

    def pool_of(self, model: str) -> str:
        return self._pool_of.get(model, "default")

    def tier_of(self, priority: int) -> str:
        for name, least in self._tiers:
            if priority >= least:
                return name
        return self.policy.config.lowest.name

    def in_flight(self, pool: str) -> int:
        return self._pools.get(pool, _Pool()).in_flight

    def queue_depth(self, pool: str) -> int:
        return len(self._pools.get(pool, _Pool()).queue)

    def signals(self, pool: str) -> PoolSignals:
        return PoolSignals(pool, self.in_flight(pool), self.queue_depth(pool), self.max_in_flight)

    def _load(self, p: _Pool) -> LoadView:
        return LoadView(p.in_flight, self.max_in_flight, len(p.queue))

    async def enter(self, model: str, *, request_id: str, tenant: str, priority: int, tokens_per_s: float,
                    budget_left_fraction: float | None, prompt_tokens: int, max_tokens: int,
                    retries: int = 0) -> ClosedLoopTicket:
        """A granted ticket, after waiting if the pool is full (module docstring); ``retries``: the
        client's retries of this request so far (a retry waits behind its tenant's first attempts)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        name = self.pool_of(model)
        p = self._pools.setdefault(name, _Pool())
        tier = self.tier_of(priority)
        view = TenantView(tenant, tier, tokens_per_s, budget_left_fraction)
        d = self.policy.arrive(ArrivalView(request_id, view, prompt_tokens, max_tokens, retries), self._load(p), now)
        if d.action is Action.REFUSE:
            self.refused[tier] += 1
            raise GatewayError(429, f"admission: {d.reason}", type="insufficient_quota", code="budget_exceeded",
                               headers={"x-should-retry": "false"})  # the budget will not refill in a moment
        ticket = ClosedLoopTicket(name, tier, d.max_tokens, QueuedView.of(d, now), loop.create_future())
        p.queue.append(ticket)
        if d.eligible_s > now:
            loop.call_at(d.eligible_s, self._pump, name)
        self._pump(name)
        if ticket.state == "granted":
            return ticket
        self.deferred[tier] += 1
        assert ticket.future is not None
        try:
            await asyncio.wait_for(asyncio.shield(ticket.future), max(0.0, d.deadline_s - now))
        except (TimeoutError, asyncio.CancelledError) as exc:
            if ticket.state == "granted":  # granted just as we gave up: hand the slot on
                self.leave(ticket)
            elif ticket.state == "queued":
                ticket.state = "shed"
                p.queue.remove(ticket)
                if isinstance(exc, TimeoutError):
                    assert ticket.view is not None
                    self.policy.shed(ticket.view, loop.time())
            if isinstance(exc, TimeoutError):
                self.shed_count += 1
                self.refused[tier] += 1
                raise GatewayError(503, f"pool {name!r} is overloaded: no slot within the {tier} tier's wait",
                                   type="server_error", code="overloaded",
                                   headers={"retry-after": str(self.retry_after_s)}) from None
            raise
        ticket.waited_s = loop.time() - now
        return ticket

    def _pump(self, name: str) -> None:
        p = self._pools[name]
        now = asyncio.get_running_loop().time()
        while p.queue and p.in_flight < self.max_in_flight:
            pick = self.policy.pick([t.view for t in p.queue if t.view is not None], self._load(p), now)
            if pick is None:
                return
            ticket = p.queue.pop(pick.index)
            ticket.state = "granted"
            p.in_flight += 1
            if ticket.future is not None and not ticket.future.done():
                ticket.future.set_result(None)

    def leave(self, ticket: Any) -> None:
        """Return a granted slot (idempotent); the policy picks who gets it."""
        if ticket.state != "granted":
            return
        ticket.state = "left"
        self._pools[ticket.pool].in_flight -= 1
        self._pump(ticket.pool)


def build_pools(settings: ClosedLoopSettings, *, max_in_flight: int | None, pools: dict[str, tuple[str, ...]],
                retry_after_s: int) -> ClosedLoopPools:
    """The pools ``ops.admission`` describes (``closed_loop`` set); every decision is logged at debug level."""
    if max_in_flight is None:
        raise ValueError("ops.admission.closed_loop needs ops.admission.max_in_flight (the slots it shares out)")
    pool_of = {m: name for name, models in pools.items() for m in models}
    return ClosedLoopPools(settings.policy, closed_loop_config(settings), max_in_flight=max_in_flight,
                           pool_of=pool_of, tier_min_priority={t.name: t.min_priority for t in settings.tiers},
                           retry_after_s=retry_after_s, trace=lambda e: log.debug("closed loop: %s", e))
