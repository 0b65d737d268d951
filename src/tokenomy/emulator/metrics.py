"""``/metrics``: Prometheus text with vLLM's metric names and meanings.

Engine state (queues, KV usage, prefix-cache and token counters) is read from the engine when
scraped, so the engine stays its only owner; latency histograms are observed by the server as
tokens are delivered, in modelled seconds. Every series carries ``model_name`` (and ``engine``,
as vLLM v1 does).

| name | type | meaning (as vLLM's) |
|---|---|---|
| ``vllm:num_requests_running`` | gauge | requests in the running batch |
| ``vllm:num_requests_waiting`` | gauge | requests queued, not scheduled |
| ``vllm:kv_cache_usage_perc`` | gauge | fraction of KV blocks in use (0..1; free cached blocks count as free) |
| ``vllm:prefix_cache_queries_total`` | counter | prompt tokens looked up in the prefix cache |
| ``vllm:prefix_cache_hits_total`` | counter | of those, tokens found cached |
| ``vllm:prompt_tokens_total`` | counter | prompt tokens of finished requests (computed or cached) |
| ``vllm:generation_tokens_total`` | counter | output tokens delivered |
| ``vllm:request_prefill_kv_computed_tokens`` | histogram | prompt tokens computed here per request (not cached, not pulled) |
| ``vllm:prompt_tokens_cached_total`` | counter | prompt tokens not computed here: prefix-cache hits and KV pulled from a prefill instance |
| ``vllm:num_preemptions_total`` | counter | preemptions |
| ``vllm:request_success_total`` | counter | finished requests by ``finished_reason`` |
| ``vllm:time_to_first_token_seconds`` | histogram | arrival at the server to first token |
| ``vllm:inter_token_latency_seconds`` | histogram | gap between consecutive tokens of a request |
| ``vllm:e2e_request_latency_seconds`` | histogram | arrival to last token |
| ``vllm:request_prompt_tokens`` / ``vllm:request_generation_tokens`` | histogram | per finished request |
| ``tokenomy:kv_transfers_total`` | counter | remote prefills whose KV this instance pulled (P/D decode side; vLLM counts these in its KV connector's stats) |
| ``tokenomy:kv_transfer_tokens_total`` | counter | tokens of KV pulled (what was not already in the prefix cache) |
| ``tokenomy:kv_history_pulls_total`` | counter | prefills that pulled a session's history KV from its decode instance (the ``tokenomy_history_tokens`` extension, P/D prefill side) |
| ``tokenomy:kv_history_pull_tokens_total`` | counter | tokens of history KV pulled instead of recomputed |
| ``tokenomy:kv_retained_requests_total`` | counter | requests pinned after finishing by a ``/v1/tokenomy/retain`` hint |
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from tokenomy.engine import Engine

# vLLM v1's bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


CounterSource = Callable[[], list[tuple[str, str, float]]]
"""More counters read at scrape time: (name without ``_total``, help, value)."""


class FastHistogram:
    """A Prometheus histogram kept as plain ints (observed once per streamed token, so it must be
    cheap: ``bisect`` plus two additions, no lock; the event loop is the only writer)."""

    __slots__ = ("name", "doc", "bounds", "counts", "sum")

    def __init__(self, name: str, doc: str, bounds: tuple[float, ...]) -> None:
        self.name = name
        self.doc = doc
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last slot is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(self, names: list[str], values: list[str]) -> HistogramMetricFamily:
        running = 0
        buckets: list[tuple[str, float]] = []
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            buckets.append((floatToGoString(bound), running))
        h = HistogramMetricFamily(self.name, self.doc, labels=names)
        h.add_metric(values, buckets, self.sum)
        return h


class _EngineCollector(Collector):
    """Everything: gauges and counters read from the engine at scrape time, and the histograms."""

    def __init__(self, engine: Engine, labels: dict[str, str], counters: CounterSource,
                 histograms: list[FastHistogram], success: dict[str, int]) -> None:
        self._engine = engine
        self._counters = counters
        self._histograms = histograms
        self._success = success
        self._names = list(labels)
        self._values = list(labels.values())

    def collect(self) -> Iterator[Metric]:
        e, names, values = self._engine, self._names, self._values
        stats = e.stats
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", e.num_running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", e.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv_usage),
        ):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            yield g
        for name, doc, total in (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             stats.prefix_cache_queries_tokens),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             stats.prefix_cache_hits_tokens),
            ("vllm:num_preemptions", "Cumulative number of preemptions from the engine.", stats.num_preemptions),
            *self._counters(),
        ):
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, total)
            yield c
        c = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                labels=[*names, "finished_reason"])
        for reason, n in sorted(self._success.items()):
            c.add_metric([*values, reason], n)
        yield c
        for h in self._histograms:
            yield h.family(names, values)


class EmulatorMetrics:
    """The registry of one emulated instance (never the process-wide default registry)."""

    def __init__(self, engine: Engine, model_name: str, counters: CounterSource, engine_index: str = "0") -> None:
        labels = {"model_name": model_name, "engine": engine_index}
        self.ttft = FastHistogram("vllm:time_to_first_token_seconds",
                                  "Histogram of time to first token in seconds.", TTFT_BUCKETS_S)
        self.itl = FastHistogram("vllm:inter_token_latency_seconds",
                                 "Histogram of inter-token latency in seconds.", ITL_BUCKETS_S)
        self.e2e = FastHistogram("vllm:e2e_request_latency_seconds",
                                 "Histogram of e2e request latency in seconds.", E2E_BUCKETS_S)
        self.request_prompt_tokens = FastHistogram("vllm:request_prompt_tokens",
                                                   "Number of prefill tokens processed.", TOKEN_BUCKETS)
        self.request_generation_tokens = FastHistogram("vllm:request_generation_tokens",
                                                       "Number of generation tokens processed.", TOKEN_BUCKETS)
        self.request_prefill_kv_computed_tokens = FastHistogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).", TOKEN_BUCKETS)
        self._success: dict[str, int] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(
            engine, labels, counters,
            [self.ttft, self.itl, self.e2e, self.request_prompt_tokens, self.request_generation_tokens,
             self.request_prefill_kv_computed_tokens],
            self._success))

    def success(self, finished_reason: str) -> None:
        self._success[finished_reason] = self._success.get(finished_reason, 0) + 1

    def render(self) -> bytes:
        return generate_latest(self.registry)
