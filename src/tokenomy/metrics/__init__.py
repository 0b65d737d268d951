"""The whitepaper's metrics: latency percentiles, SLO attainment, goodput, cost, MFU; reports."""

from tokenomy.metrics.goodput import (
    DEFAULT_ATTAINMENT_TARGET,
    max_rate_at_attainment,
    max_rate_per_gpu_at_attainment,
)
from tokenomy.metrics.percentiles import percentile, weighted_mean, weighted_percentile, weighted_percentiles
from tokenomy.metrics.summary import Summary, summarize

__all__ = [
    "DEFAULT_ATTAINMENT_TARGET",
    "Summary",
    "max_rate_at_attainment",
    "max_rate_per_gpu_at_attainment",
    "percentile",
    "summarize",
    "weighted_mean",
    "weighted_percentile",
    "weighted_percentiles",
]
