"""Priority admission per backend pool: under overload, queue by score and shed the lowest first.

A pool admits up to ``max_in_flight`` requests at once; more wait in a priority queue of at most
``max_queue_depth``. When the queue is full the lowest-scored request — queued or arriving — is
shed with 503 + ``retry-after``; a queued request that waits past ``queue_timeout_s`` is shed too.
A finishing request hands its slot straight to the best-scored waiter (no thundering herd).

The score (higher is better) is ``priority_weight * priority + budget_weight * remaining_budget_fraction
- rate_weight * consumption_tokens_per_s / 1000``: the tenant's priority class dominates, then tenants
with budget left, then those consuming slowly. ``signals`` exposes the same inputs, per pool and
per key, to routing policies.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from tokenomy.gateway.errors import GatewayError


class AdmissionConfig(BaseModel):
    """Overload thresholds. ``max_in_flight=None`` admits everything (no queue)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_in_flight: int | None = Field(default=None, ge=1)
    max_queue_depth: int = Field(default=256, ge=0)
    queue_timeout_s: float = Field(default=30.0, gt=0)
    retry_after_s: int = Field(default=1, ge=1)
    pools: dict[str, tuple[str, ...]] = Field(default_factory=dict, description="pool name -> models")
    priority_weight: float = Field(default=100.0, ge=0)
    budget_weight: float = Field(default=10.0, ge=0)
    rate_weight: float = Field(default=1.0, ge=0)


@dataclass(frozen=True, slots=True)
class AdmissionSignals:
    """What admission weighed for one request; routing policies may read the same values."""

    priority: int
    remaining_budget_fraction: float  # 1.0 when no budget applies
    consumption_tokens_per_s: float


@dataclass(frozen=True, slots=True)
class PoolSignals:
    pool: str
    in_flight: int
    queue_depth: int
    max_in_flight: int | None


@dataclass(slots=True)
class Ticket:
    """A slot in a pool, held from ``enter`` until ``leave``."""

    pool: str
    score: float
    seq: int
    future: asyncio.Future[None] | None = None
    state: str = "queued"  # queued -> granted -> left, or queued -> shed


@dataclass(slots=True)
class _Pool:
    in_flight: int = 0
    queued: int = 0
    heap: list[tuple[float, int, Ticket]] = field(default_factory=list)  # (-score, seq, ticket)


class PriorityAdmission:
    """One ``_Pool`` per configured pool; models not listed share the pool ``default``."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self._pool_of = {m: name for name, models in config.pools.items() for m in models}
        self._pools: dict[str, _Pool] = {}
        self._seq = itertools.count()
        self.shed_count = 0

    def score(self, s: AdmissionSignals) -> float:
        c = self.config
        return (c.priority_weight * s.priority + c.budget_weight * s.remaining_budget_fraction
                - c.rate_weight * s.consumption_tokens_per_s / 1000.0)

    def pool_of(self, model: str) -> str:
        return self._pool_of.get(model, "default")

    def signals(self, pool: str) -> PoolSignals:
        p = self._pools.get(pool, _Pool())
        return PoolSignals(pool, p.in_flight, p.queued, self.config.max_in_flight)

    def _shed_error(self, pool: str, why: str) -> GatewayError:
        self.shed_count += 1
        return GatewayError(503, f"pool {pool!r} is overloaded: {why}", type="server_error",
                            code="overloaded", headers={"retry-after": str(self.config.retry_after_s)})

    async def enter(self, model: str, signals: AdmissionSignals) -> Ticket:
        """A granted ticket, after queueing if the pool is full; GatewayError 503 when shed."""
        name = self.pool_of(model)
        pool = self._pools.setdefault(name, _Pool())
        ticket = Ticket(name, self.score(signals), next(self._seq))
        cap = self.config.max_in_flight
        if cap is None or (pool.in_flight < cap and pool.queued == 0):
            ticket.state = "granted"
            pool.in_flight += 1
            return ticket
        if pool.queued >= self.config.max_queue_depth:
            worst = self._lowest(pool)
            if worst is None or worst.score >= ticket.score:
                raise self._shed_error(name, "queue full, lower priority than every queued request")
            self._shed(pool, worst, "queue full, displaced by a higher-priority request")
        loop = asyncio.get_running_loop()
        ticket.future = loop.create_future()
        heapq.heappush(pool.heap, (-ticket.score, ticket.seq, ticket))
        pool.queued += 1
        try:
            await asyncio.wait_for(asyncio.shield(ticket.future), self.config.queue_timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if ticket.state == "granted":  # granted just as we gave up: hand the slot on
                self.leave(ticket)
            elif ticket.state == "queued":
                ticket.state = "shed"
                pool.queued -= 1
            if isinstance(exc, TimeoutError):
                raise self._shed_error(name, f"queued longer than {self.config.queue_timeout_s} s") from None
            raise
        return ticket

    def _lowest(self, pool: _Pool) -> Ticket | None:
        live = [t for _, _, t in pool.heap if t.state == "queued"]
        return min(live, key=lambda t: (t.score, -t.seq)) if live else None

    def _shed(self, pool: _Pool, ticket: Ticket, why: str) -> None:
        ticket.state = "shed"
        pool.queued -= 1
        assert ticket.future is not None
        if not ticket.future.done():
            ticket.future.set_exception(self._shed_error(ticket.pool, why))

    def leave(self, ticket: Ticket) -> None:
        """Return a granted slot (idempotent); the best waiter gets it."""
        if ticket.state != "granted":
            return
        ticket.state = "left"
        pool = self._pools[ticket.pool]
        pool.in_flight -= 1
        while pool.heap:
            _, _, nxt = heapq.heappop(pool.heap)
            if nxt.state != "queued":
                continue
            nxt.state = "granted"
            pool.queued -= 1
            pool.in_flight += 1
            assert nxt.future is not None
            nxt.future.set_result(None)
            break
