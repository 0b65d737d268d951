"""Budget gauges on ``/metrics``, read at scrape time: for every live org, team and key with a
budget, what it spent in its current period (the budget store's settled spend, the number
enforcement uses) and the budget itself, so a rule can alert before requests are refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenomy.gateway.ops.budget import period_key


class BudgetGauges(Collector):
    """``refresh`` (awaited by the ``/metrics`` route before it renders) reads the spend from the
    guard's budget store (a fleet's: Redis, shared by every replica); ``collect`` renders it."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard  # an OpsGuard: .store.tree, .budget_usage, .clock
        self._rows: list[tuple[Any, float]] = []

    async def refresh(self) -> None:
        now = self.guard.clock()
        nodes = [n for n in self.guard.store.tree.nodes() if n.limits.budget_usd is not None and not n.revoked]
        charges = [(n.id, period_key(n.limits.budget_period, now)) for n in nodes]
        usage = await self.guard.budget_usage(charges)
        self._rows = [(n, usage[c][0]) for n, c in zip(nodes, charges, strict=True)]

    def collect(self) -> Iterator[Metric]:
        labels = ["node", "name", "kind", "period"]
        spent = GaugeMetricFamily("tokenomy_gateway_budget_spent_usd",
                                  "Spend settled in the node's current budget period", labels=labels)
        budget = GaugeMetricFamily("tokenomy_gateway_budget_usd", "The node's budget per period", labels=labels)
        for node, settled in self._rows:
            values = [node.id, node.name, node.kind.value, node.limits.budget_period]
            spent.add_metric(values, settled)
            budget.add_metric(values, node.limits.budget_usd)
        yield from (spent, budget)
