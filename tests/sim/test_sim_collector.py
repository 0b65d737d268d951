"""The simulator pauses Python's cyclic garbage collector while its event loop runs and while it
summarises the run, and leaves it as it found it: on after a run that started with it on, off after one that started with it off, and on
again when the run fails inside the loop."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tokenomy.core import SLO, Session
from tokenomy.engine.trace import TraceEvent
from tokenomy.sim import SimConfig, runner, simulate
from tokenomy.workload.registry import load_workload

CONFIG = SimConfig(deployment="colocated", model="llama-3.1-8b", gpu="h100", instances=2)


@pytest.fixture
def collector() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def _sessions() -> list[Session]:
    return load_workload("gaia", rate_per_s=1.0, duration_s=10.0, seed=0)


class _Seen:
    """A trace that records whether the collector ran while the engines emitted events."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.enabled: set[bool] = set()
        self.fail_after = fail_after
        self.n = 0

    def emit(self, event: TraceEvent) -> None:
        self.enabled.add(gc.isenabled())
        self.n += 1
        if self.fail_after is not None and self.n >= self.fail_after:
            raise RuntimeError("trace sink failed")


@pytest.mark.parametrize("enabled", [True, False])
def test_the_loop_runs_without_the_collector_and_restores_it(collector: None, enabled: bool) -> None:
    (gc.enable if enabled else gc.disable)()
    seen = _Seen()
    result = simulate(_sessions(), CONFIG, SLO(), trace=seen)
    assert result.records and seen.n > 0
    assert seen.enabled == {False}  # paused while events ran
    assert gc.isenabled() is enabled  # and left as it was


def test_a_failure_inside_the_loop_restores_the_collector(collector: None) -> None:
    gc.enable()
    with pytest.raises(RuntimeError, match="trace sink failed"):
        simulate(_sessions(), CONFIG, SLO(), trace=_Seen(fail_after=5))
    assert gc.isenabled()


def test_the_summary_runs_without_the_collector_too(collector: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary's allocations right after the loop would set off passes over everything the loop
    allocated, which find nothing to free."""
    gc.enable()
    seen: list[bool] = []
    summarize = runner.summarize

    def spy(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return summarize(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "summarize", spy)
    result = simulate(_sessions(), CONFIG, SLO())
    assert result.summary.requests > 0
    assert seen == [False]
    assert gc.isenabled()
