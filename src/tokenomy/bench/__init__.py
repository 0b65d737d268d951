"""``tokenomy bench``: agentic load on any OpenAI-compatible endpoint, measured by ``metrics``.

Entry points: :class:`BenchConfig`, :func:`run_bench` (sessions in, :class:`BenchReport` out).
See docs/bench.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx

from tokenomy.bench.client import Clock, Outcome, WallClock
from tokenomy.bench.config import BenchConfig, normalize_target
from tokenomy.bench.results import BenchReport, report, to_record
from tokenomy.bench.runner import BenchRun, ResultFn, TurnResult
from tokenomy.bench.text import PromptBuilder
from tokenomy.core import Session


def run_bench(
    sessions: Sequence[Session],
    config: BenchConfig,
    *,
    clock: Clock | None = None,
    client: httpx.AsyncClient | None = None,
    on_result: ResultFn | None = None,
) -> BenchReport:
    """Run ``sessions`` against ``config.targets`` on a fresh event loop and summarise them."""
    run = BenchRun(sessions, config, clock=clock, client=client, on_result=on_result)
    wall0 = time.perf_counter()
    results = asyncio.run(run.run())
    return report(results, run.t0, config, time.perf_counter() - wall0)


__all__ = [
    "BenchConfig",
    "BenchReport",
    "BenchRun",
    "Clock",
    "Outcome",
    "PromptBuilder",
    "TurnResult",
    "WallClock",
    "normalize_target",
    "report",
    "run_bench",
    "to_record",
]
