"""What token operations report: refusals, breaker trips and budget events as alerts and metrics.

The guard state and the budget policy record events (a breaker trip, a threshold crossed, a
budget's first refusal); ``OpsReports.drain`` turns them into ``Alert``s (a log line, a webhook)
and Prometheus counts. A settled cost also feeds the key's spend-rate monitor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.alerts import Alert, Alerter, AlertsConfig, SpendRateMonitor
from tokenomy.gateway.ops.breaker import Trip
from tokenomy.gateway.ops.budget import BudgetPolicy
from tokenomy.gateway.ops.metrics import OpsMetrics


class OpsReports:
    def __init__(self, config: AlertsConfig, metrics: OpsMetrics, alerter: Alerter, budgets: BudgetPolicy) -> None:
        self.metrics = metrics
        self.alerter = alerter
        self.budgets = budgets
        a = config
        self.spend_rate = SpendRateMonitor(a.spend_rate_usd_per_hour, a.spend_rate_window_s, a.spend_rate_factor,
                                           a.spend_baseline_s, a.spend_rate_min_usd_per_hour)

    def refused(self, err: GatewayError) -> None:
        self.metrics.refusals.labels(err.code or str(err.status)).inc()

    def alert(self, kind: str, subject: str, message: str, now_s: float, data: dict[str, Any]) -> None:
        self.metrics.alerts.labels(kind).inc()
        self.alerter.emit(Alert(kind, subject, message, now_s, data))

    def spent(self, key_id: str, cost_usd: float, now_s: float) -> None:
        """A settled cost: the key's spend rate (an alert when anomalous)."""
        anomaly = self.spend_rate.add(key_id, cost_usd, now_s)
        if anomaly is not None:
            rate, reason = anomaly
            self.alert("spend_rate", key_id, f"spending ${rate:.2f}/h, {reason}", now_s,
                       {"usd_per_hour": rate, "reason": reason})

    def drain(self, trips: Iterable[Trip], now_s: float) -> None:
        """Alert and count ``trips`` and the budget policy's crossings and refusals so far."""
        for trip in trips:
            self.metrics.breaker_trips.labels(trip.scope, trip.code).inc()
            self.alert("breaker_trip", f"{trip.scope} {trip.subject}", f"{trip.code}: {trip.reason}", now_s,
                       {"code": trip.code, "until_s": trip.until_s})
        groups: tuple[tuple[str, list[Any]], ...] = (  # Crossing, RefusalEvent: .node_id, .alert()
            ("budget_threshold", self.budgets.crossings), ("budget_refusal", self.budgets.refusals))
        for kind, events in groups:
            for event in events:
                message, data = event.alert()
                self.alert(kind, event.node_id, message, now_s, data)
            events.clear()
