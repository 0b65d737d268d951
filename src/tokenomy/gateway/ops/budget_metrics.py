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
    def __init__(self, guard: Any) -> None:
        self.guard = guard  # an OpsGuard: .store.tree, .budgets.store.usage, .clock

    def collect(self) -> Iterator[Metric]:
        labels = ["node", "name", "kind", "period"]
        spent = GaugeMetricFamily("tokenomy_gateway_budget_spent_usd",
                                  "Spend settled in the node's current budget period", labels=labels)
        budget = GaugeMetricFamily("tokenomy_gateway_budget_usd", "The node's budget per period", labels=labels)
        now = self.guard.clock()
        for node in self.guard.store.tree.nodes():
            if node.limits.budget_usd is None or node.revoked:
                continue
            values = [node.id, node.name, node.kind.value, node.limits.budget_period]
            settled, _held = self.guard.budgets.store.usage((node.id, period_key(node.limits.budget_period, now)))
            spent.add_metric(values, settled)
            budget.add_metric(values, node.limits.budget_usd)
        yield from (spent, budget)
