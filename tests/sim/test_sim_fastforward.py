"""Decode fast-forward is exact: the same workloads simulated step by step and fast-forwarded give
the same records (and the same ITL samples, busy time, FLOPs and step counts).

Fast-forwarded runs sum step times in the same order as single steps, so everything compares
with ``==``; only the pooled ITL samples are compared as multisets (a run delivers its samples
together at its end, so their order in the pooled list differs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from tokenomy.core import SLO, Session, Turn
from tokenomy.engine import Engine, StepResult
from tokenomy.perf import PerfModel
from tokenomy.sim import SimConfig, base, simulate
from tokenomy.sim.instance import PooledItl, ResultHandler, SimInstance
from tokenomy.sim.loop import EventLoop
from tokenomy.sim.runner import SimResult
from tokenomy.workload.registry import load_workload

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)
TRACE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "mooncake" / "conversation_trace.jsonl"


def _run(
    sessions: Sequence[Session], config: SimConfig, monkeypatch: pytest.MonkeyPatch, *, bulk: bool = False, **kw: object
) -> tuple[SimResult, list[tuple[float, float]]]:
    """Simulate with instances built by ``SimInstance(..., **kw)``; ``bulk``: the instance keeps the
    pooled ITL itself and hands the deployment only the steps that finished requests (as base.py
    builds it), else every step (and every step of a run) goes to the deployment, which the test
    makes record the ITL. Returns the result and the pooled ITL samples, sorted."""
    contexts: list[base.SimContext] = []

    def make(engine: Engine, loop: EventLoop, on_result: ResultHandler,
             pooled_itl: PooledItl | None = None) -> SimInstance:
        ctx: base.SimContext = on_result.__self__.ctx  # type: ignore[attr-defined]
        contexts.append(ctx)
        if bulk:
            return SimInstance(engine, loop, on_result, pooled_itl=pooled_itl, **kw)  # type: ignore[arg-type]

        def every_step(instance: SimInstance, result: StepResult) -> None:
            if result.shape.decode_seqs:
                ctx.itl.add(result.duration_s, result.shape.decode_seqs)
            on_result(instance, result)

        return SimInstance(engine, loop, every_step, **kw)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(base, "SimInstance", make)
        result = simulate(sessions, config, SLO(), perf=PERF)
    ctx = contexts[0]
    return result, sorted(zip(ctx.itl.values().tolist(), ctx.itl.weights().tolist(), strict=True))


def _assert_same(step: SimResult, fast: SimResult) -> None:
    key = lambda r: r.request_id  # noqa: E731
    a, b = sorted(step.records, key=key), sorted(fast.records, key=key)
    assert [r.request_id for r in a] == [r.request_id for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert dataclasses.asdict(ra) == dataclasses.asdict(rb), ra.request_id
    assert fast.instance_busy_s == step.instance_busy_s
    assert fast.sim_end_s == step.sim_end_s
    assert fast.summary.ttft_p99_s == step.summary.ttft_p99_s
    assert fast.summary.itl_p99_s == step.summary.itl_p99_s


def _compare(sessions: Sequence[Session], config: SimConfig, monkeypatch: pytest.MonkeyPatch, **kw: object) -> int:
    step, itl_step = _run(sessions, config, monkeypatch, fast_forward=False)
    assert step.records, "the workload produced no records"
    for bulk in (False, True):
        fast, itl_fast = _run(sessions, config, monkeypatch, bulk=bulk, fast_forward=True, **kw)
        _assert_same(step, fast)
        assert itl_fast == itl_step
    return fast.events - step.events


CONFIGS = {
    "colocated": SimConfig(deployment="colocated", instances=3),
    "disagg": SimConfig(deployment="disagg", prefill=2, decode=2),
    "ampd": SimConfig(deployment="ampd", prefill=2, decode=2),
}


@pytest.mark.parametrize("deployment", sorted(CONFIGS))
@pytest.mark.parametrize(("workload", "rate_per_s"), [("chat", 2.0), ("gaia", 0.5), ("toolbench", 1.0)])
def test_fast_forward_gives_identical_records(
    deployment: str, workload: str, rate_per_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = load_workload(workload, rate_per_s=rate_per_s, duration_s=40.0, seed=3)
    saved = _compare(sessions, CONFIGS[deployment], monkeypatch)
    assert saved < 0  # it did fast-forward: fewer events


@pytest.mark.parametrize("max_run_steps", [2, 3, 17])
def test_short_runs_and_a_tight_kv_pool_stay_exact(max_run_steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny runs (cut often by their cap) and a small KV pool (runs stop before preemptions)."""
    sessions = load_workload("chat", rate_per_s=4.0, duration_s=20.0, seed=5)
    config = SimConfig(deployment="colocated", instances=2, gpu_memory_utilization=0.3, block_size_tokens=8)
    _compare(sessions, config, monkeypatch, max_run_steps=max_run_steps)


def test_horizon_cut_counts_the_same_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = load_workload("toolbench", rate_per_s=2.0, duration_s=30.0, seed=1)
    _compare(sessions, SimConfig(deployment="colocated", instances=2, horizon_s=17.3), monkeypatch)


def test_identical_sessions_on_twin_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal-time events on instances in lockstep (exact float ties between step boundaries)."""
    turns = (Turn(prompt_tokens=300, output_tokens=200), Turn(prompt_tokens=50, output_tokens=120, think_time_s=0.0))
    sessions = [Session(f"s{i}", 0.0, turns) for i in range(4)]
    _compare(sessions, SimConfig(deployment="colocated", instances=2, router="round_robin"), monkeypatch)


@pytest.mark.skipif(not TRACE.exists(), reason=f"shared Mooncake trace not found at {TRACE}")
def test_mooncake_trace_prefix_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = load_workload(str(TRACE), rate_per_s=0.0, duration_s=float("inf"), seed=0, max_sessions=300)
    _compare(sessions, SimConfig(deployment="colocated", instances=2), monkeypatch)
