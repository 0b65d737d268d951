"""Prometheus metrics of token operations, registered on the registry ``GET /metrics`` renders."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class OpsMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        self.refusals = Counter("tokenomy_gateway_ops_refusals",
                                "Requests refused by token operations, by code (limits, budgets, auth, shed)",
                                ["code"], registry=r)
        self.breaker_trips = Counter("tokenomy_gateway_breaker_trips", "Agent circuit breaker trips",
                                     ["scope", "code"], registry=r)
        self.stream_cuts = Counter("tokenomy_gateway_stream_cuts", "Streams cut at a hard cap", ["code"],
                                   registry=r)
        self.queue_depth = Gauge("tokenomy_gateway_admission_queue_depth", "Requests waiting for admission",
                                 ["pool"], registry=r)
        self.pool_in_flight = Gauge("tokenomy_gateway_admission_in_flight", "Requests admitted and in flight",
                                    ["pool"], registry=r)
        self.alerts = Counter("tokenomy_gateway_alerts", "Alerts emitted", ["kind"], registry=r)
        self.reserved_usd = Counter("tokenomy_gateway_budget_reserved_usd", "Worst-case cost reserved",
                                    registry=r)
