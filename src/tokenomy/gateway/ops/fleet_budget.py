"""Budgets for a fleet: ``ops.budget.Budgets``' policy over the Redis hold store (async).

The same charges (every node of the key's path, each in its own period), refusals (429
``budget_exceeded``, ``retry-after: 1`` while requests in flight hold the rest, else to the period's
end), threshold crossings and budget tiers; the atomic step (check every node, hold on every node)
is ``RedisReservations.reserve``'s one script. ``seed`` rebuilds Redis's spend from the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.budget import (
    Crossing,
    RefusalEvent,
    crossed,
    node_label,
    period_key,
    refusal_error,
)
from tokenomy.gateway.ops.tenancy import Node, TenantTree
from tokenomy.gateway.stores.budget_seed import period_starts_s, spend_by_charge
from tokenomy.gateway.stores.redis_reservations import RedisReservations
from tokenomy.gateway.stores.reservations import Charge, Hold, Refusal

log = logging.getLogger(__name__)


class SpendSnapshots(Protocol):
    async def spend_snapshot(self, since_s: dict[str, float]) -> tuple[dict[str, dict[str, float]], str]: ...


class SharedBudgets:
    """Budget policy over ``RedisReservations``; ``crossings`` is drained by the guard (alerts)."""

    def __init__(self, store: RedisReservations, thresholds: Sequence[float] = (0.5, 0.8, 1.0)) -> None:
        self.store = store
        self.thresholds = tuple(sorted(thresholds))
        self.crossings: list[Crossing] = []
        self.refusals: list[RefusalEvent] = []
        self._exhausted: set[Charge] = set()

    @staticmethod
    def charges(path: Sequence[Node], now_s: float) -> tuple[tuple[Charge, ...], dict[Charge, float]]:
        charges = tuple((n.id, period_key(n.limits.budget_period, now_s)) for n in path)
        budgets = {c: n.limits.budget_usd for c, n in zip(charges, path, strict=True) if n.limits.budget_usd is not None}
        return charges, budgets

    async def seed(self, tree: TenantTree, ledger: SpendSnapshots, now_s: float) -> bool:
        """Write the ledger's spend for the current periods, once per Redis data set."""
        by_period, snapshot = await ledger.spend_snapshot(period_starts_s(now_s))
        totals = spend_by_charge(tree, by_period, now_s)
        seeded = await self.store.seed(totals, snapshot)
        if seeded:
            log.info("fleet budgets: seeded %d charges from the ledger", len(totals))
        return seeded

    async def reserve(self, rid: str, path: Sequence[Node], amount: float, now_s: float) -> None:
        """Hold ``amount`` on every node of ``path`` or raise 429 ``budget_exceeded`` (``Unseeded``:
        the caller seeds and retries). The fleet guard's admission holds through ``RedisAdmission``
        (one script with the limits and breakers) and calls ``refused`` with its refusal."""
        charges, budgets = self.charges(path, now_s)
        refusal = await self.store.reserve(Hold(rid, charges, amount, now_s + self.store.lease_s), budgets, now_s)
        if refusal is not None:
            raise self.refused(path, refusal, amount, now_s)

    def refused(self, path: Sequence[Node], refusal: Refusal, amount: float, now_s: float) -> GatewayError:
        """The 429 ``budget_exceeded`` of ``refusal``; the first one per node and period becomes an alert."""
        node = next(n for n in path if n.id == refusal.charge[0])
        if refusal.charge not in self._exhausted:
            self._exhausted.add(refusal.charge)
            self.refusals.append(RefusalEvent(node.id, node_label(node), refusal.charge[1], node.limits.budget_period,
                                              refusal.spent_usd, refusal.reserved_usd, refusal.budget_usd, amount))
        return refusal_error(node, refusal, amount, now_s)

    async def settle(self, rid: str, actual_usd: float, path: Sequence[Node], admitted_s: float,
                     ledger_xid: int | None) -> None:
        """Charge the actual cost once; thresholds it crossed go to ``crossings``."""
        charges = self.charges(path, admitted_s)[0]
        await self.settled(await self.store.settle(rid, actual_usd, ledger_xid, charges), actual_usd, path)

    async def settled(self, hold: Hold | None, actual_usd: float, path: Sequence[Node]) -> None:
        """Budget thresholds that charging ``actual_usd`` for ``hold`` crossed go to ``crossings``."""
        if hold is None:
            return
        spent_after = self.store.last_spent
        for charge, node in zip(hold.charges, path, strict=False):
            budget = node.limits.budget_usd
            if budget is None or budget <= 0 or charge[0] != node.id:
                continue
            spent = spent_after.get(charge)
            if spent is None:
                spent, _ = await self.store.usage(charge)
            for t in crossed(self.thresholds, spent, actual_usd, budget):
                self.crossings.append(Crossing(node.id, charge[1], t, spent, budget, node_label(node),
                                               node.limits.budget_period))

    async def tier_priority(self, path: Sequence[Node], now_s: float,
                            spent_usd: Sequence[float] | None = None) -> int | None:
        """The lowest priority a budget tier imposes along the path, or None; ``spent_usd``: each
        node's spend as the admission read it (else read here)."""
        out: int | None = None
        for i, node in enumerate(path):
            budget = node.limits.budget_usd
            if budget is None or not node.limits.budget_tiers:
                continue
            if spent_usd is not None:
                spent = spent_usd[i]
            else:
                spent = (await self.store.usage((node.id, period_key(node.limits.budget_period, now_s))))[0]
            used = 1.0 if budget <= 0 else spent / budget
            for tier in node.limits.budget_tiers:
                if used + 1e-9 >= tier.at_fraction:
                    out = tier.priority if out is None else min(out, tier.priority)
        return out
