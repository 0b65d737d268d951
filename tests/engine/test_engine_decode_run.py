"""Decode runs (fast-forward) against single steps: same results, same state, same pool."""

from __future__ import annotations

import pytest
from engine_factory import create_engine, create_requests

from tokenomy.core import Request, StepShape
from tokenomy.engine import Engine, StepResult
from tokenomy.perf import PerfModel

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)


def _state(engine: Engine) -> tuple[object, ...]:
    """Everything a later step or a policy could observe."""
    pool = engine._kv.pool
    reqs = sorted(
        (r.request_id, r.num_computed, r.num_tokens, tuple(r.blocks), r.num_keyed_blocks, r.output_tokens,
         r.last_token_s, r.max_itl_s)
        for r in engine._requests.values()
    )
    return (reqs, pool.free_order(), dict(pool.cached), list(pool.ref_cnt), engine.decode_context_tokens,
            engine.num_waiting_tokens, engine.stats)


def _key(r: StepResult) -> tuple[object, ...]:
    return (r.start_s, r.duration_s, r.shape, r.flops, r.emitted, r.first_token, r.finished, r.preempted)


def _loaded(num_blocks: int, block_size: int) -> Engine:
    engine = create_engine(PERF, num_gpu_blocks=num_blocks, block_size_tokens=block_size)  # type: ignore[arg-type]
    shared = ((0, 40),)
    for i, req in enumerate(create_requests(5, prompt_tokens=40, content=shared)):
        req.max_output_tokens = 30 + 17 * i  # finishes at different steps end runs
        engine.add_request(req, 0.0)
    return engine


@pytest.mark.parametrize("bulk_min_events", [0, 10**9])  # block events applied in bulk always, or never
@pytest.mark.parametrize(("num_blocks", "block_size", "cut_every"), [(1000, 16, 0), (1000, 4, 7), (40, 4, 0), (40, 4, 3)])
def test_runs_match_single_steps(num_blocks: int, block_size: int, cut_every: int, bulk_min_events: int,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs, cut every ``cut_every`` steps (0: never) or stopped by finishes and a short pool,
    produce the single-step results and leave the engine in the same state at each run end."""
    monkeypatch.setattr("tokenomy.engine.decode_run._BULK_MIN_EVENTS", bulk_min_events)
    single, fast = _loaded(num_blocks, block_size), _loaded(num_blocks, block_size)
    now, t_single, got, runs = 0.0, 0.0, [], 0
    while True:
        run = fast.plan_decode_run(now)
        if run is not None:
            runs += 1
            cut = run.starts[min(cut_every, run.num_steps) - 1] if cut_every else run.end_s
            fast.advance_decode_run((run.starts[0] + cut) / 2)  # partial advances are harmless
            run = fast.close_decode_run(cut)
            got += run.results(0, run.num_steps)
            now = run.end_s
            while t_single < now:
                t_single = single.step(t_single).end_s  # type: ignore[union-attr]
            assert t_single == now and _state(fast) == _state(single)
            continue
        result = fast.step(now)
        if result is None:
            break
        got.append(result)
        now = result.end_s
    expected, t = [], 0.0
    fresh = _loaded(num_blocks, block_size)
    while (r := fresh.step(t)) is not None:
        expected.append(r)
        t = r.end_s
    assert runs > 0
    assert [_key(r) for r in got] == [_key(r) for r in expected]


def _first_run(engine: Engine) -> tuple[float, object]:
    """Step ``engine`` until a decode run can start; (its start, the run)."""
    now = 0.0
    while (run := engine.plan_decode_run(now)) is None:
        now = engine.step(now).end_s  # type: ignore[union-attr]
    return now, run


@pytest.mark.parametrize("first_priced", [1, 2, 5])
def test_a_run_priced_when_reached_takes_the_steps_of_one_priced_whole(first_priced: int,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning prices ``FIRST_PRICED`` steps and reaching the priced end prices more: advanced to
    its end, the run has the same steps, start times, FLOPs and engine state as one priced whole."""
    monkeypatch.setattr("tokenomy.engine.decode_run.FIRST_PRICED", 10**9)
    whole_engine = _loaded(1000, 16)
    _, whole = _first_run(whole_engine)
    monkeypatch.setattr("tokenomy.engine.decode_run.FIRST_PRICED", first_priced)
    lazy_engine = _loaded(1000, 16)
    _, lazy = _first_run(lazy_engine)
    assert whole.num_steps > 2 * first_priced and lazy.num_steps == first_priced  # type: ignore[attr-defined]
    assert not lazy.priced_all  # type: ignore[attr-defined]
    whole_engine.advance_decode_run(whole.end_s)  # type: ignore[attr-defined]
    lazy_engine.advance_decode_run(whole.end_s)  # type: ignore[attr-defined]
    for attr in ("num_steps", "starts", "durations_s", "flops", "applied"):
        assert getattr(lazy, attr) == getattr(whole, attr), attr
    assert lazy.priced_all  # type: ignore[attr-defined]
    assert whole_engine.close_decode_run(whole.end_s).end_s == lazy_engine.close_decode_run(whole.end_s).end_s  # type: ignore[attr-defined]
    assert _state(lazy_engine) == _state(whole_engine)


def test_open_run_blocks_other_calls_and_no_run_without_pure_decodes() -> None:
    engine = create_engine(PERF)  # type: ignore[arg-type]
    engine.add_request(Request("a", 0.0, 100, 50), 0.0)
    assert engine.plan_decode_run(0.0) is None  # the prompt is still to prefill
    end = engine.step(0.0).end_s  # type: ignore[union-attr]
    run = engine.plan_decode_run(end, max_steps=10)
    assert run is not None and run.num_steps == 10
    for call in (lambda: engine.step(run.end_s), lambda: engine.add_request(Request("b", 0.0, 5, 5), end),
                 lambda: engine.abort("a", end)):
        with pytest.raises(ValueError, match="decode run is open"):
            call()
    assert engine.close_decode_run(end).num_steps == 1
    assert engine.num_running == 1 and engine.step(run.end_s) is not None


@pytest.mark.parametrize(("model", "gpu", "tp"), [("llama-3.1-8b", "h100", 1), ("llama-3.1-70b", "h100", 4),
                                                  ("DeepSeek-V3", "h100", 8), ("qwen3-30b-a3b", "h100", 1)])
def test_perf_decode_run_is_bit_identical_to_step_time(model: str, gpu: str, tp: int) -> None:
    pm = PerfModel.from_names(model, gpu, tp)
    for batch in (1, 3, 64, 256):
        for ctx0 in (batch, 4097, 123_457):
            times, flops = pm.decode_run(batch, ctx0, 50)
            shapes = [StepShape(decode_seqs=batch, decode_context_tokens=ctx0 + batch * j) for j in range(50)]
            assert times == [pm.step_time_s(s) for s in shapes]
            assert flops == [pm.step_flops(s) for s in shapes]

