"""``tokenomy bench``: agentic load on any OpenAI-compatible (or Anthropic Messages) endpoint, measured
by ``metrics``.

Entry points: :class:`BenchConfig`, :func:`run_bench` (sessions in, :class:`BenchReport` out).
See docs/bench.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from tokenomy.bench.client import AiohttpOpener, Clock, Opener, Outcome, WallClock
from tokenomy.bench.config import BenchConfig, normalize_target
from tokenomy.bench.results import BenchReport, report, to_record
from tokenomy.bench.runner import BenchRun, ResultFn, TurnResult
from tokenomy.bench.text import PromptBuilder, PromptSizing
from tokenomy.core import Session


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when installed (it parses several thousand stream chunks a second
    with less CPU), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_bench(
    sessions: Sequence[Session],
    config: BenchConfig,
    *,
    clock: Clock | None = None,
    opener: Opener | None = None,
    on_result: ResultFn | None = None,
    sizing: PromptSizing | None = None,
) -> BenchReport:
    """Run ``sessions`` against ``config.targets`` on a fresh event loop and summarise them;
    ``sizing`` sizes the prompts in the target's tokens (:func:`tokenomy.bench.sizing.measure_sizing`)."""
    run = BenchRun(sessions, config, clock=clock, opener=opener, on_result=on_result, sizing=sizing)
    wall0 = time.perf_counter()
    # A caller's clock may depend on asyncio's own loop; only the wall clock gets uvloop.
    with asyncio.Runner(loop_factory=_loop_factory() if clock is None else None) as runner:
        results = runner.run(run.run())
    rep = report(results, run.t0, config, time.perf_counter() - wall0)
    rep.extras["prompt_sizing"] = run.sizing.to_dict()
    return rep


__all__ = [
    "AiohttpOpener",
    "BenchConfig",
    "BenchReport",
    "BenchRun",
    "Clock",
    "Opener",
    "Outcome",
    "PromptBuilder",
    "PromptSizing",
    "TurnResult",
    "WallClock",
    "normalize_target",
    "report",
    "run_bench",
    "to_record",
]
