"""RequestQueues: the one owner of the queues and the load counters routers read."""

from __future__ import annotations

import random

import pytest
from engine_factory import FakePerf, create_engine

from tokenomy.core import Request
from tokenomy.engine import Engine
from tokenomy.perf import PerfModel

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)


def _check(engine: Engine) -> None:
    engine._queues.check(engine._requests.values())


def _views(engine: Engine) -> tuple[int, int, int, int, int]:
    return (engine.num_running, engine.num_waiting, engine.num_decoding, engine.decode_context_tokens,
            engine.num_waiting_tokens)


@pytest.mark.parametrize(
    ("counter", "message"),
    [("pending_tokens", "pending_tokens is"), ("decode_context_tokens", "decode_context_tokens is"),
     ("num_decoding", "num_decoding is")],
)
def test_check_names_a_counter_that_drifted(counter: str, message: str) -> None:
    engine = create_engine()
    engine.add_request(Request("a", 0.0, 40, 10), 0.0)
    engine.add_request(Request("b", 0.0, 40, 10), 0.0)
    engine.step(0.0)
    engine.step(1.0)  # both decode now
    _check(engine)
    queues = engine._queues
    setattr(queues, counter, getattr(queues, counter) + 1)
    with pytest.raises(AssertionError, match=message):
        _check(engine)


def test_check_finds_a_request_missing_from_the_queues() -> None:
    engine = create_engine()
    engine.add_request(Request("a", 0.0, 40, 10), 0.0)
    engine._queues.waiting.clear()
    with pytest.raises(AssertionError, match="queued requests"):
        _check(engine)


def test_views_follow_admission_decoding_and_abort() -> None:
    engine = create_engine(FakePerf(), max_num_batched_tokens=64)
    engine.add_request(Request("a", 0.0, 40, 5), 0.0)
    engine.add_request(Request("b", 0.0, 100, 5), 0.0)
    assert _views(engine) == (0, 2, 0, 0, 140)
    engine.step(0.0)  # a whole (40), b's first 24 tokens
    assert _views(engine) == (2, 0, 1, 41, 76 + 64)  # the 64 tokens in flight count until the step ends
    engine.abort("b", 0.005)
    assert _views(engine) == (1, 0, 1, 41, 64)  # an abort does not stop the step being computed
    engine.end_step()
    assert _views(engine) == (1, 0, 1, 41, 0)
    engine.abort("a", 0.01)
    assert _views(engine) == (0, 0, 0, 0, 0)
    _check(engine)


@pytest.mark.parametrize("seed", range(6))
def test_invariants_hold_under_aborts_continuations_preemptions_and_decode_runs(seed: int) -> None:
    _random_run(seed)


def test_the_random_runs_do_preempt() -> None:
    assert sum(_random_run(seed) for seed in range(6)) > 0


def _random_run(seed: int) -> int:
    """Random arrivals (some continuations), aborts, steps and decode runs; checks after each; returns preemptions."""
    rng = random.Random(seed)
    engine = create_engine(PERF, num_gpu_blocks=rng.choice([30, 60, 400]), block_size_tokens=4,  # type: ignore[arg-type]
                           max_num_batched_tokens=rng.choice([64, 256]), max_num_seqs=rng.choice([4, 32]))
    now, added, preemptions, runs = 0.0, 0, 0, 0
    for _ in range(3000):
        if added < 60 and rng.random() < 0.3:
            prompt, out = rng.randint(1, 60), rng.randint(1, 40)
            req = Request(f"q{added}", now, prompt, out, content=((1, prompt // 2), (100 + added, prompt + out)))
            engine.add_request(req, now, continuation=rng.random() < 0.2)
            added += 1
        if engine._requests and rng.random() < 0.05:
            engine.abort(rng.choice(sorted(engine._requests)), now)
        _check(engine)
        run = engine.plan_decode_run(now) if rng.random() < 0.5 else None
        if run is not None:
            runs += 1
            engine.advance_decode_run(run.starts[min(2, run.num_steps)])
            now = engine.close_decode_run(run.starts[min(3, run.num_steps)]).end_s
            _check(engine)
            continue
        result = engine.step(now)
        _check(engine)
        if result is None:
            if added >= 60:
                break
            now += 0.01
            continue
        preemptions += len(result.preempted)
        now = result.end_s
    assert added == 60 and not engine.has_unfinished()
    assert engine.free_blocks == engine.total_blocks
    assert runs > 0
    return preemptions


def test_the_step_in_flight_counts_as_waiting_until_it_ends() -> None:
    """A step's effects are applied at its start; a router reading the engine mid-step must still
    see the chunk being computed, or an instance prefilling its last chunk looks idle."""
    engine = create_engine(max_num_batched_tokens=512)
    engine.add_request(Request("a", 0.0, 800, 4), 0.0)
    assert engine.num_waiting_tokens == 800
    first = engine.step(0.0)
    assert first is not None and first.shape.prefill_tokens == 512
    assert engine.num_waiting_tokens == 800  # 288 still waiting + 512 in flight
    engine.end_step()
    assert engine.num_waiting_tokens == 288
    last = engine.step(first.end_s)
    assert last is not None and last.shape.prefill_tokens == 288
    assert engine.num_waiting_tokens == 288  # the last chunk: nothing pending, but not idle
    assert engine.num_decoding == 1
    nxt = engine.step(last.end_s)  # the next step ends it too, if the driver did not
    assert nxt is not None and nxt.shape.prefill_tokens == 0
    assert engine.num_waiting_tokens == 0
