"""The gateway's Prometheus metrics, in a registry of its own (no process-wide state).

Token operations register their metrics (limits hit, breaker trips, queue depth) into the same
:attr:`GatewayMetrics.registry`, which ``GET /metrics`` renders.

The per-request counters (requests, tokens and cost by class) are plain dict sums rendered by a
collector at scrape time: a labelled ``Counter.inc`` costs ~10 us, nine of them a request.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from tokenomy.gateway.metering.ledger import UsageEvent

CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
# TTFT as clients see it; 2.0 s is the TTFT SLO the alert rules assume (deploy/prometheus/alerts.yml)
_TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class _Sums(Collector):
    """Counters kept as dict sums, rendered on scrape."""

    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.tokens: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.cost: defaultdict[tuple[str, str], float] = defaultdict(float)

    def collect(self) -> Iterator[Metric]:
        for name, doc, labels, sums in (
            ("tokenomy_gateway_requests", "Requests answered, by model and HTTP status", ["model", "status"],
             self.requests),
            ("tokenomy_gateway_tokens", "Metered tokens by class", ["model", "token_class"], self.tokens),
            ("tokenomy_gateway_cost_usd", "Metered cost by class", ["model", "cost_class"], self.cost),
        ):
            fam = CounterMetricFamily(name, doc, labels=labels)
            for key, value in list(sums.items()):
                fam.add_metric(list(key), float(value))
            yield fam


class _AmpdGates(Collector):
    """AMPD's live gates (``tokenomy.gateway.routing.ampd_live``), read at scrape time: the gateway's
    prefill queue per prefill backend and its decode admission gate per decode backend."""

    def __init__(self, live: Any) -> None:
        self.live = live  # an AmpdLive: its ``queues`` and ``gates`` dicts, by backend id

    def collect(self) -> Iterator[Metric]:
        waiting = GaugeMetricFamily("tokenomy_gateway_ampd_waiting", "Turns waiting in an AMPD gate",
                                    labels=["gate", "backend"])
        held = CounterMetricFamily("tokenomy_gateway_ampd_held", "Turns that had to wait in an AMPD gate",
                                   labels=["gate", "backend"])
        reordered = CounterMetricFamily(
            "tokenomy_gateway_ampd_decode_reordered", "Decode admissions that overtook an older waiting turn",
            labels=["backend"])
        for gate, by_backend in (("prefill", self.live.queues), ("decode", self.live.gates)):
            for backend, g in list(by_backend.items()):
                waiting.add_metric([gate, backend], len(g.tasks))
                held.add_metric([gate, backend], g.held)
                if gate == "decode":
                    reordered.add_metric([backend], g.reordered)
        counts = self.live.counts
        placements = CounterMetricFamily("tokenomy_gateway_ampd_placements",
                                         "Turns whose (incremental) prefill AMPD placed, local or remote",
                                         labels=["placement"])
        for where in ("local", "remote"):
            placements.add_metric([where], counts.placements[where])
        prefill_reordered = CounterMetricFamily(
            "tokenomy_gateway_ampd_prefill_reordered", "Prefill releases that overtook older queued turns",
            labels=["backend"])
        deferrals = CounterMetricFamily("tokenomy_gateway_ampd_deferrals",
                                        "Queued prefills overtaken by a reordered release", labels=["backend"])
        for backend in list(self.live.queues):
            prefill_reordered.add_metric([backend], counts.prefill_reordered[backend])
            deferrals.add_metric([backend], counts.deferrals[backend])
        yield from (waiting, held, reordered, placements, prefill_reordered, deferrals)


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.sums = _Sums()
        r.register(self.sums)
        self.errors = Counter(
            "tokenomy_gateway_errors", "Refusals and failures by error code", ["code"], registry=r
        )
        self.upstream_failures = Counter(
            "tokenomy_gateway_upstream_failures", "Connection errors talking to a backend", ["backend"], registry=r
        )
        self.added_latency = Histogram(
            "tokenomy_gateway_added_latency_seconds",
            "Time spent in the gateway itself (total minus time waiting on the backend)",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.ttft = Histogram("tokenomy_gateway_ttft_seconds",
                              "Time to first token of answered requests, as the client saw it at the gateway",
                              buckets=_TTFT_BUCKETS_S, registry=r)
        self.in_flight = Gauge("tokenomy_gateway_in_flight", "Requests this replica has in flight per backend",
                               ["backend"], registry=r)
        self.fleet_in_flight = Gauge("tokenomy_gateway_fleet_in_flight",
                                     "Requests in flight per backend as routing sees them: this replica's plus the "
                                     "fleet's other replicas' last published counts", ["backend"], registry=r)
        self.healthy = Gauge("tokenomy_gateway_backend_healthy", "1 when the backend is in rotation", ["backend"], registry=r)

    def watch_ampd(self, live: Any) -> None:
        """Render AMPD's live gates (an ``AmpdLive``) on ``/metrics``."""
        self.registry.register(_AmpdGates(live))

    def count_request(self, model: str, status: int) -> None:
        self.sums.requests[(model, str(status))] += 1

    def observe_event(self, ev: UsageEvent) -> None:
        m = ev.model
        if ev.ttft_s is not None and ev.outcome == "ok":
            self.ttft.observe(ev.ttft_s)
        tokens, cost = self.sums.tokens, self.sums.cost
        for cls, n in (
            ("input", ev.input_tokens),
            ("incremental_prefill", ev.incremental_prefill_tokens),
            ("history", ev.history_tokens),
            ("output", ev.output_tokens),
            ("cached", ev.cached_tokens),
            ("recomputed", ev.recomputed_tokens),
            ("reasoning", ev.reasoning_tokens),  # a part of output
        ):
            if n:
                tokens[(m, cls)] += n
        for cls, usd in (
            ("recomputed", ev.cost_recomputed_usd),
            ("cached", ev.cost_cached_usd),
            ("output", ev.cost_output_usd),
        ):
            if usd:
                cost[(m, cls)] += usd

    def render(self) -> bytes:
        return generate_latest(self.registry)
