"""A slot in the model's pool for an admitted request: the priority queue or the closed loop.

Per replica in a fleet too: a pool guards this replica's own connections to its backends. The
pool's depth and in-flight count go to ``/metrics`` whenever a request enters or leaves.
"""

from __future__ import annotations

from typing import Any

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.admission import AdmissionConfig, AdmissionSignals, PriorityAdmission, Ticket
from tokenomy.gateway.ops.closed_loop import ClosedLoopPools, ClosedLoopTicket, build_pools
from tokenomy.gateway.ops.guard import Admission, AdmitRequest
from tokenomy.gateway.ops.metrics import OpsMetrics

PoolTicket = Ticket | ClosedLoopTicket


class AdmissionPools:
    """``admission``: the priority queue; ``closed``: the closed loop's pools when configured."""

    def __init__(self, config: AdmissionConfig, metrics: OpsMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.admission = PriorityAdmission(config)
        self.closed: ClosedLoopPools | None = None if config.closed_loop is None else build_pools(
            config.closed_loop, max_in_flight=config.max_in_flight, pools=config.pools,
            retry_after_s=config.retry_after_s)
        self._gauges: dict[str, tuple[Any, Any]] = {}

    @property
    def on(self) -> bool:
        """Overload control is configured (else nothing queues)."""
        return self.config.max_in_flight is not None

    async def enter(self, request: AdmitRequest, admission: Admission, sig: AdmissionSignals) -> PoolTicket:
        """Wait for a slot (503 ``overloaded`` when shed); under the closed loop, set the
        admission's tier and lower its output cap when the policy degrades it."""
        try:
            if self.closed is None:
                return await self.admission.enter(request.model, sig)
            return await self._enter_closed(request, admission, sig)
        finally:
            self.observe(self._pools().pool_of(request.model))

    async def _enter_closed(self, request: AdmitRequest, admission: Admission, sig: AdmissionSignals) -> PoolTicket:
        assert self.closed is not None
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

    def leave(self, ticket: PoolTicket | None) -> None:
        """Give the slot back to its pool (the best waiter gets it); None: held none."""
        if isinstance(ticket, ClosedLoopTicket) and self.closed is not None:
            self.closed.leave(ticket)
        elif isinstance(ticket, Ticket):
            self.admission.leave(ticket)
        if ticket is not None:
            self.observe(ticket.pool)

    def _pools(self) -> ClosedLoopPools | PriorityAdmission:
        return self.closed or self.admission

    def observe(self, pool: str) -> None:
        sig = self._pools().signals(pool)
        gauges = self._gauges.get(pool)
        if gauges is None:
            gauges = self._gauges[pool] = (self.metrics.queue_depth.labels(pool), self.metrics.pool_in_flight.labels(pool))
        gauges[0].set(sig.queue_depth)
        gauges[1].set(sig.in_flight)
